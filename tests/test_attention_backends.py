"""The attention backends (issue 58, item 7): FlexAttention, the forward's rule as a ``mask_mod``,
attends as SDPA over its dense mask does, in float32 on the CPU: every kind of forward (plain,
cached, a fork's variant rows, a read of the cache with its own visible rows, packed requests under
one layout or one each), every cache policy's tokens, a batch's, a block-causal family's (SDAR) and
one with grouped K/V heads whose head reads shifted positions (Dream). And the seam's settings: the
settings' choices are the registered backends, a name not registered is refused."""
from __future__ import annotations

from types import SimpleNamespace
from typing import get_args

import pytest
import torch

import dllm_local
from dllm_local import Settings, SettingsError
from dllm_local.cli import build_parser
from dllm_local.cli.settings_flags import settings_from_args
from dllm_local.models.attention import BlockCausal, Segment
from dllm_local.models.attention_backends import BACKENDS, DEFAULT
from dllm_local.runner import runner_for
from dllm_local.serving.scheduler import Request, Scheduler
from dllm_local.settings import AttentionBackendName, knob
from dllm_local.tiny_checkpoints.random_sdar import build_checkpoint as build_sdar
from test_fast_path import POLICIES, _settings

PROMPTS = ["What is 12 + 7?", "hi", "Deal a poker hand and name it."]
# Logits reach ~20 here; SDPA's own math kernel differs from its default one by 2e-5 on them.
EXACT = dict(rtol=1e-5, atol=5e-5)


def _close(flex: list[torch.Tensor], sdpa: list[torch.Tensor]) -> None:
    assert len(flex) == len(sdpa)
    for got, want in zip(flex, sdpa):
        torch.testing.assert_close(got, want, **EXACT)


def test_the_settings_choices_are_the_registered_backends_sdpa_first():
    assert get_args(AttentionBackendName) == tuple(BACKENDS) and knob("attention_backend").default == DEFAULT == "sdpa"


def test_a_backend_not_registered_is_refused_naming_the_ones_that_are(tiny):
    with pytest.raises(SettingsError, match="attention_backend must be 'sdpa' or 'flex'"):
        Settings(attention_backend="flash")
    with pytest.raises(SettingsError, match="attention_backend must be"):
        Settings.from_dict({"attention_backend": "flex "})
    with pytest.raises(ValueError, match="attention backend 'flash': one of sdpa, flex"):
        runner_for(tiny.model, "eager", attention="flash")


def test_the_flag_names_the_backend():
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--attention-backend", "flex"])
    assert settings_from_args(args).attention_backend == "flex"
    with pytest.raises(SystemExit):  # argparse's choices: the registered names
        build_parser().parse_args(["generate", "--prompt", "hi", "--attention-backend", "flash"])


@torch.no_grad()
def _one_request(model, backend: str, layout) -> list[torch.Tensor]:
    """One request's forwards of every kind: plain; cached, the whole sequence, then a few positions
    after some entries were evicted; a fork's three variant rows; one query reading the cache with
    its own rows as ``visible`` says."""
    g = torch.Generator().manual_seed(0)
    L, part = 40, torch.arange(20, 28)
    ids = torch.randint(3, min(500, model.config.vocab_size), (3, L), generator=g)
    visible = (torch.rand(8, 8, generator=g) > 0.5) | torch.eye(8, dtype=torch.bool)
    view = model.new_cache(1, L).alloc(L)

    def run(*args) -> torch.Tensor:
        return model(*args, layout=layout, attention_backend=backend).logits

    out = [run(ids[:1]), run(ids[:1], torch.arange(L), view)]
    view.invalidate(torch.arange(30, 34))
    return [*out, run(ids[:1, part], part, view), run(ids[:, part], part, view.fork()),
            run(ids[:1, part], part, view.fork(visible))]


@pytest.mark.parametrize("layout", [None, BlockCausal(8)], ids=["bidirectional", "block-causal"])
def test_every_kind_of_forward_of_one_request_gives_sdpas_logits(tiny, layout):
    _close(_one_request(tiny.model, "flex", layout), _one_request(tiny.model, "sdpa", layout))


