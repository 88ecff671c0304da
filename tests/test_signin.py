"""Sign-in: the page refuses to serve beyond this machine without a users file, before it opens a
socket; with one, a real server answers only signed-in users; the file keeps hashes, not passwords."""
from __future__ import annotations

import io
import os
import re
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_local.errors import DllmError
from ui.login import SignIn
from ui.signin import MIN_ITERATIONS, NAME, ROLES, add_user, check_password, hash_password, main, read_users

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
    add_user(path, "bob", "battery staple", iterations=MIN_ITERATIONS)
    add_user(path, "bob", "new password!", iterations=MIN_ITERATIONS)  # a user's password replaced, not a second line
    text = path.read_text()
    assert "correct horse" not in text and "staple" not in text and len(text.splitlines()) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = read_users(path)
    assert {name: u.role for name, u in users.items()} == {"alice": "lecturer", "bob": "student"}
    assert users["alice"].digest != read_users(path)["bob"].digest.replace("bob", "alice")
    assert users["alice"].digest.startswith("pbkdf2_sha256$200000$")  # add's own count
    sign_in = SignIn(users)
    assert sign_in.matches("alice", "correct horse") and sign_in.matches("bob", "new password!")
    assert not sign_in.matches("bob", "battery staple") and not sign_in.matches("alice", "Correct horse")
    assert not sign_in.matches("eve", "x")
    assert sign_in.role("alice") == "lecturer" and sign_in.role("eve") is None


def _line(name: str = "a", iterations: str = "10000", salt: str = "0" * 32, digest: str = "0" * 64) -> str:
    return f"{name} student pbkdf2_sha256${iterations}${salt}${digest}\n"


def _private(path: Path, content: str) -> Path:
    path.write_text(content)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("content, message", [
    (_line().replace("student", "admin"), "line 1, is not NAME ROLE HASH"),
    ("alice student hunter2\n", "line 1: its hash is not pbkdf2_sha256$"),
    ("# only a comment\n", "has no users"),
    (_line() + _line(), "names a twice (line 2)"),
    ("\n# two lines before\n" + _line(iterations="0"), "line 3: its iterations must be a whole number in 10,000..2,000,000 (not '0')"),
    (_line(iterations="9999999"), "line 1: its iterations must be"),
    (_line(iterations="\u0661" * 5), "line 1: its iterations must be"),  # Arabic-Indic digits: \d's, not ours
    (_line(salt="0" * 30), "line 1: its salt must be 32 lowercase hex digits"),
    (_line(digest="A" * 64), "line 1: its hash must be 64 lowercase hex digits"),
    (_line(name="-x"), "line 1, is not NAME ROLE HASH"),
], ids=["unknown role", "a plain password", "no users", "a name twice", "0 iterations", "too many iterations",
        "not ASCII digits", "a short salt", "an uppercase hash", "a name starting with -"])
def test_a_users_file_that_is_not_one_is_named_with_its_line(tmp_path, content, message):
    with pytest.raises(DllmError, match=re.escape(message)):
        read_users(_private(tmp_path / "users.txt", content))


