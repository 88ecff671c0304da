import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# "auto" means the CPU for every model the tests load, here and in the processes they start: the
# float32 tolerances and golden traces are CPU results. GPU-only tests ask for "cuda" themselves.
os.environ["DLLM_LOCAL_DEVICE"] = "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoints import build_dream, build_llada  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """The slowest tests at the end of every run (CI's included): CI has a time budget, and a
    test that grew is seen where it grew."""
    if not config.option.durations:
        config.option.durations = 25


@pytest.fixture(scope="session")
def llada_dir(tmp_path_factory) -> Path:
    return build_llada(tmp_path_factory.mktemp("llada"), n_layers=32)


@pytest.fixture(scope="session")
def dream_dir(tmp_path_factory) -> Path:
    return build_dream(tmp_path_factory.mktemp("dream"))


@pytest.fixture(scope="session")
def tiny():
    import dllm_local

    return dllm_local.load("tiny")


@pytest.fixture(scope="session")
def tiny_guider():
    import dllm_local

    return dllm_local.load_guider("tiny-guider")
