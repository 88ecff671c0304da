"""The refactor invariant: every registered cache x unmasking pair decodes exactly as recorded (golden.py)."""
from __future__ import annotations

import json

import pytest

from golden import GOLDEN, PROMPTS, pairs, record


@pytest.fixture(scope="module")
def recorded() -> dict:
    return record()


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_every_pair_decodes_as_recorded(recorded, prompt):
    golden = json.loads(GOLDEN.read_text())
    keys = [k for k in golden if k.startswith(f"{prompt}/")]
    assert sorted(keys) == sorted(f"{prompt}/{c}/{u}" for c, u in pairs())  # every registered pair
    for key in keys:
        want, got = golden[key], recorded[key]
        assert got["tokens"] == want["tokens"], key
        assert (got["nfe"], got["guider_forwards"]) == (want["nfe"], want["guider_forwards"]), key
        assert len(got["steps"]) == len(want["steps"]), key
        assert len(got["steps"]) <= 64 + 4, key  # the hard bound: gen_length + blocks main forwards
        for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
            where = f"{key} step {i}"
            assert (g["g"], g["reads"], g["forwards"], g["full_refresh"]) == (w["g"], w["reads"], w["forwards"], w["full_refresh"]), where
            # By position: the order within a step is the policy's ranking, where ties (confidence
            # 1.0 in float64) may fall either way.
            got_c, want_c = sorted(g["committed"]), sorted(w["committed"])
            assert [c[:2] for c in got_c] == [c[:2] for c in want_c], where
            assert [c[2] for c in got_c] == pytest.approx([c[2] for c in want_c], abs=2e-4), where
            assert sorted(g["revoked"]) == sorted(w["revoked"]), where
