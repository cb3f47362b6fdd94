"""Options and their rules: what a value must be, who owns each option, and the checks ``registry.make`` runs
before anything is built.

A value of the wrong type or out of range would otherwise pass ``make()`` and break the episode later, at reset or
at a step, far from where it was given. Each check names the option, its owner, the value it got and the valid range.

Every option has one owner, which declares its rules once, beside its own code:

- the task spec and the component names, below (``SPEC_RULES``, ``COMPONENT_RULES``), and the episode seed that the
  episode runners take (``SEED``);
- the chain (``chain.CHAIN_OPTION_RULES``);
- each backend: its factory's ``option_rules`` attribute (the local backend's are ``backends.local.options``).

The core only routes a keyword to its owner and checks it with the owner's rules; a backend's options are its own,
so a third-party backend may take ``sandbox="docker"`` or ``memory_limit_mb=0.5`` whatever the local backend's rules
for those names say. Nothing here imports torch: ``registry.make`` runs these checks first.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import MLGymRegistryError, with_suggestions
from .kinds import COMPONENT_KINDS


class InvalidOptionError(MLGymRegistryError, ValueError):
    """An option whose value has the wrong type or is out of range; the message names the option and the range."""


class UnknownOptionError(MLGymRegistryError, TypeError):
    """A backend option that the task's backend does not take."""

    def __init__(self, backend: str, unknown: Iterable[str], valid: Iterable[str]):
        self.backend = backend
        self.unknown = sorted(unknown)
        self.valid = sorted(valid)
        names = with_suggestions(self.unknown, self.valid)
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

    def check(self, name: str, value: Any, owner: str | None = None) -> None:
        """Raise ``InvalidOptionError`` naming ``name`` (and its ``owner``) unless ``value`` is valid."""
        if value is None and self.optional:
            return
        if value is None or not self.accepts(value):
            expected = self.description + (" or None" if self.optional else "")
            whose = f" ({owner})" if owner else ""
            raise InvalidOptionError(f"{name}{whose} must be {expected}, got {value!r} ({type(value).__name__})")


OptionRules = Mapping[str, Rule]
"""An owner's rules, by option name."""


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


def one_of(*values: str) -> Rule:
    """One of the strings ``values``."""
    *first, last = (repr(value) for value in values)
    words = f"{', '.join(first)} or {last}" if first else last
    return Rule(words, lambda value: isinstance(value, str) and value in values)


TEXT = instance_of("a string", str)
BOOLEAN = instance_of("a bool (True or False)", bool)
FOLDER = instance_of("a folder path", str, os.PathLike, optional=True)

SEED = integer_at_least(0, optional=True)
"""An episode seed: what every runner (``run_episode``, the worker pools, Ray) and the local backend take."""

SPEC_RULES: dict[str, Rule] = {
    "max_steps": integer_at_least(1),
    "training_timeout": positive_number(optional=True),
    "failure_reward": Rule("a finite number", is_number, optional=True),
    "score_format_exit": BOOLEAN,
}
"""The task spec's options (``make``'s overrides of the spec's fields)."""

COMPONENT_RULES: dict[str, Rule] = {kind: TEXT for kind in COMPONENT_KINDS}
"""A component override names a registered component (``backend="local"``, ``parser="tool_calls"``...)."""

CORE_RULES: dict[str, Rule] = {**SPEC_RULES, **COMPONENT_RULES, "seed": SEED}
"""The options the core owns."""


def check_option(name: str, value: Any) -> None:
    """Raise ``InvalidOptionError`` when the core's rule for ``name`` (``CORE_RULES``) refuses ``value``; names the
    core does not own pass (their owners check them)."""
    rule = CORE_RULES.get(name)
    if rule is not None:
        rule.check(name, value)


def check_options(values: Mapping[str, Any], rules: OptionRules, owner: str | None = None) -> None:
    """Check each of ``values`` that ``rules`` has a rule for; the error names ``owner``, when given (``"an option of
    backend 'local'"``)."""
    for name, value in values.items():
        rule = rules.get(name)
        if rule is not None:
            rule.check(name, value, owner)


def backend_rules(factory: Any) -> OptionRules:
    """A backend factory's own rules for its options (its ``option_rules`` attribute; none declared: {})."""
    rules = getattr(factory, "option_rules", None)
    return rules if isinstance(rules, Mapping) else {}


def check_backend_option_mapping(options: Any) -> None:
    """``backend_options=`` must be a mapping of option names to values (their values are the backend's to check)."""
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        raise InvalidOptionError(
            f"backend_options must be a dict of option names to values, got {options!r} ({type(options).__name__})"
        )


def validate_overrides(overrides: Mapping[str, Any], chain_rules: OptionRules) -> None:
    """Check the keyword overrides of ``registry.make()`` / ``resolve()`` that the core and the chain own; the
    backend's options are checked by ``validate_task_options``, with the backend's rules, once it is known."""
    for name, value in overrides.items():
        if name == "backend_options":
            check_backend_option_mapping(value)
        elif name in chain_rules:
            chain_rules[name].check(name, value, "a chain option")
        elif name in SPEC_RULES or name in COMPONENT_RULES:
            check_option(name, value)


def validate_task_options(spec: Any, backend_options: Mapping[str, Any], accepted: set[str] | None,
                          rules: OptionRules | None = None) -> None:
    """Check a resolved task: its spec's options, and the options its backend will get, with the backend's
    ``rules``.

    ``accepted`` is the set of option names the backend takes (None when it takes any keyword).
    """
    check_options({"max_steps": spec.max_steps, "training_timeout": spec.training_timeout,
                   "failure_reward": getattr(spec, "failure_reward", None),
                   "score_format_exit": getattr(spec, "score_format_exit", False)}, SPEC_RULES)
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
    check_options(backend_options, rules or {}, f"an option of backend {spec.backend!r}")


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
