"""Sign-in for a page served beyond this machine: a users file, passwords hashed at rest.

The page binds 127.0.0.1 and asks no one to sign in. Served to a network (``--host 0.0.0.0``)
or through a public link (``--share``), it refuses to start without ``--users FILE``; with it,
every page and API call needs a signed-in user (Gradio's own sign-in, ``launch(auth=...)``).
The file has one user a line, ``NAME ROLE pbkdf2_sha256$ITERATIONS$SALT$HASH`` (roles: student,
lecturer), written by::

    python -m ui.signin add users.txt alice --role lecturer      # asks for the password twice
    python -m ui.signin add users.txt bob                        # a student

Torch-free: the page process reads it.
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
import sys
from dataclasses import dataclass
from pathlib import Path

from dllm_local.errors import DllmError
from dllm_local.files import read_text

ROLES = ("student", "lecturer")
ITERATIONS = 200_000  # pbkdf2-sha256: a guess costs about 0.1 s on a laptop core
MAX_USERS_BYTES = 1 * 2**20
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_LINE = re.compile(r"^(?P<name>\S+) (?P<role>\S+) pbkdf2_sha256\$(?P<iterations>\d{1,7})\$(?P<salt>[0-9a-f]{32})"
                   r"\$(?P<hash>[0-9a-f]{64})$")
SETUP = ("create a users file with `python -m ui.signin add users.txt NAME --role lecturer` (and one line per "
         "student), then start with --users users.txt")


@dataclass(frozen=True)
class User:
    name: str
    role: str
    digest: str  # pbkdf2_sha256$iterations$salt$hash


def hash_password(password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"pbkdf2_sha256${iterations}${salt.hex()}${digest.hex()}"


def check_password(password: str, digest: str) -> bool:
    _, iterations, salt, expected = digest.split("$")
    got = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "replace"), bytes.fromhex(salt), int(iterations))
    return hmac.compare_digest(got.hex(), expected)


def read_users(path: str | Path) -> dict[str, User]:
    """The users of ``path`` by name; a line that is not a user is a DllmError naming it."""
    users: dict[str, User] = {}
    for number, line in enumerate(read_text(path, MAX_USERS_BYTES, f"the users file {path}").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        found = _LINE.match(line.strip())
        if not found or not NAME.match(found["name"]) or found["role"] not in ROLES:
            raise DllmError(f"the users file {path}, line {number}, is not NAME ROLE HASH (roles: {', '.join(ROLES)}): "
                            "write its users with `python -m ui.signin add`")
        if found["name"] in users:
            raise DllmError(f"the users file {path} names {found['name']} twice (line {number})")
        users[found["name"]] = User(found["name"], found["role"], line.strip().split(" ", 2)[2])
    if not users:
        raise DllmError(f"the users file {path} has no users: {SETUP}")
    return users


def add_user(path: str | Path, name: str, password: str, role: str = "student") -> None:
    """``name`` added to ``path`` (or its password and role replaced); the file readable by its owner only."""
    if not NAME.match(name):
        raise DllmError(f"a user name is letters, digits and _.@- (at most 64), not {name!r}")
    if role not in ROLES:
        raise DllmError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if len(password) < 8:
        raise DllmError("a password has at least 8 characters")
    path = Path(path)
    lines = read_text(path, MAX_USERS_BYTES, f"the users file {path}").splitlines() if path.exists() else []
    lines = [line for line in lines if line.split(" ", 1)[0] != name] + [f"{name} {role} {hash_password(password)}"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


class SignIn:
    """Gradio's ``auth``: a user of the file with the right password."""

    def __init__(self, users: dict[str, User]) -> None:
        self.users = users

    def __call__(self, name: str, password: str) -> bool:
        user = self.users.get(name)
        return user is not None and check_password(password, user.digest)

    def role(self, name: str | None) -> str | None:
        user = self.users.get(name or "")
        return user.role if user else None


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
