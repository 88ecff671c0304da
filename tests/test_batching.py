"""Batched decoding: each request of a batch decodes as it would alone, finished requests leave
the batch, and the adaptive cache's per-request quotas share one budget."""
import math
import random
import subprocess
import sys

import pytest
import torch

import dllm_local
from dllm_local import (
    Settings,
    SettingsError,
    generate,
    generate_batch,
    stream,
    stream_batch,
)
from dllm_local.models.attention import Segment
from dllm_local.policies import registry
from dllm_local.decoding.batch import FLOOR_SHARE, BatchRun, QuotaPool, generate_all

# Different lengths on purpose: the rows of a batch are not aligned anywhere.
PROMPTS = ["What is 12 + 7?", "Deal a poker hand and name it.", "What is 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11?", "hi"]
SMALL = dict(gen_length=32, block_size=8, seed=3)


def _alone(handle, prompts, settings, guider=None):
    return [generate(handle, p, settings, guider).token_ids for p in prompts]


@pytest.mark.parametrize("cache, params", [("none", {}), ("prefix", {"refresh_every": 1}), ("dual", {"refresh_every": 1})])
@pytest.mark.parametrize("unmask", ["threshold", "fixed"])
def test_each_request_of_a_batch_gives_the_tokens_it_gives_alone(tiny, cache, params, unmask):
    settings = Settings(cache=cache, cache_params=params, unmask=unmask, **SMALL)
    batch = generate_batch(tiny, PROMPTS, settings)
    assert [r.token_ids for r in batch] == _alone(tiny, PROMPTS, settings)
    assert len({len(r.trace.prompt_ids) for r in batch}) == len(PROMPTS)  # really of different lengths


@pytest.mark.parametrize("cache", sorted(registry.for_model("masked", registry.CACHE)))
def test_every_cache_policy_runs_batched_and_matches_alone(tiny, cache):
    """Beyond the exact cases: the rows never share a position, so approximate caches (which
    reuse stale entries) decode each request as alone too."""
    settings = Settings(cache=cache, unmask="threshold", temperature=0.7, **SMALL)
    assert [r.token_ids for r in generate_batch(tiny, PROMPTS, settings)] == _alone(tiny, PROMPTS, settings)


@pytest.mark.parametrize("unmask", sorted(set(registry.UNMASK) - {"fixed", "threshold"}))
def test_every_unmasking_policy_runs_batched_and_matches_alone(tiny, tiny_guider, unmask):
    settings = Settings(cache="dual", unmask=unmask, **SMALL)
    guider = tiny_guider if settings.unmask_spec.needs_guider else None
    got = [r.token_ids for r in generate_batch(tiny, PROMPTS[:3], settings, guider)]
    assert got == _alone(tiny, PROMPTS[:3], settings, guider)


def test_a_released_layout_llada_checkpoint_decodes_batched_as_alone(llada_dir):
    handle = dllm_local.load(str(llada_dir))
    settings = Settings(cache="dual", unmask="threshold", **SMALL)
    assert [r.token_ids for r in generate_batch(handle, PROMPTS[:3], settings)] == _alone(handle, PROMPTS[:3], settings)


def test_stream_batch_yields_each_requests_records_as_its_own_run_would(tiny):
    settings = Settings(cache="dual", unmask="threshold", **SMALL)
    run = stream_batch(tiny, PROMPTS, settings)
    per_request = {i: [] for i in range(len(PROMPTS))}
    for i, record in run:
        per_request[i].append(record.committed)
    for i, prompt in enumerate(PROMPTS):
        alone = [record.committed for record in stream(tiny, prompt, settings)]
        # The same commits at the same steps; the confidences agree to float32 (a packed forward
        # adds in another order).
        assert [[(p, t) for p, t, _ in step] for step in per_request[i]] == [[(p, t) for p, t, _ in step] for step in alone]
        got = [c for step in per_request[i] for *_, c in step]
        assert got == pytest.approx([c for step in alone for *_, c in step], abs=1e-5)
        assert run.results[i].stats.batch_size == len(PROMPTS)