def test_a_users_file_others_may_read_is_refused_at_start_with_the_chmod_that_fixes_it(tmp_path):
    users = _private(tmp_path / "users.txt", f"lee lecturer {hash_password('lee-password', iterations=MIN_ITERATIONS)}\n")
    users.chmod(0o644)
    done = subprocess.run([sys.executable, str(ROOT / "app.py"), "--port", str(_free_port()), "--users", str(users)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"may be read or changed by others (mode 0644): make it its owner's only with `chmod 600 {users}`" in done.stderr
    users.chmod(0o620)  # writable by the group: someone could add a lecturer
    with pytest.raises(DllmError, match="mode 0620"):
        read_users(users)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _add(argv: list[str], password: str, monkeypatch) -> int:
    monkeypatch.setattr(sys, "stdin", io.StringIO(password + "\n"))
    return main(["add", *argv, "--password-stdin"])


def test_add_leaves_the_file_owner_only_refuses_a_name_with_a_newline_and_names_a_missing_folder(
        tmp_path, monkeypatch, capsys):
    users = _private(tmp_path / "users.txt", "")
    users.chmod(0o644)  # as an editor or a copy may leave it
    assert _add([str(users), "alice"], "alice-password", monkeypatch) == 0
    assert stat.S_IMODE(users.stat().st_mode) == 0o600 and list(read_users(users)) == ["alice"]
    assert [p.name for p in tmp_path.iterdir()] == ["users.txt"]  # no temporary file left behind
    assert _add([str(users), "bob\n"], "bob-password", monkeypatch) == 2
    assert "a user name is letters, digits and _.@-" in capsys.readouterr().err and list(read_users(users)) == ["alice"]
    missing = tmp_path / "no-such-folder" / "users.txt"
    assert _add([str(missing), "carol"], "carol-password", monkeypatch) == 2
    err = capsys.readouterr().err
    assert f"error: the folder {missing.parent} does not exist" in err and "Traceback" not in err


def test_the_add_command_takes_the_password_from_stdin(tmp_path):
    path = tmp_path / "users.txt"
    done = subprocess.run([sys.executable, "-m", "ui.signin", "add", str(path), "carol", "--role", "lecturer",
                           "--password-stdin"], input="s3cret-pass\n", cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "carol (lecturer) is in" in done.stdout
    assert SignIn(read_users(path)).matches("carol", "s3cret-pass")
    short = subprocess.run([sys.executable, "-m", "ui.signin", "add", str(path), "dan", "--password-stdin"],
                           input="short\n", cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert short.returncode == 2 and "at least 8 characters" in short.stderr


def test_a_page_with_sign_in_answers_only_signed_in_users(tmp_path):
    from gradio_client import Client

    users = tmp_path / "users.txt"
    for name in ("student1", "student2"):
        add_user(users, name, f"{name}-pass", iterations=MIN_ITERATIONS)
    port = _free_port()
    page = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--users", str(users)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 300
        while "serving on" not in (line := page.stdout.readline()):
            assert line and time.monotonic() < deadline, "the page did not start"
        url = f"http://127.0.0.1:{port}/"
        for auth in (None, ("student1", "wrong-pass"), ("nobody", "student1-pass")):
            with pytest.raises(Exception):  # Gradio's own refusal: the page's config is not served
                Client(url, auth=auth, verbose=False)
        job = Client(url, auth=("student1", "student1-pass"), verbose=False).submit("What is 12 + 7?", api_name="/run")
        assert any(isinstance(o, str) and "**Answer:**" in o for o in [output for output in job][-1])
        # app.py hands Gradio the guarded check: a sixth try at a name waits, the right password included
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.9")) as guesser:
            answers = [guesser.post(f"{url}login", data={"username": "student2", "password": password}).status_code
                       for password in ["wrong-pass"] * 5 + ["student2-pass"]]
        assert answers == [400] * 5 + [429]
    finally:
        page.terminate()
        page.wait(timeout=60)


_KNOWN = {password: hash_password(password, iterations=MIN_ITERATIONS) for password in ("first-password", "2nd-password")}


@st.composite
def users_files(draw) -> bytes:
    """Lines of users written from known passwords, some with a few characters changed, and any text."""
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        line = f"{draw(st.from_regex(NAME, fullmatch=True))} {draw(st.sampled_from(ROLES))} " \
               f"{_KNOWN[draw(st.sampled_from(sorted(_KNOWN)))]}"
        kind = draw(st.sampled_from(["user", "changed", "text"]))
        if kind == "changed":
            at = draw(st.integers(0, len(line)))
            line = line[:at] + draw(st.text(max_size=3)) + line[at + draw(st.integers(0, 3)):]
        lines.append(draw(st.text(max_size=80)) if kind == "text" else line)
    return "\n".join(lines).encode()


@settings(max_examples=40, deadline=None)
@given(content=st.one_of(users_files(), st.binary(max_size=200)))
def test_a_users_file_gives_users_that_can_sign_in_or_a_refusal_naming_its_line(content):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "users.txt"
        path.write_bytes(content)
        path.chmod(0o600)
        try:
            users = read_users(path)
        except DllmError as exc:
            assert re.search(r"line \d+|\(byte \d+\)|has no users", str(exc)), exc
            return
    for name, user in users.items():
        assert NAME.fullmatch(name) and user.role in ROLES
        for password, digest in _KNOWN.items():  # every user's hash can be checked, and a known one signs in
            assert check_password(password, user.digest) is (user.digest == digest)


@settings(max_examples=25, deadline=None)
@given(name=st.one_of(st.from_regex(NAME, fullmatch=True), st.text(max_size=70)), role=st.sampled_from(ROLES),
       password=st.text(st.characters(exclude_categories=()), max_size=20))  # lone surrogates included
def test_add_then_read_gives_back_every_name_add_accepts(name, role, password):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "users.txt"
        add_user(path, "first", "first-password", iterations=MIN_ITERATIONS)
        try:
            add_user(path, name, password, role, iterations=MIN_ITERATIONS)
        except DllmError:
            assert not NAME.fullmatch(name) or len(password) < 8
            return
        users = read_users(path)
        assert users[name].role == role and SignIn(users).matches(name, password)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(users) == 1 + (name != "first")
