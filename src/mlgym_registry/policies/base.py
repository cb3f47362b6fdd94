"""What every policy is: a callable from the conversation so far to the model's next response text.

``policy(messages)`` receives the chat so far as a list of ``{"role", "content"}`` dicts (system, then alternating
user and assistant turns, ending with the user turn the model must answer) and returns the response text, exactly as
a model would produce it (a short discussion and one command, in the format the env's parser reads).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import MLGymRegistryError

Messages = Sequence[Mapping[str, Any]]


class PolicyExhausted(MLGymRegistryError):
    """The policy has no further response (a replayed trajectory ran out of recorded steps)."""


class PolicyError(MLGymRegistryError):
    """The policy cannot produce a response and retrying will not help (its model server is unreachable, refuses the
    key or does not serve the model); the message names the endpoint or the model, and the fix."""


@dataclass(frozen=True)
class Generation:
    """The tokens behind a response, as a model produced them: what a trainer reuses without re-tokenizing.

    ``prompt_tokens`` are the ids the model read, ``response_tokens`` the ids it sampled, ``log_probs`` (when the
    model gave them) the log-probability of each sampled id, and ``policy_version`` the version of the weights.
    """

    prompt_tokens: list[int]
    response_tokens: list[int]
    log_probs: list[float] | None = None
    policy_version: int | None = None


class Policy:
    """Base class of policies. Subclasses implement ``respond``; ``reset`` starts a new episode."""

    name = "policy"
    version: int | None = None
    """The version of the policy's weights (a trainer bumps it after each update), recorded with every turn; None
    for a policy without weights."""
    interactive = False
    """True when the policy talks to a person on the terminal (the CLI then prints instead of showing a bar)."""

    def reset(self, spec: Any = None) -> None:
        """Start a new episode of ``spec`` (a ``TaskSpec`` or None)."""

    def respond(self, messages: Messages) -> str:
        """The next response text for the conversation ``messages``."""
        raise NotImplementedError

    def __call__(self, messages: Messages) -> str:
        return self.respond(messages)

    def last_generation(self) -> Generation | None:
        """The token ids (and log-probs) of the last response, for a policy that runs a model itself; else None."""
        return None

    def last_call(self) -> dict[str, Any] | None:
        """What the model call behind the last response was, for a policy that calls a model server
        (``finish_reason``, ``model_seconds``, ``usage``); else None. The episode records it with the step."""
        return None

    def stats(self) -> dict[str, Any] | None:
        """Usage of the model in this episode (MLGym's ``model_stats``: calls, tokens, cost), or None when the policy
        keeps none. The episode records it in its ``info["model_stats"]``."""
        return None

    def close(self) -> None:
        """Release whatever the policy holds (models, files)."""


def fenced(discussion: str, command: str) -> str:
    """A response in MLGym's format: a discussion paragraph, then the command in a fenced block."""
    command = command if command.endswith("\n") else command + "\n"
    return f"DISCUSSION\n{discussion.strip()}\n```\n{command}```"


def last_user_message(messages: Messages) -> str:
    """The content of the last user turn ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


_FILE_HEADER = re.compile(r"^\[File: (?P<path>.+) \((?P<lines>\d+) lines total\)\]$", re.MULTILINE)
_REMAINING = re.compile(r"Remaining Steps: (\d+)\)")


def file_window(text: str) -> tuple[str, int] | None:
    """The path and line count of the last file window (``[File: <path> (<n> lines total)]``) in ``text``."""
    matches = list(_FILE_HEADER.finditer(text))
    if not matches:
        return None
    return matches[-1]["path"], int(matches[-1]["lines"])


def numbered_lines(text: str) -> dict[int, str]:
    """The ``<n>:<text>`` lines of the file window in ``text``, by line number."""
    lines: dict[int, str] = {}
    for match in re.finditer(r"^(\d+):(.*)$", text, re.MULTILINE):
        lines[int(match[1])] = match[2]
    return lines


def remaining_steps(text: str) -> int | None:
    """``Remaining Steps`` from the status block in ``text``, or None."""
    match = _REMAINING.search(text)
    return int(match[1]) if match else None
