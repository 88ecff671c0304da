"""The lesson verdicts on hand-built traces whose figures are worked out by hand: each claim
holds, does not hold, or cannot be measured, with the numbers that decide it."""
from __future__ import annotations

import pytest

from ui.lessons import verdicts as lessons

POKER = "Kate is playing cards. Name a poker hand Kate could hold."
END = 9  # the end-of-text id of these traces


def _trace(steps: list[dict], prompt_ids=(1, 2), gen_length=4, **extra) -> dict:
    records = [{"committed": [], "g": 0, "reads": 0, "forwards": 1, "policy": {}, "revoked": [], **s} for s in steps]
    return {"prompt_ids": list(prompt_ids), "gen_length": gen_length, "steps": records,
            "model": {"stop_ids": [END]}, "vocab": {str(END): "<|endoftext|>"},
            "settings": {"cache": "dual", "unmask": "threshold", "gen_length": gen_length}, **extra}


def test_theorem1_n_counts_every_commit_and_the_run_fails_on_one_unguaranteed_step():
    # Step 0: two words at 0.58 and 0.42 plus an end of text at 0.99: n = 3, ε = 0.58, 4ε = 2.32.
    # Step 1: two commits at 0.9 and 0.95: ε = 0.1, 3ε = 0.3 <= 1.
    trace = _trace([{"committed": [[2, 5, 0.58], [3, 6, 0.42], [5, END, 0.99]]},
                    {"committed": [[4, 7, 0.9], [5, END, 0.95]]}])
    first = lessons.theorem1_verdict(trace, 0)
    assert first.status == lessons.FAILS
    assert first.numbers["n"] == 3 and first.numbers["end_of_text"] == 1
    assert first.numbers["epsilon"] == pytest.approx(0.58) and first.numbers["bound"] == pytest.approx(2.32)
    assert "n = 3 (1 end of text), ε = 0.58, (n+1)ε = 2.32 > 1" in first.text
    # Step 0 of a run with two parallel steps: its one so far, not "the run's one".
    assert "the one parallel step so far" in first.text and "the run's" not in first.text
    whole = lessons.theorem1_verdict(trace, 1)
    assert whole.status == lessons.FAILS and whole.numbers["unguaranteed_steps"] == [0]
    # The figures of the step that decides (the first without a guarantee), not the last step's.
    assert whole.numbers["step"] == 0 and whole.numbers["bound"] == pytest.approx(2.32)
    assert "step 0: no guarantee, n = 3" in whole.text and "1 of the 2 parallel steps without a guarantee" in whole.text
    holds = lessons.theorem1_verdict(_trace([{"committed": [[4, 7, 0.9], [5, END, 0.95]]}]), 0)
    assert holds.status == lessons.HOLDS and "(n+1)ε = 0.30 ≤ 1" in holds.text
    serial = lessons.theorem1_verdict(_trace([{"committed": [[2, 5, 0.3]]}]), 0)
    assert serial.status == lessons.UNMEASURABLE and "no step so far committed more than one" in serial.text
    # A guaranteed parallel step, then a serial one shown: the run holds, with no ε of a serial step.
    later = lessons.theorem1_verdict(_trace([{"committed": [[4, 7, 0.9], [5, END, 0.95]]}, {"committed": [[2, 5, 0.3]]}]), 1)
    assert later.status == lessons.HOLDS and later.text.endswith("the one parallel step guaranteed (" + lessons.THEOREM1_N + ")")


def _exact(values: list[float]) -> dict:
    return {"cache_vs_exact": {"0": {"k": values, "v": values}, "1": {"k": [1.0] * len(values), "v": values}}}


