"""Sign-in for a page served beyond this machine: a users file, passwords hashed at rest.

The page binds 127.0.0.1 and asks no one to sign in. Served to a network (``--host 0.0.0.0``)
or through a public link (``--share``), it refuses to start without ``--users FILE``; with it,
every page and API call needs a signed-in user (Gradio's own sign-in, given ``ui.login``'s
``SignIn``). The file has one user a line, ``NAME ROLE pbkdf2_sha256$ITERATIONS$SALT$HASH``
(roles: student, lecturer), written by::

    python -m ui.signin add users.txt alice --role lecturer      # asks for the password twice
    python -m ui.signin add users.txt bob                        # a student

What it guarantees about the file:

- Every write leaves it owner-only (0600): a new file is written beside it at 0600 and renamed
  over it, whatever the old file's mode was.
- The page refuses to start from a file others may read or write, as ssh does with a key, and
  says the ``chmod`` that fixes it.
- Every line is checked when the page starts: a name as a whole string (no trailing newline),
  a role, 10,000 to 2,000,000 iterations, a 16-byte salt and a 32-byte hash, in lowercase hex;
  anything else is refused with its line number, so a login never meets a line it cannot check.

How a login is guarded (back-off, the same work for every name, the hash off the event loop) is
``ui.login``'s. Torch-free: the page process reads it.
"""
from __future__ import annotations

import argparse
import getpass
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from dllm_local.errors import DllmError
from dllm_local.files import read_text

ROLES = ("student", "lecturer")
ITERATIONS = 200_000  # pbkdf2-sha256: a guess costs about 0.1 s on a laptop core
MIN_ITERATIONS, MAX_ITERATIONS = 10_000, 2_000_000  # below: cheap to guess; above: a login costs seconds
MAX_USERS_BYTES = 1 * 2**20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")  # always fullmatch: match's $ lets "bob\n" through
_HEX = re.compile(r"[0-9a-f]+")  # lowercase: the hash is compared as text
SETUP = ("create a users file with `python -m ui.signin add users.txt NAME --role lecturer` (and one line per "
         "student), then start with --users users.txt")


@dataclass(frozen=True)
class User:
    name: str
    role: str
    digest: str  # pbkdf2_sha256$iterations$salt$hash


def _encoded(password: str) -> bytes:
    # surrogatepass: a password with a lone surrogate (from a non-UTF-8 terminal) is its own bytes,
    # never an error and never the same bytes as another password
    return password.encode("utf-8", "surrogatepass")


def hash_password(password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", _encoded(password), salt, iterations)
    return f"pbkdf2_sha256${iterations}${salt.hex()}${digest.hex()}"


def check_password(password: str, digest: str) -> bool:
    """Whether ``password`` is the one ``digest`` (a line's, checked by ``digest_problem``) was made from."""
    _, iterations, salt, expected = digest.split("$")
    got = hashlib.pbkdf2_hmac("sha256", _encoded(password), bytes.fromhex(salt), int(iterations))
    return hmac.compare_digest(got.hex(), expected)


def digest_problem(digest: str) -> str | None:
    """What is wrong with a users-file hash, or None: the scheme, its iterations, salt and hash."""
    parts = digest.split("$")
    if len(parts) != 4 or parts[0] != "pbkdf2_sha256":
        return "its hash is not pbkdf2_sha256$ITERATIONS$SALT$HASH"
    _, iterations, salt, expected = parts
    if not (iterations.isascii() and iterations.isdigit() and len(iterations) <= 8
            and MIN_ITERATIONS <= int(iterations) <= MAX_ITERATIONS):
        return f"its iterations must be a whole number in {MIN_ITERATIONS:,}..{MAX_ITERATIONS:,} (not {iterations[:20]!r})"
    if not (len(salt) == 32 and _HEX.fullmatch(salt)):
        return "its salt must be 32 lowercase hex digits (16 bytes)"
    if not (len(expected) == 64 and _HEX.fullmatch(expected)):
        return "its hash must be 64 lowercase hex digits (32 bytes)"
    return None


def read_users(path: str | Path) -> dict[str, User]:
    """The users of ``path`` by name; a file others may read or write, or a line that is not a
    user, is a DllmError naming it."""
    users: dict[str, User] = {}
    text = read_text(path, MAX_USERS_BYTES, f"the users file {path}")
    mode = stat.S_IMODE(Path(path).stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise DllmError(f"the users file {path} may be read or changed by others (mode {mode:04o}): make it its "
                        f"owner's only with `chmod 600 {path}`")
    for number, line in enumerate(text.split("\n"), 1):  # numbered as an editor numbers them
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(" ")
        if len(fields) != 3 or not NAME.fullmatch(fields[0]) or fields[1] not in ROLES:
            raise DllmError(f"the users file {path}, line {number}, is not NAME ROLE HASH (roles: {', '.join(ROLES)}): "
                            "write its users with `python -m ui.signin add`")
        if problem := digest_problem(fields[2]):
            raise DllmError(f"the users file {path}, line {number}: {problem}; write its users with "
                            "`python -m ui.signin add`")
        if fields[0] in users:
            raise DllmError(f"the users file {path} names {fields[0]} twice (line {number})")
        users[fields[0]] = User(*fields)
    if not users:
        raise DllmError(f"the users file {path} has no users: {SETUP}")
    return users


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a user's, or None."""
    if NAME.fullmatch(name):
        return None
    return f"a user name is letters, digits and _.@- (at most 64, a letter or digit first), not {name[:80]!r}"


def add_user(path: str | Path, name: str, password: str, role: str = "student", iterations: int = ITERATIONS) -> None:
    """``name`` added to ``path`` (or its password and role replaced); the file readable by its owner only."""
    if problem := name_problem(name):
        raise DllmError(problem)
    if role not in ROLES:
        raise DllmError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if len(password) < 8:
        raise DllmError("a password has at least 8 characters")
    path = Path(path)
    if not path.parent.is_dir():
        raise DllmError(f"the folder {path.parent} does not exist: create it, or give the users file another place")
    lines = read_text(path, MAX_USERS_BYTES, f"the users file {path}").split("\n") if path.exists() else []
    lines = [line for line in lines if line.strip() and line.strip().split(" ", 1)[0] != name]
    lines.append(f"{name} {role} {hash_password(password, iterations=iterations)}")
    # A new file at 0600 renamed over the old one: owner-only whatever the old one's mode was
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise DllmError(f"the users file {path} could not be written ({exc.strerror or exc})") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def sign_in_problem(host: str, share: bool, users: str | None) -> str | None:
    """Why the page may not start as asked, or None: beyond this machine it needs --users."""
    if users is None and (share or not is_loopback(host)):
        where = "a public link (--share)" if share else f"{host}, beyond this machine"
        return f"serving the page on {where} needs sign-in: {SETUP}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ui.signin", description="the page's users file")
    sub = ap.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="add a user (or set a user's password and role)")
    add.add_argument("file")
    add.add_argument("name")
    add.add_argument("--role", choices=ROLES, default="student")
    add.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    args = ap.parse_args(argv)
    if problem := name_problem(args.name):  # before the password is asked for
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("error: the two passwords differ", file=sys.stderr)
            return 2
    try:
        add_user(args.file, args.name, password, args.role)
    except DllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.name} ({args.role}) is in {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
