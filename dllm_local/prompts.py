"""Prompts as model input: chat messages through the model's chat template, with typed special
tokens kept as text so that a prompt can neither plant masks nor forge turns."""
from __future__ import annotations

import ctypes
import re
import threading
from typing import Any, Protocol

from .errors import DllmError, SettingsError

Prompt = str | list[dict]
ROLES = ("system", "user", "assistant")
# A chat template renders in milliseconds; jinja's sandbox bounds each range() but not loops inside
# loops, so one that runs longer than this never ends.
TEMPLATE_SECONDS = 2.0


class HasTokenizer(Protocol):
    """What encoding reads of a loaded model (the loader's ModelHandle): its tokenizer, a
    transformers tokenizer with a chat template or none."""

    @property
    def tokenizer(self) -> Any: ...


def encode_prompt(handle: HasTokenizer, prompt: Prompt) -> list[int]:
    """Prompt ids through the model's chat template (multi-turn messages work). Special tokens
    typed in a message (``<|mdm_mask|>``, ``<|eot_id|>``) are plain text: only the template's own
    markers become control tokens, so a prompt can neither plant masks nor forge turns."""
    messages = _messages(prompt)
    tok = handle.tokenizer
    if not tok.chat_template:
        return _text_ids(tok, "\n".join(m["content"] for m in messages))
    text = render_chat(tok, messages)
    ids, start = [], 0
    for begin, end, token_id in _template_markers(tok, messages, text):
        ids += _text_ids(tok, text[start:begin]) + [token_id]
        start = end
    return ids + _text_ids(tok, text[start:])


class _Stopped(Exception):
    """Raised inside a chat template's rendering that ran past TEMPLATE_SECONDS, to end it."""


def render_chat(tok: Any, messages: list[dict]) -> str:
    """``messages`` through ``tok``'s chat template with the generation prompt, as text, within
    TEMPLATE_SECONDS. It renders in a worker thread; one still rendering then is stopped (an
    exception raised in it, which a template's Python loop meets at once) and refused here. The
    template's own errors are raised as they are."""
    done: dict[str, Any] = {}

    def work() -> None:
        try:
            done["text"] = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, whatever it is
            done["error"] = exc

    worker = threading.Thread(target=work, name="chat-template", daemon=True)
    worker.start()
    worker.join(TEMPLATE_SECONDS)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_Stopped))
        raise DllmError(f"the chat template did not finish rendering in {TEMPLATE_SECONDS:g} s (it loops without "
                        "end, or nearly); fix it (chat_template.jinja, or chat_template in tokenizer_config.json)")
    if "error" in done:
        raise done["error"]
    return done["text"]


def _messages(prompt: object) -> list[dict]:
    """The prompt as chat messages, checked here so that a wrong type is a SettingsError rather
    than an error deep inside the chat template."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)):
        messages = list(prompt)
    else:
        raise SettingsError(f"prompt must be text or a list of messages {{'role': ..., 'content': ...}}, "
                            f"not {type(prompt).__name__}")
    for n, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise SettingsError(f"message {n} must be a dict with 'role' and 'content', not {type(message).__name__}")
        # A fixed set: a role is template text, so any other (one with special-token text) forges turns.
        if message.get("role") not in ROLES:
            raise SettingsError(f"message {n}'s 'role' must be one of {', '.join(ROLES)}, not {message.get('role')!r:.60}")
        content = message.get("content")
        if not isinstance(content, str):
            given = "none" if content is None else type(content).__name__
            raise SettingsError(f"message {n} needs a 'content' as text, not {given}")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SettingsError(f"message {n} is not valid Unicode text (character {exc.start + 1} is a lone "
                                "surrogate, half of a character): paste it again from its source") from None
    if not any(m["content"].strip() for m in messages):
        raise SettingsError("prompt is empty: type a question or message")
    return messages


def _text_ids(tok, text: str) -> list[int]:
    """Ids of ``text`` with special-token strings split into ordinary tokens."""
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []


def _control_tokens(tok, text: str) -> list[tuple[int, int, int]]:
    """``(start, end, id)`` of each special token the tokenizer finds in ``text``."""
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return [(a, b, i) for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i in special]


# Private-use characters stand for each message's content: no tokenizer has them in a special token.
_SLOT = re.compile("\ue000(\\d+)\ue001")


def _template_markers(tok, messages: list[dict], text: str) -> list[tuple[int, int, int]]:
    """The special tokens of the rendered ``text`` that the chat template wrote. The template is
    rendered once more with a slot for each content; the special tokens of ``text``, in order,
    are then the template's (between slots) and the typed ones (in each content), by count,
    which holds whatever the template does to the content (LLaDA's trims it)."""
    slots = [{**m, "content": f"\ue000{n}\ue001"} for n, m in enumerate(messages)]
    parts = _SLOT.split(render_chat(tok, slots))
    from_template: list[bool] = []
    for k, part in enumerate(parts):  # template text, slot number, template text, ...
        source = messages[int(part)]["content"] if k % 2 else part
        from_template += [k % 2 == 0] * len(_control_tokens(tok, source))
    found = _control_tokens(tok, text)
    if len(found) != len(from_template):
        raise SettingsError("the prompt's special-token text runs into the chat template's markers; "
                            "remove the <|...|> markup from the prompt")
    return [token for token, ours in zip(found, from_template) if ours]
