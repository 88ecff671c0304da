"""The synthetic task suite the tiny models are trained and scored on.

Every generator is deterministic by seed and every task has a scorer. The tasks are chosen so
that what the page teaches really happens: arithmetic is the accuracy benchmark (GSM8K's role
for the real models), the conflict tasks have several equally valid multi-token answers whose
tokens only fit together (parallel decoding writes "straight house" there), and records mix easy
boilerplate with content copied from the prompt.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from ..errors import SettingsError
from ..values import integer, read

NAMES = [
    "Alice", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Henry", "Ivy", "Jack", "Kate", "Leo",
    "Mia", "Noah", "Olivia", "Paul", "Rosa", "Sam", "Tina", "Victor", "Wendy", "Omar", "Lena", "Hugo",
]
ITEMS = ["apples", "books", "coins", "pencils", "stamps", "marbles", "cookies", "cards", "shells", "stickers"]
CITIES = ["Paris", "Berlin", "Tokyo", "Lima", "Cairo", "Oslo", "Rome", "Seoul", "Dublin", "Madrid", "Boston", "Delhi"]
JOBS = ["teacher", "doctor", "pilot", "farmer", "baker", "painter", "nurse", "chef", "writer", "driver"]
# Skewed so that the most likely first word ("straight", 0.29 + 0.29 = 0.58) and the most likely
# second word ("house", 0.42; "flush" and the end of text 0.29 each) come from different hands: one
# greedy forward over both words writes "straight house", a hand that does not exist. One word at
# a time stays valid. 0.42 keeps both argmaxes clear of the runner-up (0.58 vs 0.42, 0.42 vs 0.29).
# Every word is one token of the tiny tokenizer, so words are positions.
POKER_HANDS = {"full house": 0.42, "straight flush": 0.29, "straight": 0.29}

TASKS = ("arithmetic", "poker", "sums", "records")


@dataclass(frozen=True)
class Example:
    task: str
    kind: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


def _arithmetic(rng: random.Random) -> Example:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    # Subtraction is the inverse of the addition table (subtrahend and result both at most 10),
    # shared by the one-step and two-step problems, so its ~110 facts are seen as often as
    # addition's; a wider table (minuend to 20, any subtrahend) was not learned in the budget.
    kind = rng.choices(["add", "sub", "mul", "add_sub", "mul_add"], weights=[1.5, 2.5, 1.5, 3, 1.5])[0]
    if kind == "add":
        a, b = rng.randint(1, 10), rng.randint(1, 10)
        prompt = rng.choice([
            f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?",
            f"A box has {a} {item} and a bag has {b}. How many {item} in all?",
        ])
        work, result = f"{a} + {b} = {a + b}.", a + b
    elif kind == "sub":
        b = rng.randint(1, 10)
        a = b + rng.randint(0, 10)
        prompt = rng.choice([
            f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
            f"A shop had {a} {item} and sold {b}. How many are left?",
        ])
        work, result = f"{a} - {b} = {a - b}.", a - b
    elif kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        prompt = rng.choice([
            f"{name} buys {a} bags with {b} {item} in each bag. How many {item} does {name} buy?",
            f"There are {a} rows of {item} with {b} in each row. How many {item} are there?",
        ])
        work, result = f"{a} * {b} = {a * b}.", a * b
    elif kind == "add_sub":
        a, b = rng.randint(1, 10), rng.randint(1, 10)
        c = rng.randint(max(1, a + b - 10), min(10, a + b))
        prompt = f"{name} has {a} {item}, finds {b} more, then gives away {c}. How many now?"
        work, result = f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}.", a + b - c
    else:
        a, b, c = rng.randint(2, 5), rng.randint(2, 5), rng.randint(1, 10)
        prompt = f"{name} has {a} boxes of {b} {item} and {c} loose {item}. How many in all?"
        work, result = f"{a} * {b} = {a * b}. {a * b} + {c} = {a * b + c}.", a * b + c
    return Example("arithmetic", kind, prompt, f"{work} The answer is {result}.", {"result": result})


def _poker(rng: random.Random) -> Example:
    name = rng.choice(NAMES)
    prompt = rng.choice([
        f"{name} is playing cards. Name a poker hand {name} could hold.",
        f"Name one poker hand that {name} might have.",
        f"{name} asks for the name of a poker hand. Give one.",
    ])
    hand = rng.choices(list(POKER_HANDS), weights=list(POKER_HANDS.values()))[0]
    return Example("poker", "poker", prompt, hand)


def _sums(rng: random.Random) -> Example:
    name, total = rng.choice(NAMES), rng.randint(5, 10)
    a = rng.randint(1, total - 1)
    prompt = rng.choice([
        f"{name} wants two numbers that add to {total}. Give one pair.",
        f"Give two numbers whose sum is {total}.",
    ])
    # Written as an equation ending in the total: the second number then follows from the first
    # by the addition facts the arithmetic task teaches ("4 + ? = 9"), which the model learns far
    # better than recalling the total from the prompt ("4 and ?" reached 32% one per step).
    return Example("sums", "sums", prompt, f"{a} + {total - a} = {total}", {"total": total})


def _records(rng: random.Random) -> Example:
    name, city, job = rng.choice(NAMES), rng.choice(CITIES), rng.choice(JOBS)
    age = rng.randint(18, 89)
    facts = [f"{name} is {age} years old.", f"{name} lives in {city}.", f"{name} works as a {job}."]
    rng.shuffle(facts)
    prompt = "Make a record from these facts. " + " ".join(facts)
    answer = f'{{"name": "{name}", "age": {age}, "city": "{city}", "job": "{job}"}}'
    return Example("records", "records", prompt, answer, {"name": name, "age": age, "city": city, "job": job})


_GENERATORS = {"arithmetic": _arithmetic, "poker": _poker, "sums": _sums, "records": _records}


MAX_PROBLEMS = 100_000  # a task set's size: GSM8K's test set is 1,319
_PROBLEM_COUNT = TypeAdapter(integer(1, MAX_PROBLEMS))


def check_task(task: str, n: int) -> int:
    """``n`` when ``task`` is one of ours and ``n`` a size a set may have; raises naming the rule."""
    if task not in _GENERATORS:
        raise SettingsError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    # Scores are shares of n: an empty set has none. The set is built whole, so its size is bounded.
    return read(_PROBLEM_COUNT, n, "the number of problems n")


def make_problems(task: str, n: int, seed: int) -> list[Example]:
    """``n`` examples of ``task``, the same for the same seed."""
    n = check_task(task, n)
    rng = random.Random(f"{task}:{seed}")
    return [_GENERATORS[task](rng) for _ in range(n)]


_ANSWER = re.compile(r"The answer is (-?\d+)")
_PAIR = re.compile(r"^\s*(\d+) \+ (\d+) = (\d+)\s*$")
_FIELD = re.compile(r'"(name|age|city|job)":\s*("([^"]*)"|(\d+))')


def score(example: Example, output: str) -> bool:
    """Whether ``output`` (the decoded answer, EOS and after removed) solves ``example``."""
    if example.task == "arithmetic":
        m = _ANSWER.search(output)
        return bool(m) and int(m.group(1)) == example.meta["result"]
    if example.task == "poker":
        return output.strip() in POKER_HANDS
    if example.task == "sums":
        m = _PAIR.match(output)
        if not m:
            return False
        a, b, total = map(int, m.groups())
        return a > 0 and b > 0 and a + b == total == example.meta["total"]
    if example.task == "records":
        fields = {k: (s if s else int(d)) for k, _, s, d in _FIELD.findall(output)}
        want = {k: example.meta[k] for k in ("name", "age", "city", "job")}
        return fields == want and output.strip().startswith("{") and output.strip().endswith("}")
    raise ValueError(f"unknown task {example.task!r}")


# The arithmetic prompts' templates (see _arithmetic) read back: numbers in, the result out.
_N = r"(\d+)"
_ARITHMETIC_PROMPTS = [
    (rf"has {_N} [a-z]+\. \w+ gets {_N} more", lambda a, b: a + b),
    (rf"A box has {_N} [a-z]+ and a bag has {_N}", lambda a, b: a + b),
    (rf"has {_N} [a-z]+ and gives away {_N}", lambda a, b: a - b),
    (rf"A shop had {_N} [a-z]+ and sold {_N}", lambda a, b: a - b),
    (rf"buys {_N} bags with {_N} [a-z]+ in each", lambda a, b: a * b),
    (rf"There are {_N} rows of [a-z]+ with {_N} in each", lambda a, b: a * b),
    (rf"has {_N} [a-z]+, finds {_N} more, then gives away {_N}", lambda a, b, c: a + b - c),
    (rf"has {_N} boxes of {_N} [a-z]+ and {_N} loose", lambda a, b, c: a * b + c),
]
_SUM_PROMPT = re.compile(r"(?:add to|sum is) (\d+)")
_RECORD_FACTS = re.compile(r"(\w+) is (\d+) years old\.|(\w+) lives in (\w+)\.|(\w+) works as an? (\w+)\.")


def recognise(prompt: str) -> Example | None:
    """The task problem a prompt poses, when it is one of the suite's (typed in by hand or taken
    from a preset), with what its scorer needs; None for any other prompt."""
    if "poker hand" in prompt:
        return Example("poker", "poker", prompt, "")
    m = _SUM_PROMPT.search(prompt)
    if m and "numbers" in prompt:
        return Example("sums", "sums", prompt, "", {"total": int(m.group(1))})
    if prompt.startswith("Make a record from these facts."):
        meta: dict = {}
        for age_name, age, city_name, city, job_name, job in _RECORD_FACTS.findall(prompt):
            if age:
                meta.update(name=age_name, age=int(age))
            elif city:
                meta["city"] = city
            elif job:
                meta["job"] = job
        return Example("records", "records", prompt, "", meta) if len(meta) == 4 else None
    for pattern, result in _ARITHMETIC_PROMPTS:
        m = re.search(pattern, prompt)
        if m:
            return Example("arithmetic", "arithmetic", prompt, "", {"result": result(*map(int, m.groups()))})
    return None


def verdict(prompt: str, answer: str) -> str | None:
    """"right"/"wrong" (arithmetic, records) or "valid"/"invalid" (poker, sums) for an answer to a
    task prompt; None when the prompt is not one of the task suite's."""
    problem = recognise(prompt)
    if problem is None:
        return None
    ok = score(problem, answer)
    if problem.task in ("poker", "sums"):
        return "valid" if ok else "invalid"
    return "right" if ok else "wrong"


MIX = {"arithmetic": 0.68, "poker": 0.07, "sums": 0.11, "records": 0.14}


def training_mix(n: int, seed: int, weights: dict[str, float] | None = None) -> list[Example]:
    """The training data: a fixed mix (``MIX`` unless ``weights`` are given) weighted towards
    arithmetic's harder two-step problems."""
    rng = random.Random(f"mix:{seed}")
    weights = weights or MIX
    tasks = rng.choices(list(weights), weights=list(weights.values()), k=n)
    return [_GENERATORS[t](rng) for t in tasks]