def test_a_finished_request_leaves_the_batch(tiny):
    """Requests of very different lengths: the short ones finish first, and from then on the
    forwards compute fewer rows (the cache keeps only the rows still decoding)."""
    settings = Settings(cache="dual", unmask="threshold", early_stop=True, gen_length=64, block_size=8)
    prompts = ["hi", "What is 2 + 2?", "Write a long record of three people with their ages and cities."]
    run = stream_batch(tiny, prompts, settings)
    rows_per_forward = []
    for _ in run:
        rows_per_forward.append(run.cache.in_use)
    forwards = [r.stats.nfe for r in run.results]
    assert len(set(forwards)) > 1, "the requests must finish at different steps for this test to mean anything"
    assert run.forwards == max(forwards)  # one forward per step for the whole batch
    assert run.row_forwards == sum(forwards) < run.forwards * len(prompts)  # done requests cost nothing more
    assert rows_per_forward[-1] < len(prompts) and rows_per_forward == sorted(rows_per_forward, reverse=True)
    # Each request's latency is when it finished, so the first done is the fastest.
    first_done = min(range(len(prompts)), key=forwards.__getitem__)
    assert run.latency_s[first_done] == min(run.latency_s) < run.wall_s
    assert [r.token_ids for r in run.results] == _alone(tiny, prompts, settings)
    # The forwards' time is split over the requests by the positions they computed.
    assert sum(r.stats.model_share_s for r in run.results) == pytest.approx(run.model_s, rel=1e-9)


def test_per_request_settings_keep_each_requests_seed(tiny):
    base = Settings(cache="dual", unmask="threshold", temperature=1.0, **SMALL)
    settings = [base.for_problem(i) for i in range(3)]
    got = [r.token_ids for r in generate_batch(tiny, PROMPTS[:3], settings)]
    assert got == [generate(tiny, p, s).token_ids for p, s in zip(PROMPTS[:3], settings)]


def test_requests_with_different_probes_and_drift_each_see_their_own(tiny):
    """drift_refresh beside dual, and two probe layers: each request's attention probe and its
    per-step KV drift are its own, as alone."""
    base = Settings(unmask="threshold", **SMALL)
    settings = [base.with_(cache="dual"), base.with_(cache="drift_refresh", cache_params={"probe_layer": 0}),
                base.with_(cache="drift_refresh", cache_params={"probe_layer": 3, "gamma": 0.99})]
    batch = generate_batch(tiny, PROMPTS[:3], settings)
    for prompt, s, got in zip(PROMPTS[:3], settings, batch):
        alone = generate(tiny, prompt, s)
        assert got.token_ids == alone.token_ids
        for g, a in zip(got.trace.steps, alone.trace.steps):
            assert g.policy.get("drift") == pytest.approx(a.policy.get("drift"), abs=1e-5)
            assert g.kv.keys() == a.kv.keys() and g.kv  # per-layer drift summaries, not empty
            for layer in a.kv:
                for key, value in a.kv[layer].items():
                    assert g.kv[layer][key] == pytest.approx(value, abs=1e-4, nan_ok=True)


def test_a_requests_time_is_its_own(tiny, tiny_guider):
    """Guider forwards count as the request's own model time, and the consumer's time spent on
    the records of a batch is no request's."""
    import time

    guided = Settings(cache="dual", unmask="guided", **SMALL)
    result = generate_batch(tiny, PROMPTS[:1], guided, tiny_guider)[0]
    # model_s sums the steps' model_ms, rounded to 1e-4 ms each: at most 5e-8 s off per step.
    steps = len(result.trace.steps)
    assert result.stats.guider_forwards > 0
    assert result.stats.model_share_s == pytest.approx(result.stats.model_s, abs=5e-8 * steps)

    def times(sleep: float) -> tuple[float, list[float], int]:
        run = stream_batch(tiny, PROMPTS, Settings(cache="dual", unmask="threshold", **SMALL))
        records = 0
        for _ in run:
            time.sleep(sleep)
            records += 1
        return run.wall_s, [r.stats.wall_s for r in run.results], records

    quiet, (wall, walls, records) = times(0.0), times(0.05)
    slept = 0.05 * records
    # Charged to the batch or to a request, the sleeps would add most of ``slept`` (each request
    # waits through the others' records every round); left out, they add nothing but noise.
    assert wall < quiet[0] + slept / 2
    for alone, slow in zip(quiet[1], walls):
        assert slow < alone + slept / 2


