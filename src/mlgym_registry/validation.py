"""Checks of ``registry.make()`` options and of the CLI's values, made before anything is built.

A value of the wrong type or out of range would otherwise pass ``make()`` and break the episode later, at reset or
at a step, far from where it was given. Each check here names the option, the value it got and the valid range.

The rules go by option name, whichever backend takes the option (``seed`` is a seed for every backend); an option
without a rule is passed on unchecked. Nothing here imports torch: ``registry.make`` runs these checks first.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import MLGymRegistryError


class InvalidOptionError(MLGymRegistryError, ValueError):
    """An option whose value has the wrong type or is out of range; the message names the option and the range."""


class UnknownOptionError(MLGymRegistryError, TypeError):
    """A backend option that the task's backend does not take."""

    def __init__(self, backend: str, unknown: Iterable[str], valid: Iterable[str]):
        self.backend = backend
        self.unknown = sorted(unknown)
        self.valid = sorted(valid)
        names = []
        for name in self.unknown:
            close = difflib.get_close_matches(name, self.valid, n=1)
            names.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
        super().__init__(
            f"unknown backend option(s) {', '.join(names)} for backend {backend!r}; "
            f"it takes: {', '.join(self.valid) or 'no options'}"
        )


@dataclass(frozen=True)
class Rule:
    """What values an option accepts: ``accepts(value)`` and the words that say so (``"an integer >= 1"``)."""

    description: str
    accepts: Callable[[Any], bool]
    optional: bool = False

    def check(self, name: str, value: Any) -> None:
        """Raise ``InvalidOptionError`` naming ``name`` unless ``value`` is valid."""
        if value is None and self.optional:
            return
        if value is None or not self.accepts(value):
            expected = self.description + (" or None" if self.optional else "")
            raise InvalidOptionError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")