def test_reused_kv_is_split_by_kind_and_recomputed_positions_are_left_out():
    # Positions 0-1 prompt, 2-5 answer. Step 0 refreshes everything; step 1 recomputes 3 and 4
    # and reuses 0, 1 (prompt), 2 (decoded at step 0) and 5 (still masked).
    trace = _trace([{"committed": [[2, 5, 0.9]], "recomputed": [0, 1, 2, 3, 4, 5], "exact": _exact([1.0] * 6)},
                    {"committed": [[3, 6, 0.9]], "recomputed": [3, 4],
                     "exact": _exact([0.999, 0.995, 0.98, 1.0, 1.0, 0.9])}])
    assert lessons.reused_kv_error(trace, 0, "0", "k") == {"prompt": [], "decoded": [], "masked": []}
    assert lessons.reused_kv_error(trace, 1, "0", "k") == {"prompt": [0.999, 0.995], "decoded": [0.98], "masked": [0.9]}
    # The mean over layers is per position: layer 1's K is exact, so 0.9 becomes 0.95.
    assert lessons.reused_kv_error(trace, 1, "mean", "k")["masked"] == [pytest.approx(0.95)]
    verdict = lessons.kv_reuse_verdict(trace, 1, "0", "v")
    assert verdict.status == lessons.FAILS
    assert verdict.numbers["run"]["prompt"] == {"count": 2, "mean": pytest.approx(0.997), "min": 0.995}
    assert "decoded mean 0.980 min 0.980 (1), masked mean 0.900 min 0.900 (1)" in verdict.text
    close = _trace([{"committed": [[2, 5, 0.9]], "recomputed": [2, 3, 4, 5], "exact": _exact([0.995, 0.999, 1, 1, 1, 1])}])
    assert lessons.kv_reuse_verdict(close, 0, "0", "v").status == lessons.HOLDS
    assert lessons.kv_reuse_verdict(_trace([{"committed": [[2, 5, 0.9]]}]), 0, "0", "v").status == lessons.UNMEASURABLE


def test_revoked_positions_count_as_masked_again():
    trace = _trace([{"committed": [[2, 5, 0.9]], "revoked": [[2, 5, 0.9, 0.1]], "recomputed": [0, 1, 2, 3, 4, 5],
                     "exact": _exact([1.0] * 6)},
                    {"committed": [[3, 6, 0.9]], "recomputed": [3, 4, 5], "exact": _exact([1, 1, 0.97, 1, 1, 1])}])
    assert lessons.reused_kv_error(trace, 1, "0", "k")["masked"] == [0.97]


def test_cache_saving_is_g_against_every_position_each_forward_attends():
    # 2 + 4 = 6 positions: 3 forwards recompute 6 + 2 + 2 = 10 of the 18 they attend (the rest read).
    trace = _trace([{"g": 6}, {"g": 2, "reads": 4}, {"g": 2, "reads": 4}])
    verdict = lessons.cache_saves_verdict(trace)
    assert verdict.status == lessons.HOLDS and verdict.numbers["g_with_cache"] == 10
    assert verdict.numbers["g_without_cache"] == 18 and "56% of that" in verdict.text
    assert lessons.cache_saves_verdict(_trace([{"g": 6}, {"g": 6}])).status == lessons.FAILS
    none = _trace([{"g": 6}], settings={"cache": "none"})
    assert lessons.cache_saves_verdict(none).status == lessons.UNMEASURABLE


def test_a_padded_span_is_counted_alike_with_and_without_the_cache():
    """Flash-Cache attends prompt, answer and end-of-text padding (8 + 8 + 16 here): its G counts
    the padding, so the baseline does too, and the share is one minus the hit rate (issue 59)."""
    steps = [{"g": 32}, {"g": 10, "reads": 22}, {"g": 9, "reads": 23}]
    verdict = lessons.cache_saves_verdict(_trace(steps, prompt_ids=range(8), gen_length=8,
                                                 settings={"cache": "flash", "gen_length": 8}))
    assert verdict.status == lessons.HOLDS and verdict.numbers["g_without_cache"] == 96
    assert verdict.text.endswith(f"{51 / 96:.0%} of that")


