"""What a step was, as the chain's action isolator found it: written into the step's output once (``layout.turn``),
read by everything that builds a turn from a step. Free of torch, so that its readers load without it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TurnFacts:
    """A step's facts, as the action isolator found them (under ``layout.turn`` in the step's output). Not a tuple:
    tensordict would turn a stack of tuples of strings into an array."""

    thought: str
    action: str
    """The command as the model gave it ('' when none ran; the backend ran the isolator's guarded form of it)."""
    format_error: str
    """The message of a reply without a usable command ('' when the reply was usable)."""


NO_FACTS = TurnFacts("", "", "")
"""The facts after a reset, before any step."""
