"""Every file a user names (a trace to import, a results file to resume, an evaluation set, a
preset, a report to add; a model folder's files, ``regular`` and ``read_json``) read one way: a regular file only (a device or a FIFO would never end,
or block), at most a stated number of bytes, UTF-8 text, and JSON no deeper than ``MAX_DEPTH``
with only valid Unicode in it (keys included). A refusal is a ``FileRefused`` naming the file
(or the caller's own error class: an imported trace's is a TraceError)."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from .errors import DllmError

MAX_DEPTH = 64  # nesting of a JSON value: a trace is about 6 deep; Python's parser gives up near 1,000


class FileRefused(DllmError, ValueError):
    """A user-named file that is not one to read: missing, not a regular file, too big, not text or not JSON."""


def read_bytes(path: str | Path, max_bytes: int, what: str = "", error: type[DllmError] = FileRefused) -> bytes:
    """The bytes of ``path``, once it is known to be a regular file of at most ``max_bytes``; a
    refusal names it as ``what`` (e.g. "trace file x.json"; by default the file's name)."""
    path = Path(path)
    what = what or path.name
    try:
        info = regular(path, what, error)
        if info.st_size > max_bytes:
            raise error(f"{what} is {_size(info.st_size)}; the limit is {_size(max_bytes)}")
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)  # the size as read too: a file that grew, or /proc's that say 0
    except OSError as exc:
        raise error(f"{what} could not be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise error(f"{what} is over {_size(max_bytes)}, its limit")
    return data


def regular(path: str | Path, what: str = "", error: type[DllmError] = FileRefused) -> os.stat_result:
    """``path``'s status (links followed) once it is known to be a regular file: opening a FIFO
    blocks until a writer comes, reading a device never ends. Every file read from a user's folder
    is checked here first; ``what`` names it in the refusal (by default the file's name)."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise error(f"{what or path.name} could not be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what or path.name} is {_kind(info.st_mode)}, not a file")
    return info


def read_text(path: str | Path, max_bytes: int, what: str = "", error: type[DllmError] = FileRefused) -> str:
    """``read_bytes``, as UTF-8 text."""
    what = what or Path(path).name
    data = read_bytes(path, max_bytes, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | Path, max_bytes: int, what: str = "", error: type[DllmError] = FileRefused) -> Any:
    """The JSON value in ``path``, read with ``read_text``'s bounds and checked by ``parse_json``."""
    what = what or Path(path).name
    return parse_json(read_text(path, max_bytes, what, error), what, error)


def parse_json(text: str | bytes, what: str = "the text", error: type[DllmError] = FileRefused) -> Any:
    """``text`` as JSON, at most ``MAX_DEPTH`` deep, its strings and keys valid Unicode."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{what} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise error(f"{what} is not valid JSON ({str(exc)[:120]})") from None
    _check(value, what, error)
    return value


def _check(value: Any, what: str, error: type[DllmError]) -> None:
    """Depth and Unicode, walked without recursion (the value may be as deep as the parser allowed)."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, (dict, list)) and depth > MAX_DEPTH:
            raise error(f"{what} nests deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            pending.extend((key, depth) for key in node)
            pending.extend((item, depth + 1) for item in node.values())
        elif isinstance(node, list):
            pending.extend((item, depth + 1) for item in node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise error(f"{what} holds text that is not valid Unicode (a lone surrogate, "
                                  f"{json.dumps(node[:20])})") from None


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a pipe (FIFO)", stat.S_ISCHR: "a device",
             stat.S_ISBLK: "a device", stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MB" if count >= 2**20 else f"{count / 2**10:.1f} kB"