def test_the_answer_check_reads_the_task_and_the_most_parallel_step():
    steps = [{"committed": [[2, 5, 0.6], [3, 6, 0.4], [4, END, 0.9], [5, END, 0.9]]}]
    bad = _trace(steps, prompt=POKER, text="straight house", final_ids=[5, 6, END, END])
    verdict = lessons.answer_verdict(bad)
    assert verdict.claim == "The answer is valid" and verdict.status == lessons.FAILS
    assert verdict.numbers == {"verdict": "invalid", "most_content_in_one_step": 2, "at_step": 0}
    assert lessons.answer_verdict({**bad, "text": "full house"}).status == lessons.HOLDS
    off = lessons.answer_verdict({**bad, "prompt": "What is the capital of France?"})
    assert off.status == lessons.UNMEASURABLE and "none of the tiny tasks" in off.text
    assert lessons.answer_verdict({**bad, "final_ids": []}).status == lessons.UNMEASURABLE


def test_one_rule_grades_every_model_on_the_tasks_it_was_trained_on_and_no_random_checkpoint():
    steps = [{"committed": [[2, 5, 0.6], [3, 6, 0.4], [4, END, 0.9], [5, END, 0.9]]}]
    run = _trace(steps, prompt=POKER, text="straight house", final_ids=[5, 6, END, END])

    def told(**model):
        return lessons.answer_verdict({**run, "model": {**run["model"], **model}})
    assert told(name="tiny", trained_tasks=["arithmetic", "poker"]).status == lessons.FAILS  # ours, trained on poker
    narrow = told(name="tiny-block", trained_tasks=["arithmetic"])
    assert narrow.status == lessons.UNMEASURABLE
    assert narrow.text.endswith("the prompt is none of the tasks tiny-block was trained on (arithmetic)")
    random = told(name="tiny-sdar", trained_tasks=[])
    assert random.status == lessons.UNMEASURABLE and "tiny-sdar is a random checkpoint, trained on no task" in random.text
    assert lessons.answer_verdict(run).status == lessons.FAILS  # a model we did not make: any task prompt


def test_verification_counts_sent_back_and_revised_drafts_by_step():
    trace = _trace([{"policy": {"rejected_at": [[2, 5, 0.01], [3, 6, 0.02]]}}, {"revoked": [[4, 7, 0.5, 0.1]]}],
                   settings={"cache": "dual", "unmask": "self_verify"})
    verdict = lessons.verification_verdict(trace)
    assert verdict.status == lessons.HOLDS
    assert verdict.numbers == {"sent_back": 2, "sent_back_steps": [0], "revised": 1, "revised_steps": [1]}
    assert "2 drafts sent back at step 0; 1 committed token revised at step 1" in verdict.text
    quiet = _trace([{}], settings={"cache": "dual", "unmask": "self_verify"})
    assert lessons.verification_verdict(quiet).status == lessons.FAILS
    assert lessons.verification_verdict(_trace([{}])) is None


def test_theorem1_is_told_for_what_a_step_kept_and_names_the_drafts_sent_back_apart():
    # Kept: two commits at 0.95 (3 × 0.05 = 0.15, guaranteed). Drafted: also position 4, sent back
    # by self-verify, at 0.5 this step: n = 3, ε = 0.5, 4ε = 2 > 1, no guarantee for the drafts.
    trace = _trace([{"committed": [[2, 5, 0.95], [3, 6, 0.95]], "masked_positions": [2, 3, 4, 5],
                     "masked_confidence": [0.95, 0.95, 0.5, 0.2], "policy": {"rejected_at": [[4, 7, 0.01]]}}])
    verdict = lessons.theorem1_verdict(trace, 0)
    assert verdict.status == lessons.HOLDS and verdict.numbers["n"] == 2
    assert verdict.numbers["bound"] == pytest.approx(0.15)
    assert verdict.numbers["drafts_without_guarantee"] == [{"step": 0, "drafted": 3, "sent_back": 1,
                                                            "bound": pytest.approx(2.0)}]
    assert "step 0 drafted 3 positions, with no guarantee together ((n+1)ε = 2.00 > 1): self-verify sent 1 back" \
        in verdict.text
