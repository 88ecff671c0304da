"""No outbound traffic unless a download was asked for. Importing ``dllm_local`` sets, for this
process and every process it starts (the engine, a download, a Ray instance and its workers), the
switches that the hub, datasets, Gradio and Ray read when they are imported: the hub and datasets
offline, Gradio's analytics and version check off, Ray's usage statistics (and with them its
cloud-metadata look-ups) off. A switch the user set already is kept. ``allow_downloads`` (the
``--allow-downloads`` flag) turns the hub back on, before the hub is imported."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

QUIET = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_DISABLE_TELEMETRY": "1", "RAY_USAGE_STATS_ENABLED": "0"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def stay_offline() -> None:
    for name, value in {**QUIET, **OFFLINE}.items():
        os.environ.setdefault(name, value)


def allow_downloads() -> None:
    """The hub and datasets online for this process and its children (telemetry stays off)."""
    os.environ.update({name: "0" for name in OFFLINE})


# Ray's dashboard process asks cloud metadata servers (169.254.169.254, metadata.google.internal)
# what machine it runs on, whatever its settings (ray 2.60: usage_lib.get_cluster_config_to_report
# runs with usage statistics off and the dashboard off). It asks through `requests`, which takes
# its proxy from the environment: a closed loopback port refuses it at once, and nothing leaves.
_CLOSED_PROXY = "http://127.0.0.1:9"
_NO_PROXY = "localhost,127.0.0.1,::1"


@contextmanager
def children_offline() -> Iterator[None]:
    """While the processes a library starts are spawned (a local Ray instance), their HTTP goes
    to a closed loopback proxy, unless downloads are allowed; this process's own is as it was."""
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        yield
        return
    names = {f"{scheme}_proxy": _CLOSED_PROXY for scheme in ("http", "https")} | {"no_proxy": _NO_PROXY}
    names |= {name.upper(): value for name, value in names.items()}
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
