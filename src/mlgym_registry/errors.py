"""Error classes. Each one names the thing that went wrong and, where there is one, the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from .kinds import LABELS


class MLGymRegistryError(Exception):
    """Base class of every error this package raises on purpose."""


class UnknownNameError(MLGymRegistryError, KeyError):
    """A name that no plugin registered. Also a ``KeyError`` so ``except KeyError`` keeps working."""

    def __init__(self, kind: str, name: str, known: Iterable[str], hint: str | None = None):
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        self.suggestions = difflib.get_close_matches(name, self.known, n=3, cutoff=0.6)
        if not self.suggestions:
            lowered = {k.lower(): k for k in self.known}
            self.suggestions = [lowered[k] for k in difflib.get_close_matches(name.lower(), list(lowered), n=3)]
        message = f"unknown {kind} {name!r}."
        if self.suggestions:
            message += " Did you mean " + " or ".join(repr(s) for s in self.suggestions) + "?"
        elif self.known:
            shown = ", ".join(self.known[:12]) + (", ..." if len(self.known) > 12 else "")
            message += f" Registered {kind}s: {shown}."
        else:
            message += f" No {kind} is registered."
        if hint:
            message += f" {hint}"
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class DuplicateNameError(MLGymRegistryError):
    """Two providers registered the same name for one kind."""

    def __init__(self, kind: str, name: str, first: str, second: str):
        self.kind, self.name, self.first, self.second = kind, name, first, second
        super().__init__(
            f"{kind} {name!r} is registered by both {first} and {second}. Uninstall or block one of them "
            f"(MLGYM_REGISTRY_BLOCK_PLUGINS), or let the newer one register with replace=True."
        )


class PluginLoadError(MLGymRegistryError):
    """A plugin failed to import, or raised inside one of its hooks."""

    def __init__(self, plugin: str, distribution: str | None, entry_point: str | None, cause: BaseException,
                 fix: str | None = None):
        self.plugin, self.distribution, self.entry_point, self.cause = plugin, distribution, entry_point, cause
        where = f"plugin {plugin!r}"
        if distribution:
            where += f" from distribution {distribution!r}"
        if entry_point:
            where += f" (entry point {entry_point!r})"
        reason = f"{type(cause).__name__}: {str(cause).rstrip()}" if str(cause).strip() else type(cause).__name__
        if not reason.endswith((".", "!", "?")):  # the cause's own full stop ends the sentence; never add a second
            reason += "."
        fix = fix or "Fix or uninstall that distribution, or block it"
        super().__init__(f"Error loading {where}: {reason} {fix} with MLGYM_REGISTRY_BLOCK_PLUGINS="
                         f"{distribution or plugin}.")


def with_suggestions(names: Iterable[str], valid: Iterable[str]) -> list[str]:
    """Each of ``names``, quoted, with the closest of ``valid`` as a did-you-mean where one is close."""
    choices = list(valid)
    quoted = []
    for name in names:
        close = difflib.get_close_matches(name, choices, n=1)
        quoted.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return quoted


class InvalidOverrideError(MLGymRegistryError, TypeError):
    """``make()`` was given a keyword it does not know."""

    def __init__(self, unknown: Iterable[str], valid: Iterable[str]):
        self.unknown = sorted(unknown)
        self.valid = sorted(valid)
        hints = with_suggestions(self.unknown, self.valid)
        super().__init__(f"unknown override(s) {', '.join(hints)}. Valid overrides: {', '.join(self.valid)}.")


class InvalidTaskError(MLGymRegistryError, ValueError):
    """A task file or task spec that cannot be used as it is."""


class MissingTaskPackages(InvalidTaskError):
    """A task needs packages that the interpreter it would run with lacks, and no prepared environment has them. The
    message names the task, the packages and the command that prepares an environment with them
    (``mlgym-registry prepare TASK``; see ``mlgym_registry.preparation.virtualenvs``)."""

    def __init__(self, task: str, missing: Iterable[str], python: str, command: str):
        self.task, self.missing, self.python, self.command = task, list(missing), python, command
        super().__init__(
            f"task {task!r} needs packages that {python} does not have: {', '.join(self.missing)}. Prepare a Python "
            f"environment with them once: {command}; or give the local backend python='/path/to/bin/python' of an "
            "interpreter that has them."
        )


class PrepareFailed(MLGymRegistryError, RuntimeError):
    """Building a task's Python environment failed (``mlgym-registry prepare``); the message holds pip's last lines.
    Nothing of the half-built environment is left behind."""


class TaskFilesMissing(MLGymRegistryError, FileNotFoundError):
    """A task's files (starter code, a local dataset) are not where its task file says they are."""


class FormatError(MLGymRegistryError, ValueError):
    """The model's response holds no usable action (no fenced code block, or more than the parser allows)."""


class BackendUnavailable(MLGymRegistryError, RuntimeError):
    """A backend that cannot run on this machine; the message says what is missing and how to get it."""


class PolicyOutputError(MLGymRegistryError, ValueError):
    """A step's input is not what the env's input mode reads (no response, or one of the wrong type); the message
    names the key, the mode and the fix."""


class EnvMisuseError(MLGymRegistryError, RuntimeError):
    """The env was driven as TorchRL's own loops never drive it (a step after the episode ended, a tensordict stepped
    a second time); the message names the fix (``env.reset()``, ``env.step_mdp(td)``)."""


class ComponentOutputError(MLGymRegistryError):
    """A component (parser, action isolator, reward assigner, template set) gave the chain something its contract
    does not allow. The message names the kind, the registered name and where it came from, the bad value and the
    contract, e.g. ``reward assigner 'shaped' (from mlgym-registry-example) returned nan; a reward assigner must
    return a finite float``. Raised where the chain calls the component (see ``output_checks``). On purpose not a
    ``ValueError``: ``FormatError`` is one, and a broken component must not pass for a malformed response."""

    LABELS = LABELS
    """What each kind of component is called (``kinds.LABELS``)."""

    def __init__(self, kind: str, name: str, origin: str, problem: str, contract: str, value: object = None):
        self.kind, self.name, self.origin, self.problem, self.contract, self.value = (
            kind, name, origin, problem, contract, value
        )
        super().__init__(f"{self.LABELS.get(kind, kind)} {name!r} ({origin}) {problem}; {contract}")


class ComponentRaisedError(ComponentOutputError):
    """A component raised an exception where the chain called it (a reward assigner's ``KeyError``, a parser's
    ``ValueError``...): one message naming the kind, the registered name, its distribution, the exception and the
    fix; the component's exception is ``cause`` (and ``__cause__``). The episode loop records the step before it
    lets this error out, so the ``.traj`` stays complete."""

    def __init__(self, kind: str, name: str, origin: str, problem: str, contract: str, cause: BaseException):
        super().__init__(kind, name, origin, problem, contract)
        self.cause = cause