@torch.no_grad()
def _packed(model, backend: str, layouts) -> list[torch.Tensor]:
    """Three requests of different lengths packed in one forward (each its whole sequence), then two
    of them in the other slot order (their rows gathered), one after an eviction."""
    g = torch.Generator().manual_seed(1)
    lengths = (24, 16, 20)
    store = model.new_cache(3, max(lengths))
    views = [store.alloc(n) for n in lengths]
    ids = [torch.randint(3, 500, (n,), generator=g) for n in lengths]

    def forward(spans: dict[int, tuple[int, int]]) -> torch.Tensor:
        segments = [Segment(views[i], torch.arange(*span), (), layouts[i]) for i, span in spans.items()]
        tokens = torch.cat([ids[i][s.positions] for i, s in zip(spans, segments)])[None]
        positions = torch.cat([s.positions for s in segments])
        return model(tokens, positions, segments=segments, attention_backend=backend).logits

    first = forward({0: (0, 24), 1: (0, 16), 2: (0, 20)})
    views[1].invalidate(torch.arange(4, 8))
    return [first, forward({2: (8, 14), 1: (2, 9)})]


@pytest.mark.parametrize("layouts", [(None, None, None), (BlockCausal(4), None, BlockCausal(8))],
                         ids=["one layout", "a layout per request"])
def test_a_packed_forward_gives_sdpas_logits(tiny, layouts):
    _close(_packed(tiny.model, "flex", layouts), _packed(tiny.model, "sdpa", layouts))


@pytest.mark.parametrize("cache", list(POLICIES))
def test_every_cache_policy_decodes_sdpas_tokens_with_flex(tiny, cache):
    settings = _settings(cache, gen_length=16, block_size=16)
    sdpa, flex = (dllm_local.generate(tiny, PROMPTS[0], settings.with_(attention_backend=b)) for b in ("sdpa", "flex"))
    assert flex.token_ids == sdpa.token_ids
    assert (sdpa.stats.attention_backend, flex.stats.attention_backend) == ("sdpa", "flex")


def test_a_batch_decodes_sdpas_tokens_with_flex_and_refuses_a_second_backend(tiny):
    settings = Settings(gen_length=16, block_size=8, cache="dual", unmask="threshold")
    sdpa, flex = (dllm_local.generate_batch(tiny, PROMPTS, settings.with_(attention_backend=b)) for b in ("sdpa", "flex"))
    assert [r.token_ids for r in flex] == [r.token_ids for r in sdpa]
    assert {r.trace.stats.attention_backend for r in flex} == {"flex"}
    with pytest.raises(SettingsError, match="share one packed forward"):
        dllm_local.generate_batch(tiny, PROMPTS[:2], [settings, settings.with_(attention_backend="flex")])
    scheduler = Scheduler(SimpleNamespace(handle=tiny), conn=None)  # the engine's batch keeps the default
    asked = {b: scheduler._batchable(Request("r", "run", {"settings": settings.with_(attention_backend=b)})) for b in BACKENDS}
    assert asked == {"sdpa": True, "flex": False}


def test_flex_compiles_to_one_graph_and_decodes_as_eager():
    handle = dllm_local.load("tiny")  # a model of its own: its compiled runner is this test's
    runner_for(handle.model, "compiled", backend="eager", attention="flex")  # dynamo's graph run as it is
    settings = Settings(gen_length=8, block_size=8, cache="none", unmask="threshold", attention_backend="flex")
    eager, compiled = (dllm_local.generate(handle, PROMPTS[0], settings.with_(forward_mode=m)) for m in ("eager", "compiled"))
    assert compiled.token_ids == eager.token_ids
    assert (compiled.stats.forward_mode, compiled.stats.forward_notice, compiled.stats.attention_backend) == (
        "compiled", "", "flex")


def test_a_block_causal_family_with_grouped_heads_decodes_sdpas_tokens(tmp_path):
    handle = dllm_local.load(str(build_sdar(tmp_path / "sdar")), device="cpu", dtype="float32")
    for cache in ("block", "none"):
        settings = Settings(gen_length=8, block_size=4, cache=cache, unmask="threshold")
        sdpa, flex = (dllm_local.generate(handle, PROMPTS[0], settings.with_(attention_backend=b)) for b in ("sdpa", "flex"))
        assert flex.token_ids == sdpa.token_ids, cache
    _close(_one_request(handle.model, "flex", None), _one_request(handle.model, "sdpa", None))


@torch.no_grad()
def test_dreams_grouped_heads_decode_sdpas_tokens(dream_dir):
    handle = dllm_local.load(str(dream_dir), device="cpu", dtype="float32")
    settings = Settings(gen_length=16, block_size=8, cache="dual", unmask="threshold")
    sdpa, flex = (dllm_local.generate(handle, PROMPTS[0], settings.with_(attention_backend=b)) for b in ("sdpa", "flex"))
    assert flex.token_ids == sdpa.token_ids
    ids = torch.randint(3, 500, (1, 40), generator=torch.Generator().manual_seed(0))  # a plain forward: no mask at all
    _close([handle.model(ids, attention_backend="flex").logits], [handle.model(ids).logits])