def test_share_budget_off_keeps_each_requests_own_budget(tiny):
    settings = Settings(cache="adaptive", cache_params={"budget": 24, "device_profile": "H100"}, unmask="threshold",
                        **SMALL)
    own = [r.token_ids for r in generate_batch(tiny, PROMPTS, settings, share_budget=False)]
    assert own == _alone(tiny, PROMPTS, settings)


def test_a_finished_request_lets_go_of_the_batch_tensors(tiny):
    run = stream_batch(tiny, PROMPTS, Settings(cache="dual", unmask="threshold", **SMALL))
    for _ in run:
        pass
    assert run.cache is None and all(r.cache is None and r.logits is None for r in run.runs)


def test_what_cannot_be_batched_is_refused_clearly(tiny, dream_dir):
    settings = Settings(**SMALL)
    with pytest.raises(SettingsError, match="one request at a time"):
        stream_batch(dllm_local.load(str(dream_dir)), PROMPTS, settings)
    with pytest.raises(SettingsError, match="exact_drift"):
        stream_batch(tiny, PROMPTS, settings.with_(exact_drift=True))
    with pytest.raises(SettingsError, match="at least one prompt"):
        stream_batch(tiny, [], settings)
    with pytest.raises(SettingsError, match="2 settings for 4 prompts"):
        stream_batch(tiny, PROMPTS, [settings, settings])
    with pytest.raises(SettingsError, match="0 settings for 4 prompts"):
        stream_batch(tiny, PROMPTS, [])
    for size in (0, -1, 1.5):
        with pytest.raises(SettingsError, match="batch_size must be"):
            generate_all(tiny, PROMPTS, [settings] * 4, batch_size=size)


def test_a_request_holds_a_slot_of_the_cache_and_a_freed_slot_is_refilled_empty(tiny):
    cache = tiny.model.new_cache(slots=3, max_len=9)
    views = [cache.alloc(n) for n in (5, 9, 7)]
    assert [v.slot for v in views] == [0, 1, 2] and cache.in_use == 3 and views[1].seq_len == 9
    views[1].k[0][0, 0, 3] = 1.0
    views[1].valid[3] = True
    views[2].k[0][0, 0, 3] = 2.0
    assert cache.k[0][1, 0, 3].eq(1.0).all() and views[1].k[0].data_ptr() == cache.k[0][1:2].data_ptr()
    with pytest.raises(RuntimeError, match="all 3 cache slots are in use"):
        cache.alloc()
    cache.free(views[1])  # a request finished: its slot is emptied, nobody else's entries move
    assert cache.in_use == 2 and not cache.k[0][1].any() and not cache.valid[1].any()
    assert cache.k[0][2, 0, 3].eq(2.0).all()
    again = cache.alloc(4)
    assert again.slot == 1 and again.seq_len == 4 and again.num_cached() == 0
    cache.free(views[0])
    with pytest.raises(RuntimeError, match="slot 0 is already free"):
        cache.free(views[0])


# ---------------------------------------------------------------- quotas
def test_quota_pool_shares_the_budget_max_min_fairly():
    rng = random.Random(0)
    for _ in range(500):
        total = rng.randint(1, 400)
        holding = {i: rng.randint(0, 200) for i in range(rng.randint(1, 8))}
        quotas = QuotaPool(total).allocate(holding)
        assert set(quotas) == set(holding)
        assert sum(quotas.values()) <= total
        even = total // len(holding)
        for i, held in holding.items():
            if held <= even:  # under an even share: keeps all it holds
                assert quotas[i] == held
            else:  # over it: at least an even share, never more than it holds
                assert even <= quotas[i] <= held
        if sum(holding.values()) > total:  # nothing left unused when the requests want more
            assert sum(quotas.values()) == total


