"""``--ray``'s address: checked as text when the command line is read (local, auto or
[ray://]HOST:PORT), then, before Ray is asked to join it, checked to answer as Ray's head does, in
seconds: Ray itself retries for a minute whatever is there. Torch- and Ray-free: the page and the
CLI read it before anything loads."""
from __future__ import annotations

import argparse
import re
import socket

from ..errors import DllmError, shown

ADDRESS_HELP = ("--ray takes local (a Ray instance of this run's own), auto (the cluster this machine has joined) "
                "or the head node's address, HOST:PORT or ray://HOST:PORT")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?)$")
# An HTTP/2 client's opening and an empty SETTINGS frame: Ray's head (gRPC) answers with its own SETTINGS.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
ANSWER_S = 3.0  # how long a head has to answer before it is called silent


class AddressError(DllmError, argparse.ArgumentTypeError):
    """A --ray value that is no address: the command line's own error, told before anything loads."""


def ray_address(text: str) -> str:
    """``--ray``'s value checked as text (an argparse type): local, auto, or [ray://]HOST:PORT with
    a port in 1..65535."""
    if text in ("local", "auto"):
        return text
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    if not sep or not _HOST.match(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise AddressError(f"{ADDRESS_HELP} (a port is 1..65535); {shown(text)} is none of these")
    return text


def reach_head(address: str) -> None:
    """Something answers at HOST:PORT, and answers as Ray's head does (gRPC), before Ray is asked
    to join it: Ray itself retries for a minute, whatever is there."""
    host, _, port = ray_address(address).removeprefix("ray://").rpartition(":")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
    except OSError as exc:  # refused, no route, a name that does not resolve, or no answer in 5 s
        raise DllmError(f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}): start one with "
                        "`ray start --head` on the head node and give the address it prints, and check that its "
                        "port is open from this machine") from None
    with conn:
        conn.settimeout(ANSWER_S)
        try:
            conn.sendall(_H2_HELLO)
            answer = conn.recv(64)
        except TimeoutError:
            answer = None
        except OSError:  # reset: as good as closed
            answer = b""
    if answer is not None and len(answer) >= 9 and answer[3] == 4:  # frame type 4: SETTINGS
        return
    if answer is None:
        found = f"it accepted the connection and said nothing for {ANSWER_S:g} s"
    else:
        first_line = (answer.decode("latin-1").strip().splitlines() or [""])[0]
        found = f"it answered {shown(first_line)}" if answer else "it closed the connection"
    raise DllmError(f"the server at {address} is not a Ray head ({found}): give the address `ray start --head` "
                    "printed (its GCS port, 6379 by default; ray://HOST:10001 for Ray Client)")
