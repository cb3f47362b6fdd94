"""Conformance checks for history processors."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ._common import _fail, _name


def example_conversation(turns: int, output_lines: int = 3) -> list[dict[str, str]]:
    """A conversation as the chain gives it to a history processor: the system message, the task, then ``turns``
    turns (an assistant reply with a fenced command and the user message with its output)."""
    messages = [{"role": "system", "content": "You work alone in a shell. Reply with one command."},
                {"role": "user", "content": "TASK: write a strategy.\n(Current Step: 0, Remaining Steps: 50)"}]
    for turn in range(turns):
        output = "\n".join(f"turn {turn} output line {line}" for line in range(output_lines))
        messages.append({"role": "assistant", "content": f"DISCUSSION\nStep {turn}.\n```\nls -l\n```"})
        messages.append({"role": "user", "content": f"{output}\n(Current Step: {turn + 1}, Remaining Steps: "
                                                    f"{49 - turn})"})
    return messages


def check_history_processor(processor: Callable[[list[dict[str, str]]], Any]) -> None:
    """Check a history processor on conversations of 0 to 60 turns: it returns a non-empty list of ``{"role",
    "content"}`` dicts with known roles, ends with the latest message unchanged (the policy must see the output of its
    last command), leaves its input as it was, and gives the same view when asked twice."""
    from ..components.output_checks import bad_message

    what = f"history processor {_name(processor)}"
    for turns in (0, 1, 6, 60):
        messages = example_conversation(turns)
        before = copy.deepcopy(messages)
        try:
            shown = processor(list(messages))
        except Exception as exc:  # noqa: BLE001 - reported as the processor's failure
            _fail(what, f"raised {type(exc).__name__}: {exc} on a conversation of {turns} turns")
        if messages != before:
            _fail(what, "changed the messages it was given; return new dicts for the messages it changes")
        if not isinstance(shown, list) or not shown:
            _fail(what, f"returned {shown!r:.80} for {turns} turns; it must return a non-empty list of messages")
        bad = bad_message(shown)
        if bad is not None:
            _fail(what, f"message {bad[0]} is {bad[1]!r:.80}; each must be a {{'role', 'content'}} dict with role "
                        "system, user or assistant and str content")
        if shown[-1] != messages[-1]:
            _fail(what, f"does not end with the latest message ({turns} turns); the policy would not see the output "
                        "of its last command")
        if processor(list(messages)) != shown:
            _fail(what, "gave two different views of the same conversation")