def test_every_request_keeps_its_floor_and_the_rest_is_shared_max_min_fairly():
    """The write-up's rule: each request keeps at least its floor (20% of its length's K/V);
    what is left of the total goes max-min fairly by what each holds beyond it."""
    rng = random.Random(1)
    for _ in range(500):
        holding = {i: rng.randint(0, 200) for i in range(rng.randint(1, 8))}
        floors = {i: rng.randint(0, 40) for i in holding}
        total = sum(floors.values()) + rng.randint(0, 300)
        quotas = QuotaPool(total).allocate(holding, floors)
        assert sum(quotas.values()) <= total and all(quotas[i] >= floors[i] for i in holding)
        wants = {i: max(0, holding[i] - floors[i]) for i in holding}
        left = total - sum(floors.values())
        even = left // len(holding)
        for i in holding:
            extra = quotas[i] - floors[i]
            assert extra == wants[i] if wants[i] <= even else even <= extra <= wants[i]
        if sum(wants.values()) > left:
            assert sum(quotas.values()) == total
    assert QuotaPool(100).allocate({0: 90, 1: 90}, {0: 10, 1: 40}) == {0: 35, 1: 65}


def test_short_requests_cannot_squeeze_a_long_one_below_its_floor(tiny):
    """In a batch sharing its adaptive budgets, every request's quota at every step is at least
    20% of its own length (its whole budget, here): three short requests holding their caches
    would otherwise leave the long one an even share, far under a fifth of its length."""
    settings = [Settings(cache="adaptive", cache_params={"budget": FLOOR_SHARE, "device_profile": "H100"},
                         unmask="threshold", gen_length=g, block_size=16) for g in (16, 16, 16, 256)]
    run = BatchRun(tiny, PROMPTS[:3] + PROMPTS[:1], settings)
    seen = set()
    for i, record in run:
        assert record.policy["quota"] >= math.ceil(FLOOR_SHARE * run.runs[i].state_length) - 1  # the budget rounds down
        seen.add(i)
    assert seen == {0, 1, 2, 3}


def test_a_finished_requests_quota_goes_to_the_others():
    pool = QuotaPool(90)
    assert pool.allocate({0: 60, 1: 60, 2: 60}) == {0: 30, 1: 30, 2: 30}
    assert pool.allocate({0: 60, 2: 60}) == {0: 45, 2: 45}
    assert pool.allocate({0: 10, 2: 100}) == {0: 10, 2: 80}  # what one does not need, the other may use


def test_batched_adaptive_cache_keeps_the_quotas_within_the_budget_and_evicts_k_and_v_together(tiny):
    budget = 24
    settings = Settings(cache="adaptive", cache_params={"budget": budget, "device_profile": "H100"},
                        unmask="threshold", **SMALL)
    run = stream_batch(tiny, PROMPTS, settings)
    evictions = 0
    for i, record in run:
        quotas = [r.cache_policy.quota for r in run.runs if r.result is None]
        assert sum(quotas) <= budget * len(PROMPTS)
        assert record.policy["quota"] <= budget * len(PROMPTS)
        evictions = max(evictions, record.policy["evicted"])  # the request's evictions so far
        view = run.runs[i].cache
        assert view.num_cached() <= record.policy["quota"]
        gone = ~view.valid[: view.seq_len]
        for k, v in zip(view.k, view.v):  # an evicted position holds nothing, in K and in V
            n = view.seq_len
            assert not k[0, :, :n][:, gone].any() and not v[0, :, :n][:, gone].any()
    assert evictions > 0


# ---------------------------------------------------------------- the tools
def test_eval_with_a_batch_size_scores_the_same_as_one_at_a_time(tiny):
    from dllm_local.experiments.evaluate import evaluate

    settings = Settings(cache="dual", unmask="threshold", gen_length=64, block_size=16)
    one = evaluate(tiny, "arithmetic", 12, 1000, settings)
    batched = evaluate(tiny, "arithmetic", 12, 1000, settings, batch_size=5)
    assert batched["score"] == one["score"] and batched["examples"] == one["examples"]
    assert batched["nfe"] == one["nfe"] and batched["batch_size"] == 5


def test_bench_with_a_batch_size_scores_the_same_and_answers_the_four_questions(tiny):
    from dllm_local.experiments.side_by_side import STRATEGY_SETS, format_table, run_bench
    from dllm_local.experiments.problems import task_problems

    problems = task_problems("arithmetic", 6, 1000)
    base = Settings(gen_length=32, block_size=8)
    strategies = STRATEGY_SETS["headline"]()[:2]
    one = run_bench(tiny, problems, strategies, base, repeats=1, progress=False)
    batched = run_bench(tiny, problems, strategies, base, repeats=1, progress=False, batch_size=3)
    assert [r["accuracy"] for r in batched["rows"]] == [r["accuracy"] for r in one["rows"]]
    table = format_table(batched)
    assert "3 requests at a time" in table and "concurrency: 3 requests decoded together" in table
    assert "baseline: the first row, run on this machine, with this engine, in this same run" in table
    assert "threshold 0.9" in table and "quality" in table
    assert "prefill" in table and "refresh" in table
    row = batched["rows"][1]
    assert 0 < row["prefill_share"] and 0 <= row["refresh_share"] and row["prefill_share"] + row["refresh_share"] <= 1


