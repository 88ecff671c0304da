"""In a lab the lecture never waits behind the class: with every slot of the engine's batch held
by students, a lecturer's run takes the slot kept for it and starts at the batch's next step,
while the students decode on, each with the tokens it gets alone."""
from __future__ import annotations

import multiprocessing
import threading

from dllm_local import Settings, generate
from dllm_local.decoding.batch import BatchRun

STUDENTS = {"student1": ("Deal a poker hand and name it.", Settings(gen_length=96, block_size=8, seed=1)),
            "student2": ("What is 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11?", Settings(gen_length=96, block_size=8, seed=2))}
LECTURE = ("What is 12 + 7?", Settings(gen_length=16, block_size=8, seed=3))


def test_a_lecturers_run_starts_within_one_batch_step_though_students_hold_every_slot(tiny):
    from dllm_local.serving.engine import serve

    page, engine_end = multiprocessing.Pipe()
    spec = {"model": "tiny", "threads": 1, "slots": 2, "lecture_slots": 1}
    loop = threading.Thread(target=serve, args=(engine_end, threading.Event(), spec), daemon=True)
    loop.start()
    assert page.recv()[1] == "ready"
    for request_id, (prompt, settings) in STUDENTS.items():
        page.send((request_id, "run", {"prompt": prompt, "settings": settings.to_dict()}, {}))
    steps = dict.fromkeys([*STUDENTS, "lee"], 0)
    ends, ended, queued, asked = {}, set(), [], False
    since_lee_joined: dict[str, int] | None = None  # students' steps from the lecturer's header to its first step
    ended_by_lees_first = None
    while len(ended) < len(steps):
        request_id, kind, payload = page.recv()
        if kind == "end":
            ended.add(request_id)
        elif kind == "error":
            raise payload
        elif "queued" in payload:
            queued.append(request_id)
        elif "step" in payload:
            steps[request_id] += 1
            if request_id == "lee" and ended_by_lees_first is None:
                ended_by_lees_first = sorted(ended)
            elif since_lee_joined is not None and ended_by_lees_first is None:
                since_lee_joined[request_id] += 1
            if not asked and min(steps[k] for k in STUDENTS) >= 2:  # both students decoding: the lecturer clicks Run
                page.send(("lee", "run", {"prompt": LECTURE[0], "settings": LECTURE[1].to_dict()}, {"first": True}))
                asked = True
        elif "end" in payload:
            ends[request_id] = payload["end"]
        elif request_id == "lee":  # its header, sent as it takes a slot
            since_lee_joined = dict.fromkeys(STUDENTS, 0)
    page.send((None, "close", {}, {}))
    loop.join(10)
    assert "lee" not in queued  # never told a place in line
    assert ended_by_lees_first == []  # its first step came before either student ended
    # The step the lecturer joined during, then the next one, which it shares: at most two of each student's.
    assert max(since_lee_joined.values()) <= 2, since_lee_joined
    assert steps["student1"] > 10 and steps["student2"] > 10
    for request_id, (prompt, settings) in [*STUDENTS.items(), ("lee", LECTURE)]:
        assert ends[request_id]["final_ids"] == generate(tiny, prompt, settings).trace.final_ids, request_id


def test_the_reserved_slot_is_a_first_requests_only(tiny):
    settings = Settings(gen_length=32, block_size=8, seed=4)
    run = BatchRun(tiny, ["What is 12 + 7?", "hi"], settings, slots=2, max_len=96, reserved=1)
    first_forward: dict[int, int] = {}
    student = lecturer = None
    for i, _ in run:
        first_forward.setdefault(i, run.forwards)
        if student is None:
            student = run.add("Deal a poker hand and name it.", settings)
            assert run.free_slots == 0  # the student waits: the reserved slot is not its
            lecturer = run.add("What is 3 + 4?", settings, first=True)
            assert run.free_slots == 1  # the lecturer takes it at the next forward
    assert first_forward[lecturer] == 2 and first_forward[student] > first_forward[lecturer]
    for k, prompt in {student: "Deal a poker hand and name it.", lecturer: "What is 3 + 4?"}.items():
        assert run.results[k].token_ids == generate(tiny, prompt, settings).token_ids
