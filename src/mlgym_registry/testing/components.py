"""Checks of registered components and of a whole distribution (``check_component``, ``check_plugin``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._common import ConformanceError
from .backends import check_backend
from .history import check_history_processor
from .isolators import check_isolator
from .parsers import check_parser
from .rewards import check_reward_assigner
from .tasks import check_task
from .templates import check_template


@dataclass
class ComponentCheck:
    """The verdict on one registered component: ``status`` is ``"ok"``, ``"FAIL"`` (``reason`` says why) or
    ``"skip"`` (it cannot be checked on this machine, e.g. a backend whose runtime is missing)."""

    kind: str
    name: str
    distribution: str | None
    status: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        """False only when the component failed its check."""
        return self.status != "FAIL"

    def line(self) -> str:
        """One line for a terminal: ``ok   parser   tagged``, or ``FAIL reward   shaped (distribution my-dist):
        <reason>`` (a failure names the distribution to fix)."""
        text = f"{self.status:<4} {self.kind:<8} {self.name}"
        if self.status == "FAIL" and self.distribution:
            text += f" (distribution {self.distribution})"
        return f"{text}: {self.reason}" if self.reason else text


KIT_CHECKS: dict[str, Callable[..., None]] = {
    "parser": check_parser,
    "reward": check_reward_assigner,
    "template": check_template,
    "backend": check_backend,
    "history": check_history_processor,
}
"""The kit check run on a built component of each kind (isolators and tasks have their own handling in
``check_component``); a kind not listed here is only imported and built."""


def check_component(kind: str, name: str, *, registry: Any = None, parsers: list[str] | None = None,
                    runs: int = 3) -> ComponentCheck:
    """Import the registered ``name`` of ``kind`` (its lazy ``"pkg.module:attr"`` reference), build it and run the
    kit's check for its kind; never raises for the component's own faults, returns a ``ComponentCheck``.

    An isolator is checked with each parser named in ``parsers`` (default: the parsers its own distribution
    registered, or ``thought_action`` when it registered none), with responses in that parser's format. A task gets
    ``check_task`` with ``runs`` evaluator runs. Raises ``UnknownNameError`` when nothing of ``kind`` is ``name``.
    """
    from ..errors import BackendUnavailable
    from ..registry import registry as default_registry

    registry = registry or default_registry
    entry = registry.entry(kind, name)
    result = ComponentCheck(kind, name, entry.distribution, "ok")
    problem = _import_problem(entry)
    if problem is not None:
        result.status, result.reason = "FAIL", problem
        return result
    try:
        if kind == "task":
            report = check_task(registry.spec(name), runs=runs, raise_on_failure=False)
            if not report.ok:
                result.status, result.reason = "FAIL", "; ".join(report.problems)
            return result
        component = registry.build(kind, name)
        if kind == "isolator":
            for parser_name, parser in _isolator_parsers(registry, entry, parsers):
                try:
                    check_isolator(component, parser)
                except ConformanceError as exc:
                    raise ConformanceError(f"{exc} (checked with parser {parser_name!r})") from None
        elif kind == "backend":
            check_available = getattr(component, "check_available", None)
            if callable(check_available):
                check_available()
            check_backend(component)
        elif kind in KIT_CHECKS:
            KIT_CHECKS[kind](component)
    except BackendUnavailable as exc:
        result.status, result.reason = "skip", str(exc)
    except ConformanceError as exc:
        result.status, result.reason = "FAIL", str(exc)
    except Exception as exc:  # noqa: BLE001 - anything the component raises is its failure, reported, not raised
        result.status, result.reason = "FAIL", f"{type(exc).__name__}: {exc}"
    return result


def _import_problem(entry: Any) -> str | None:
    """Why ``entry``'s lazy reference does not import (naming the module), or None when it does or has none."""
    from ..entries import import_reference, is_task_file, reference_fix

    target = entry.target
    if not isinstance(target, str) or (entry.kind == "task" and is_task_file(target)):
        return None
    module_name, _, attr = target.partition(":")
    try:
        importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - SyntaxError, ImportError, or whatever the module raises on import
        fix = reference_fix(target, exc) or "fix that module"
        return (f"cannot import module {module_name!r} (registered as {target!r}): {type(exc).__name__}: {exc}. "
                f"{fix[0].upper()}{fix[1:]}")
    try:
        import_reference(target)
    except AttributeError as exc:
        fix = reference_fix(target, exc) or f"{exc}"
        return f"module {module_name!r} has no attribute {attr!r} (registered as {target!r}). {fix}"
    return None


def _isolator_parsers(registry: Any, entry: Any, names: list[str] | None) -> list[tuple[str, Any]]:
    """The parsers to check an isolator with: ``names``, else its distribution's own, else ``thought_action``."""
    if names is None:
        names = [row.name for row in registry.describe("parser")
                 if entry.distribution is not None and row.distribution == entry.distribution]
    built = []
    for name in names:
        try:
            built.append((name, registry.build("parser", name)))
        except Exception:  # noqa: BLE001 - a parser that does not build fails its own check, not the isolator's
            continue
    if not built:
        from ..components.parsers import ThoughtActionParser

        built = [("thought_action", ThoughtActionParser())]
    return built


def check_plugin(distribution: str, *, registry: Any = None, runs: int = 3) -> list[ComponentCheck]:
    """``check_component`` on every component the installed ``distribution`` registered (tasks included), plus one
    ``FAIL`` row of kind ``plugin`` for each of its plugins that failed to load.

    Raises ``UnknownNameError`` (with close matches) when no loaded plugin comes from ``distribution``.
    """
    from ..errors import UnknownNameError
    from ..registry import registry as default_registry

    registry = registry or default_registry
    plugins = registry.plugins()
    rows = registry.describe()
    known = {row["distribution"] for row in plugins if row["distribution"]}
    known |= {row.distribution for row in rows if row.distribution}
    wanted = _normalised_dist(distribution)
    matches = [name for name in known if _normalised_dist(name) == wanted]
    if not matches:
        raise UnknownNameError("distribution", distribution, known,
                               "See `mlgym-registry plugins` for the installed ones.")
    dist = matches[0]
    results = [ComponentCheck("plugin", row["name"], dist, "FAIL", row["error"])
               for row in plugins if row["distribution"] == dist and row["error"]]
    results += [ComponentCheck("plugin", row["name"], dist, "FAIL", refusal)
                for row in plugins if row["distribution"] == dist for refusal in row.get("refused", ())]
    results += [check_component(row.kind, row.name, registry=registry, runs=runs)
                for row in rows if row.distribution == dist]
    return results


def _normalised_dist(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