def test_bench_concurrency_prints_both_curves_and_the_crossover():
    out = subprocess.run(
        [sys.executable, "-m", "dllm_local", "bench", "--concurrency", "1,2,4", "--n", "4", "--gen-length", "32",
         "--block-size", "8", "--cache", "dual", "--threshold", "0.9", "--quiet"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = [line.split() for line in lines if line.strip() and line.split()[0] in ("1", "2", "4")]
    assert [r[0] for r in rows] == ["1", "2", "4"]
    assert all(float(r[1]) > 0 and float(r[4]) > 0 for r in rows)  # diffusion and AR tokens/s
    assert any(line.startswith("measured here: diffusion throughput") for line in lines)
    teaching = next(line for line in lines if "teaching 7B" in line)
    assert "saturates at ~9 requests" in teaching and "overtakes at ~37" in teaching
    assert any("LLaDA-8B vs an 8B AR model on H100" in line for line in lines)


def test_bench_concurrency_needs_enough_problems():
    out = subprocess.run([sys.executable, "-m", "dllm_local", "bench", "--concurrency", "1,8", "--n", "4", "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--n >= 8" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "dllm_local", "bench", "--concurrency", "4,2"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "increasing whole numbers" in bad.stderr
    both = subprocess.run([sys.executable, "-m", "dllm_local", "bench", "--concurrency", "1,2", "--batch-size", "4"],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode != 0 and "takes no --batch-size" in both.stderr


@torch.inference_mode()
def test_packed_forward_matches_each_request_alone_in_float32(tiny):
    """The logits of a packed batch forward against one forward per request: ~1e-5."""
    model = tiny.model
    seqs = [torch.randint(0, 500, (n,)) for n in (7, 13, 4)]
    cache = model.new_cache(len(seqs), max(len(s) for s in seqs))
    segments = [Segment(cache.alloc(len(s)), torch.arange(len(s))) for s in seqs]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    packed = model(torch.cat(seqs)[None], positions, segments=segments).logits[0].split([len(s) for s in seqs])
    for seq, got in zip(seqs, packed):
        alone = model.new_cache(1, len(seq)).alloc()
        want = model(seq[None], torch.arange(len(seq)), alone).logits[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- continuous batching
# Answer lengths that differ on purpose: requests finish at different steps, so slots free mid-run.
MIXED = [dict(gen_length=g, block_size=8, seed=i) for i, g in enumerate((8, 32, 16, 24, 8, 32))]
MIXED_PROMPTS = PROMPTS + ["What is 2 + 2?", "Name a card."]


def _mixed(**policy) -> list[Settings]:
    return [Settings(**policy, **lengths) for lengths in MIXED]


@pytest.mark.parametrize("cache", sorted(registry.for_model("masked", registry.CACHE)))
def test_continuous_batching_decodes_each_request_as_alone_under_every_cache_policy(tiny, cache):
    settings = _mixed(cache=cache, unmask="threshold", temperature=0.7)
    got = [r.token_ids for r in generate_all(tiny, MIXED_PROMPTS, settings, batch_size=2)]
    assert got == [generate(tiny, p, s).token_ids for p, s in zip(MIXED_PROMPTS, settings)]


@pytest.mark.parametrize("unmask", sorted(set(registry.UNMASK) - {"threshold"}))
def test_continuous_batching_decodes_each_request_as_alone_under_every_unmasking_policy(tiny, tiny_guider, unmask):
    settings = _mixed(cache="dual", unmask=unmask)
    guider = tiny_guider if settings[0].unmask_spec.needs_guider else None
    got = [r.token_ids for r in generate_all(tiny, MIXED_PROMPTS[:4], settings[:4], guider, batch_size=3)]
    assert got == [generate(tiny, p, s, guider).token_ids for p, s in zip(MIXED_PROMPTS[:4], settings[:4])]


def test_a_freed_slot_is_taken_at_once_by_the_next_prompt_in_the_same_forward_as_the_others(tiny):
    """Two slots, three requests: the short first one ends, and the third one's first step is in
    the very next forward, packed beside the second one's step."""
    settings = [Settings(cache="dual", unmask="fixed", gen_length=g, block_size=8, seed=0) for g in (8, 32, 8)]
    finished = []
    run = BatchRun(tiny, PROMPTS[:3], settings, slots=2, finished=finished.append)
    forward_of: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for i, _ in run:
        forward_of[i].append(run.forwards)
    assert forward_of[2][0] == forward_of[0][-1] + 1 and forward_of[2][0] in forward_of[1]
    assert run.cache is None and finished == [0, 2, 1]
    assert run.forwards == len(forward_of[1]) < sum(map(len, forward_of.values()))  # the third never waited
    assert [r.stats.batch_size for r in run.results] == [2, 2, 2]
    assert [r.token_ids for r in run.results] == [generate(tiny, p, s).token_ids for p, s in zip(PROMPTS, settings)]


def test_static_and_continuous_batching_give_the_same_answers_and_count_every_request(tiny):
    settings = _mixed(cache="dual", unmask="threshold")
    counted = {True: [], False: []}
    got = {c: [r.token_ids for r in generate_all(tiny, MIXED_PROMPTS, settings, batch_size=4, continuous=c,
                                                  done=counted[c].append)] for c in (True, False)}
    assert got[True] == got[False] and sum(counted[True]) == sum(counted[False]) == len(MIXED_PROMPTS)


def test_continuous_batching_shares_the_adaptive_budget_by_quotas_that_never_exceed_it(tiny):
    budget = 24
    settings = _mixed(cache="adaptive", cache_params={"budget": budget, "device_profile": "H100"}, unmask="threshold")
    run = BatchRun(tiny, MIXED_PROMPTS, settings, slots=3)
    for _ in run:
        held = [run.runs[i].cache.num_cached() for i in range(len(MIXED_PROMPTS))
                if run.runs[i].cache is not None and run.runs[i].result is None]
        assert sum(held) <= 3 * budget
    assert all(r.text is not None for r in run.results)


def test_requests_added_while_a_batch_decodes_take_free_slots_and_decode_as_alone(tiny):
    """A server's batch: requests join between records (a lecturer's first in line), one is
    stopped by its owner alone, and every other request ends with the tokens it gives alone."""
    settings = [Settings(cache="dual", unmask="fixed", gen_length=g, block_size=8, seed=i) for i, g in enumerate((8, 32))]
    run = BatchRun(tiny, PROMPTS[:2], settings, slots=2, max_len=96)
    joined, stopped, lecturer = None, None, None
    first_forward: dict[int, int] = {}
    for i, _ in run:
        first_forward.setdefault(i, run.forwards)
        if joined is None:  # a student, then a lecturer, both while both slots are busy
            joined = run.add(PROMPTS[2], settings[0].with_(seed=7))
            stopped = run.add(PROMPTS[3], settings[1])
            lecturer = run.add("What is 2 + 2?", settings[0], first=True)
        if i == stopped:  # its owner presses Stop at its first step
            run.stop(stopped)
    assert first_forward[lecturer] < first_forward[joined] < first_forward[stopped]
    assert run.results[stopped].stats.stopped and not any(r.stats.stopped for k, r in enumerate(run.results) if k != stopped)
    expected = {0: (PROMPTS[0], settings[0]), 1: (PROMPTS[1], settings[1]), joined: (PROMPTS[2], settings[0].with_(seed=7)),
                lecturer: ("What is 2 + 2?", settings[0])}
    for k, (prompt, s) in expected.items():
        assert run.results[k].token_ids == generate(tiny, prompt, s).token_ids


def test_a_request_longer_than_the_batchs_slots_is_refused_when_added(tiny):
    run = BatchRun(tiny, PROMPTS[:1], Settings(**SMALL), slots=2)
    with pytest.raises(SettingsError, match="the batch's slots hold"):
        run.add(PROMPTS[0], Settings(gen_length=256, block_size=8))
