"""Where the page's export files go: one folder per page run, bounded, deleted at exit."""
from __future__ import annotations

import atexit
import itertools
import json
import shutil
import tempfile
import threading
from pathlib import Path

EXPORTS_KEPT = 20  # export files kept on disk while the page runs (older ones are deleted)


class ExportFolder:
    """One folder for the export files of one app run: created at once, keeping the newest
    ``keep`` files, deleted at exit (``atexit``, which a Ctrl-C also reaches) or by ``cleanup``."""

    def __init__(self, keep: int = EXPORTS_KEPT, prefix: str = "dllm-local-") -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self.keep = keep
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        atexit.register(self.cleanup)

    def write(self, trace: dict) -> str:
        """The trace as a new JSON file here (the older ones beyond ``keep`` are deleted)."""
        with self._lock:
            self.path.mkdir(parents=True, exist_ok=True)
            path = self.path / f"dllm-trace-{next(self._numbers):04d}.json"
            path.write_text(json.dumps(trace))
            files = sorted(self.path.glob("dllm-trace-*.json"), key=lambda f: f.name)
            for old in files[:-self.keep]:
                old.unlink(missing_ok=True)
        return str(path)

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
