"""The refactor invariant: every cache x unmasking pair decodes exactly as recorded (golden.py)."""
from __future__ import annotations

import json

import pytest

from golden import GOLDEN, PROMPTS, record


@pytest.fixture(scope="module")
def recorded() -> dict:
    return record()


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_every_pair_decodes_as_recorded(recorded, prompt):
    golden = json.loads(GOLDEN.read_text())
    keys = [k for k in golden if k.startswith(f"{prompt}/")]
    assert len(keys) == 25
    for key in keys:
        want, got = golden[key], recorded[key]
        assert got["tokens"] == want["tokens"], key
        assert (got["nfe"], got["guider_forwards"]) == (want["nfe"], want["guider_forwards"]), key
        assert len(got["steps"]) == len(want["steps"]), key
        for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
            where = f"{key} step {i}"
            assert (g["g"], g["reads"], g["forwards"], g["full_refresh"]) == (w["g"], w["reads"], w["forwards"], w["full_refresh"]), where
            assert [c[:2] for c in g["committed"]] == [c[:2] for c in w["committed"]], where
            assert [c[2] for c in g["committed"]] == pytest.approx([c[2] for c in w["committed"]], abs=2e-4), where