def is_integer(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for a finite ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer_at_least(low: int, *, optional: bool = False) -> Rule:
    """Integers ``>= low``."""
    return Rule(f"an integer >= {low}", lambda value: is_integer(value) and value >= low, optional)


def positive_number(*, optional: bool = False) -> Rule:
    """Finite numbers ``> 0`` (seconds)."""
    return Rule("a number > 0", lambda value: is_number(value) and value > 0, optional)


def instance_of(description: str, *types: type, optional: bool = False) -> Rule:
    """Values of one of ``types``."""
    return Rule(description, lambda value: isinstance(value, types), optional)


def is_batch_size(value: Any) -> bool:
    """True for ``()`` or a shape (a tuple, list or ``torch.Size`` of 1s; an int 1) with exactly one element."""
    if is_integer(value):
        return value == 1
    if not isinstance(value, (tuple, list)):
        return False
    return all(is_integer(dim) and dim == 1 for dim in value)


def is_outcome_action(value: Any) -> bool:
    """True for an ``on_length=``/``on_overflow=`` value: ``"record"``, ``"mask"``, ``"end"``, a finite number (a
    penalty), or a non-empty tuple or list of those (``transforms.context_policy``)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    return bool(items) and all(item in ("record", "mask", "end") if isinstance(item, str) else is_number(item)
                               for item in items)


TEXT = instance_of("a string", str)
BOOLEAN = instance_of("a bool (True or False)", bool)

OPTION_RULES: dict[str, Rule] = {
    # the task spec (make's max_steps=, the spec's own fields)
    "max_steps": integer_at_least(1),
    "training_timeout": positive_number(optional=True),
    "failure_reward": Rule("a finite number", is_number, optional=True),
    "score_format_exit": BOOLEAN,
    # backend options (the local backend's, and any other backend's of the same name)
    "command_timeout": positive_number(),
    "long_timeout": positive_number(optional=True),
    "max_output_chars": integer_at_least(1),
    "memory_limit_mb": integer_at_least(1, optional=True),
    "cpu_seconds": integer_at_least(1, optional=True),
    "max_processes": integer_at_least(1, optional=True),
    "max_file_mb": integer_at_least(1, optional=True),
    "max_snapshot_mb": integer_at_least(1, optional=True),
    "max_disk_mb": integer_at_least(1, optional=True),
    "seed": integer_at_least(0, optional=True),
    "network": BOOLEAN,
    "sandbox": Rule("'bwrap' or 'none'", lambda value: value in ("bwrap", "none")),
    "workspace_dir": instance_of("a folder path", str, os.PathLike, optional=True),
    "python": instance_of("an interpreter path", str, os.PathLike, optional=True),
    "data_dir": instance_of("a folder path", str, os.PathLike, optional=True),
    "gpus": BOOLEAN,
    "trust_agent_code": BOOLEAN,
    # the chain
    "chat_template_name": instance_of("a string", str, optional=True),
    "reward_wrong_format": Rule("a number", is_number, optional=True),
    "input_mode": Rule("'history', 'text' or 'tokens'", lambda value: value in ("history", "text", "tokens")),
    "max_format_errors": integer_at_least(1, optional=True),
    "max_turns": integer_at_least(1, optional=True),
    "max_turn_tokens": integer_at_least(1, optional=True),
    "max_episode_tokens": integer_at_least(1, optional=True),
    "context_window": integer_at_least(1, optional=True),
    "max_observation_chars": integer_at_least(1, optional=True),
    **{name: Rule("'record', 'mask', 'end', a finite number (a penalty) or a tuple of those",
                  lambda value: is_outcome_action(value)) for name in ("on_length", "on_overflow")},
    "batch_size": Rule(
        "a shape of one element ((1,), the default; (1, 1), ...) or () for the chain's unbatched tensordicts",
        lambda value: is_batch_size(value),
        optional=True,
    ),
    # component names
    **{kind: TEXT for kind in ("backend", "parser", "template", "reward", "isolator", "history")},
}
"""The rule of every option this package knows the type and range of, by name."""


def check_option(name: str, value: Any) -> None:
    """Raise ``InvalidOptionError`` when ``name`` has a rule that ``value`` breaks (unknown names pass)."""
    rule = OPTION_RULES.get(name)
    if rule is not None:
        rule.check(name, value)


def check_backend_option_mapping(options: Any) -> None:
    """``backend_options=`` must be a mapping of option names to values, each valid."""
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        raise InvalidOptionError(
            f"backend_options must be a dict of option names to values, got {options!r} ({type(options).__name__})"
        )
    for key, value in options.items():
        check_option(key, value)


def validate_overrides(overrides: Mapping[str, Any]) -> None:
    """Check the keyword overrides of ``registry.make()`` / ``resolve()`` (names are checked later, by resolve)."""
    for name, value in overrides.items():
        if name == "backend_options":
            check_backend_option_mapping(value)
        else:
            check_option(name, value)


def validate_task_options(spec: Any, backend_options: Mapping[str, Any], accepted: set[str] | None) -> None:
    """Check a resolved task: its ``max_steps`` and ``training_timeout``, and the options its backend will get.

    ``accepted`` is the set of option names the backend takes (None when it takes any keyword).
    """
    check_option("max_steps", spec.max_steps)
    check_option("training_timeout", spec.training_timeout)
    check_option("failure_reward", getattr(spec, "failure_reward", None))
    check_option("score_format_exit", getattr(spec, "score_format_exit", False))
    worst = getattr(spec, "worst_score", None) or {}
    if not isinstance(worst, Mapping) or not all(isinstance(k, str) and is_number(v) for k, v in worst.items()):
        raise InvalidOptionError(
            f"task {spec.id!r}: worst_score must map metric names to finite numbers (e.g. {{'Score': 0.0}}), "
            f"got {worst!r}"
        )
    if accepted is not None:
        unknown = set(backend_options) - accepted
        if unknown:
            raise UnknownOptionError(spec.backend, unknown, accepted)
    check_backend_option_mapping(backend_options)


def cli_integer(low: int) -> Callable[[str], int]:
    """An ``argparse`` type: an integer ``>= low`` (argparse turns the error into a one-line usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse
