"""What several commands share: counts as flags, the model they load and its guider, the --out report."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import DllmError

MODEL_HELP = "hub id, local folder, or a short name (default: tiny)"
BATCH_HELP = ("problems decoded together, each with its own seed, continuously (a finished problem's slot goes to "
              "the next at once): the same answers as one at a time, in less wall time (default: 1)")


def load_model(args: argparse.Namespace, quiet: bool = False, batched: bool = False):
    """--model on --device, with --quantize and --threads (``batched``: the threads a batch wants)."""
    from ..models.loading.loader import apply_threads, load

    if quiet:  # transformers' own bar (loading weights) goes quiet too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    handle = load(args.model, device=args.device, quantization=args.quantize)
    apply_threads(args.threads, handle, batched=batched)
    return handle


def guider_for(args: argparse.Namespace, handle, settings=None, needed: bool | None = None):
    """The guider model when the settings' unmasking policy (or ``needed``) asks for one."""
    if not (needed if needed is not None else settings.unmask_spec.needs_guider):
        return None
    from ..models.loading.loader import load_guider

    return load_guider(args.guider or "tiny-guider", device=handle.device)


def warn_past_trained_length(settings, handle) -> None:
    from ..settings import length_notice

    notice = length_notice(settings.gen_length, handle.trained_length)
    if notice:
        print(f"notice: {notice}", file=sys.stderr)


def check_out(out: str | None) -> None:
    """--out is written after the whole run: a path that cannot take the report is told before it."""
    import os
    from pathlib import Path

    if not out:
        return
    path = Path(out)
    if path.is_dir():
        raise DllmError(f"--out {out} is a folder: name a file in it, such as {path / 'report.json'}")
    if not path.parent.is_dir():
        raise DllmError(f"--out {out}: the folder {path.parent} does not exist")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise DllmError(f"--out {out}: {'the file' if path.exists() else 'its folder'} is not writable")


def write_out(out: str | None, report: dict, command: str, note: str = "") -> None:
    """The report to --out; if that write fails after all, to a file in the temporary folder, named
    in the error, so a finished run is never lost."""
    import os
    import tempfile
    import time
    from pathlib import Path

    if not out:
        return
    text = json.dumps(report, indent=2)
    try:
        Path(out).write_text(text)
        print(f"wrote {out}{note}")
        return
    except OSError as exc:
        failure = exc.strerror or str(exc)
    fallback = Path(tempfile.gettempdir()) / f"dllm-{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    try:
        fallback.write_text(text)
    except OSError as exc:  # the report is still printed above; say where nothing could be written
        raise DllmError(f"could not write --out {out} ({failure}), nor {fallback} ({exc.strerror or exc})") from None
    raise DllmError(f"could not write --out {out} ({failure}); the report is in {fallback}")
