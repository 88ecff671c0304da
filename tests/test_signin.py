"""Sign-in: the page refuses to serve beyond this machine without a users file, before it opens a
socket; with one, a real server answers only signed-in users; the file keeps hashes, not passwords."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dllm_local.errors import DllmError
from ui.signin import SignIn, add_user, read_users

ROOT = Path(__file__).resolve().parents[1]
SOCKETS = textwrap.dedent('''
    import os, sys

    def _hook(event, args):
        if event in ("socket.bind", "socket.connect", "socket.getaddrinfo"):
            with open(os.environ["AUDIT_LOG"], "a") as f:
                f.write(f"{event} {args[1] if event != 'socket.getaddrinfo' else args[0]!r}\\n")

    sys.addaudithook(_hook)
''')


@pytest.mark.parametrize("argv, where", [
    (["--host", "0.0.0.0"], "0.0.0.0, beyond this machine"),
    (["--host", "192.0.2.10", "--port", "7999"], "192.0.2.10, beyond this machine"),
    (["--share"], "a public link (--share)"),
], ids=["all interfaces", "one address", "a share link"])
def test_serving_beyond_this_machine_without_sign_in_is_refused_before_any_socket(tmp_path, argv, where):
    (tmp_path / "sitecustomize.py").write_text(SOCKETS)
    log = tmp_path / "sockets.log"
    done = subprocess.run([sys.executable, str(ROOT / "app.py"), *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
                                            "AUDIT_LOG": str(log)})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"error: serving the page on {where} needs sign-in: create a users file with `python -m ui.signin add" \
           in done.stderr
    assert not log.exists(), log.read_text()  # no socket bound, connected or looked up


def test_the_users_file_keeps_salted_hashes_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "users.txt"
    add_user(path, "alice", "correct horse", "lecturer")
    add_user(path, "bob", "battery staple")
    add_user(path, "bob", "new password!")  # a user's password replaced, not a second line
    text = path.read_text()
    assert "correct horse" not in text and "staple" not in text and len(text.splitlines()) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = read_users(path)
    assert {name: u.role for name, u in users.items()} == {"alice": "lecturer", "bob": "student"}
    assert users["alice"].digest != read_users(path)["bob"].digest.replace("bob", "alice")
    sign_in = SignIn(users)
    assert sign_in("alice", "correct horse") and sign_in("bob", "new password!")
    assert not sign_in("bob", "battery staple") and not sign_in("alice", "Correct horse") and not sign_in("eve", "x")
    assert sign_in.role("alice") == "lecturer" and sign_in.role("eve") is None


@pytest.mark.parametrize("content, message", [
    ("alice admin pbkdf2_sha256$1$" + "0" * 32 + "$" + "0" * 64 + "\n", "line 1, is not NAME ROLE HASH"),
    ("alice student hunter2\n", "line 1, is not NAME ROLE HASH"),
    ("# only a comment\n", "has no users"),
    ("a student pbkdf2_sha256$1$" + "0" * 32 + "$" + "0" * 64 + "\n" + "a student pbkdf2_sha256$1$" + "0" * 32
     + "$" + "0" * 64 + "\n", "names a twice (line 2)"),
], ids=["unknown role", "a plain password", "no users", "a name twice"])
def test_a_users_file_that_is_not_one_is_named_with_its_line(tmp_path, content, message):
    path = tmp_path / "users.txt"
    path.write_text(content)
    with pytest.raises(DllmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_users(path)


def test_the_add_command_takes_the_password_from_stdin(tmp_path):
    path = tmp_path / "users.txt"
    done = subprocess.run([sys.executable, "-m", "ui.signin", "add", str(path), "carol", "--role", "lecturer",
                           "--password-stdin"], input="s3cret-pass\n", cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "carol (lecturer) is in" in done.stdout
    assert SignIn(read_users(path))("carol", "s3cret-pass")
    short = subprocess.run([sys.executable, "-m", "ui.signin", "add", str(path), "dan", "--password-stdin"],
                           input="short\n", cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert short.returncode == 2 and "at least 8 characters" in short.stderr


def test_a_page_with_sign_in_answers_only_signed_in_users(tmp_path):
    from gradio_client import Client

    users = tmp_path / "users.txt"
    add_user(users, "student1", "student-pass")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    page = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--users", str(users)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 300
        while "serving on" not in (line := page.stdout.readline()):
            assert line and time.monotonic() < deadline, "the page did not start"
        url = f"http://127.0.0.1:{port}/"
        for auth in (None, ("student1", "wrong-pass"), ("nobody", "student-pass")):
            with pytest.raises(Exception):  # Gradio's own refusal: the page's config is not served
                Client(url, auth=auth, verbose=False)
        job = Client(url, auth=("student1", "student-pass"), verbose=False).submit("What is 12 + 7?", api_name="/run")
        assert any(isinstance(o, str) and "**Answer:**" in o for o in [output for output in job][-1])
    finally:
        page.terminate()
        page.wait(timeout=60)
