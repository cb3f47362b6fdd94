"""History processors: what of the conversation the policy is shown at each turn.

A history processor is any callable ``processor(messages) -> messages`` over ``{"role", "content"}`` dicts: the whole
conversation so far (system message, task, then assistant and user turns) in, the messages the policy should see
out. The env keeps the whole conversation regardless (``conversation`` in the tensordict); the processor only shapes
the prompt, in every input mode. It must not modify the dicts it is given: return new ones for the messages it
changes and the given ones, as they are, for the messages it keeps (the chain recognises kept messages by identity,
which is what keeps a step's cost flat as the conversation grows).

A processor that counts tokens may define ``set_tokenizer(tokenizer)``: the chain calls it with the env's tokenizer
(``make(..., tokenizer=...)``) when there is one.

- ``full``: everything, unchanged (the default, and what TorchRL's MLGym chain does).
- ``last_n_observations``: the task and the last ``n`` (5) user messages in full; each older user message is replaced
  by a one-line note of how long it was (the behaviour of MLGym's default agent, ``Last5Observations``).
- ``token_budget``: the system message, the task and as many of the latest turns as fit in ``max_tokens``; the
  oldest turns are dropped a few at a time, and the task message says how many were left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Message = dict[str, str]
"""One chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""


class FullHistory:
    """Every message, unchanged: the policy sees the whole conversation."""

    keeps_all = True
    """Tells the chain that this processor never changes anything, so it can skip the processing stage."""

    def __call__(self, messages: Sequence[Message]) -> list[Message]:
        """Return ``messages`` as they are."""
        return list(messages)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LastNObservations:
    """The first user message (the task) and the last ``n`` user messages in full; older user messages become a
    one-line note saying how many lines were hidden. System and assistant messages are always kept."""

    def __init__(self, n: int = 5):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"LastNObservations(n={n!r}): n must be an integer >= 1 (the user messages shown in full)")
        self.n = n
        self._notes: dict[str, Message] = {}

    def note(self, content: str) -> Message:
        """The message that stands in for an older user message of ``content``; the same object each time."""
        note = self._notes.get(content)
        if note is None:
            lines = content.count("\n") + 1
            note = {"role": "user", "content": f"(Earlier output hidden to save space: {lines} "
                                               f"line{'s' if lines != 1 else ''}.)"}
            if len(self._notes) > 10_000:  # one episode's worth is plenty; stale ones only cost memory
                self._notes.clear()
            self._notes[content] = note
        return note

    def __call__(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` with every user message but the first and the last ``n`` replaced by a note."""
        users = [index for index, message in enumerate(messages) if message["role"] == "user"]
        hidden = users[1:-self.n] if len(users) > self.n + 1 else []
        if not hidden:
            return list(messages)
        out = list(messages)
        for index in hidden:
            out[index] = self.note(messages[index]["content"])
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n})"


class TokenBudget:
    """The system message, the task and the latest turns that fit in ``max_tokens``.

    When the conversation is over budget, the oldest turns (an assistant reply and the user message after it) are
    dropped, ``drop_step`` turns at a time so that the prompt's beginning stays the same for several turns (a
    prompt that changes near its start must be rendered and tokenised again). The task message then ends with a
    note of how many turns were left out. Tokens are counted with ``tokenizer`` (a tokenizer object, or the env's
    when the chain is given one), plus ``per_message`` tokens of chat-template overhead per message; without a
    tokenizer, one token per ``chars_per_token`` characters. The latest turn is always kept, even alone over budget.
    """

    def __init__(self, max_tokens: int = 8192, tokenizer: Any = None, *, drop_step: int = 4, per_message: int = 8,
                 chars_per_token: float = 4.0):
        for name, value in (("max_tokens", max_tokens), ("drop_step", drop_step)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TokenBudget({name}={value!r}): {name} must be an integer >= 1")
        self.max_tokens = max_tokens
        self.tokenizer = tokenizer
        self.drop_step = drop_step
        self.per_message = per_message
        self.chars_per_token = chars_per_token
        self._counts: dict[str, int] = {}
        self._notes: dict[tuple[str, int], Message] = {}

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Count with the env's ``tokenizer`` unless one was given to the constructor."""
        if self.tokenizer is None and tokenizer is not None:
            self.tokenizer = tokenizer
            self._counts.clear()

    def count(self, message: Message) -> int:
        """The tokens ``message`` takes in the prompt (its content's, plus the per-message overhead)."""
        content = message["content"]
        tokens = self._counts.get(content)
        if tokens is None:
            if self.tokenizer is not None:
                tokens = len(self.tokenizer(content, add_special_tokens=False)["input_ids"])
            else:
                tokens = math.ceil(len(content) / self.chars_per_token)
            if len(self._counts) > 50_000:
                self._counts.clear()
            self._counts[content] = tokens
        return tokens + self.per_message

    def _task_with_note(self, task: Message, dropped: int) -> Message:
        key = (task["content"], dropped)
        note = self._notes.get(key)
        if note is None:
            text = f"{task['content']}\n\n({dropped} earlier turn{'s' if dropped != 1 else ''} of this episode " \
                   "left out to fit the context.)"
            note = {"role": task["role"], "content": text}
            if len(self._notes) > 1_000:
                self._notes.clear()
            self._notes[key] = note
        return note

    def __call__(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` cut to the budget: head (system, task) plus the latest turns that fit."""
        head = 2 if len(messages) >= 2 and messages[0]["role"] == "system" else 1
        if len(messages) <= head:
            return list(messages)
        room = self.max_tokens - sum(self.count(m) for m in messages[:head])
        # walk back from the end only as far as the budget reaches: a step costs the same at turn 10 and turn 500
        start = len(messages)
        while start > head:
            room -= self.count(messages[start - 1])
            if room < 0:
                break
            start -= 1
        if start == head:
            return list(messages)
        # whole turns (an assistant reply and the user message after it), rounded up to drop_step, latest one kept
        needed = math.ceil((start - head) / 2)
        turns = min(math.ceil(needed / self.drop_step) * self.drop_step, (len(messages) - head) // 2 - 1)
        if turns <= 0:
            return list(messages)
        cut = head + 2 * turns
        out = list(messages[:head])
        out[-1] = self._task_with_note(messages[head - 1], turns)
        out.extend(messages[cut:])
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_tokens={self.max_tokens})"
