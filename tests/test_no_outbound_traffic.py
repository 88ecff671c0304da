"""Nothing but this machine is contacted unless a download was asked for: the CLI, the page (its
engine process included) and a sweep on a local Ray instance (its dashboard, agents and workers
included) run under an audit hook (``sys.addaudithook`` on ``socket.connect`` and
``socket.getaddrinfo``, installed in every Python process they start through ``sitecustomize``)
with none of the offline switches set in their environment: the project sets them itself."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
            "GRADIO_ANALYTICS_ENABLED", "RAY_USAGE_STATS_ENABLED", "http_proxy", "https_proxy", "no_proxy",
            "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")

HOOK = textwrap.dedent('''
    import ipaddress, os, sys

    def _here(host):
        if isinstance(host, bytes):
            host = host.decode()
        if not host or host == "localhost" or host.startswith("/") or host in os.environ["AUDIT_HERE"].split(","):
            return True
        try:
            return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
        except ValueError:
            return False

    def _hook(event, args):
        if event == "socket.connect" and isinstance(args[1], tuple):
            host = args[1][0]
        elif event == "socket.getaddrinfo":
            host = args[0]
        else:
            return
        if not _here(host):
            with open(os.environ["AUDIT_LOG"], "a") as f:
                f.write(f"{event} {host!r} from {sys.argv[0]}\\n")

    if os.environ.get("AUDIT_LOG"):
        sys.addaudithook(_hook)
''')


@pytest.fixture
def audited(tmp_path) -> tuple[dict, Path]:
    """An environment whose Python processes log every non-local address they look up or connect
    to; "local": loopback and this machine's own names and interfaces' addresses (Ray's head
    listens on the machine's address)."""
    import psutil  # accelerate's requirement

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    here = {socket.gethostname(), socket.getfqdn()}
    here |= {a.address.split("%")[0] for addresses in psutil.net_if_addrs().values() for a in addresses
             if a.family in (socket.AF_INET, socket.AF_INET6)}
    log = tmp_path / "contacts.log"
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env |= {"PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "AUDIT_LOG": str(log), "AUDIT_HERE": ",".join(sorted(here))}
    return env, log


def _contacts(log: Path) -> list[str]:
    return sorted(set(log.read_text().splitlines())) if log.exists() else []


def test_the_audit_hook_sees_an_outbound_lookup(audited, tmp_path):
    """The hook is live in a child process: a look-up of a name outside is logged (it need not succeed)."""
    env, log = audited
    subprocess.run([sys.executable, "-c", "import socket\ntry: socket.getaddrinfo('example.invalid', 80)\n"
                    "except OSError: pass"], env=env, cwd=tmp_path, timeout=60)
    assert _contacts(log) == ["socket.getaddrinfo 'example.invalid' from -c"]


@pytest.mark.parametrize("argv", [
    ["generate", "--prompt", "What is 12 + 7?", "--gen-length", "16", "--block-size", "16"],
    ["sweep", "--ray", "local", "--n", "1", "--gen-length", "8", "--block-size", "8", "--block-sizes", "8",
     "--thresholds", "0.9", "--quiet"],
], ids=["generate", "sweep on a local Ray instance"])
def test_the_cli_contacts_nothing_but_this_machine(audited, tmp_path, argv):
    env, log = audited
    done = subprocess.run([sys.executable, "-m", "dllm_local", *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _contacts(log) == []


def test_the_page_and_its_engine_contact_nothing_but_this_machine(audited, tmp_path):
    from gradio_client import Client

    env, log = audited
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    page = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while "serving on" not in (line := page.stdout.readline()):
            assert line and time.monotonic() < deadline, "the page did not start"
        job = Client(f"http://127.0.0.1:{port}/", verbose=False).submit("What is 12 + 7?", api_name="/run")
        final = [output for output in job][-1]
        assert any(isinstance(o, str) and "**Answer:**" in o for o in final)  # the run ended with its answer
    finally:
        page.terminate()
        page.wait(timeout=60)
    assert _contacts(log) == []
