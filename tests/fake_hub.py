"""A Hugging Face hub on 127.0.0.1, serving model folders the tests build: the hub itself is out
of reach in tests, and this speaks the part of its HTTP protocol that ``huggingface_hub`` uses to
list, size and download a repository (the repository info, the file tree, and ``resolve`` with
HEAD and byte ranges). The real client downloads from it through ``HF_ENDPOINT``."""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 64 * 2**10


class FakeHub:
    """Repositories by id (``org/name`` -> folder). ``bytes_per_second`` (each connection; None:
    as fast as it goes) slows file bodies so that a download can be watched and cancelled;
    ``served`` counts the bytes sent."""

    def __init__(self, repos: dict[str, Path], bytes_per_second: float | None = None) -> None:
        self.repos = {repo: Path(folder) for repo, folder in repos.items()}
        self.bytes_per_second = bytes_per_second
        self.served = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo: str) -> dict[str, Path]:
        folder = self.repos[repo]
        return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _json(self, data) -> None:
                payload = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _serve(self, body: bool) -> None:
                path = self.path.split("?")[0]
                api = re.match(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/[^/]+)?/?$", path)
                resolve = re.match(r"^/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", path)
                repo = (api or resolve).group(1) if (api or resolve) else None
                if repo not in hub.repos:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self.end_headers()
                    return
                files = hub.files(repo)
                if api and api.group(2) == "tree":
                    return self._json([{"type": "file", "path": name, "size": f.stat().st_size,
                                        "oid": hashlib.sha1(name.encode()).hexdigest()} for name, f in files.items()])
                if api:
                    return self._json({"id": repo, "sha": COMMIT, "private": False,
                                       "siblings": [{"rfilename": name, "size": f.stat().st_size} for name, f in files.items()]})
                name = resolve.group(2)
                if name not in files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.end_headers()
                    return
                data = files[name].read_bytes()
                start = 0
                ranged = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if ranged:
                    start = int(ranged.group(1))
                self.send_response(206 if ranged else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not body:
                    return
                try:
                    for at in range(start, len(data), CHUNK):
                        self.wfile.write(data[at:at + CHUNK])
                        hub.served += len(data[at:at + CHUNK])
                        if hub.bytes_per_second:
                            time.sleep(CHUNK / hub.bytes_per_second)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (a cancelled download)

        return Handler
