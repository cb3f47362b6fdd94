"""The best value a task's metric can take, and the check that no score is paid past it.

An evaluator whose arithmetic the submission breaks can print a score better than perfect: pandas' int64 sum wraps and
an MAE comes out at -291,281; a weight column the submission sets scales an accuracy past 1. Such a score is no
measurement of the task, so it is an invalid submission, never paid. A task declares its bounds in ``best_score``
(``{rmse: 0, r2: 1}``); our overlay does for MLGym's tasks (``tasks.mlgym_overlay.BEST_SCORES``).

Which side of the bound is "past" comes from an honest value of the same metric: the task's worst score, else its
baseline. Above the bound they make it a lower bound (rmse >= 0), below it an upper bound (accuracy <= 1); without one,
the task's metric direction decides for the metric it is rewarded on, and a metric of no known direction is not
checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .scores import find_metric, lower_is_better, priority_metric, spec_baseline


def past_best(metrics: Any, spec: Any) -> list[str]:
    """The metrics of ``metrics`` that lie past the best value ``spec`` declares for them, each as
    ``"name = value, past its best value bound"``; [] when none does (or nothing is declared)."""
    declared = getattr(spec, "best_score", None) or {}
    if not isinstance(metrics, Mapping) or not declared:
        return []
    found = []
    for name, bound in declared.items():
        key = find_metric(str(name), metrics)
        value = _number(metrics.get(key)) if key is not None else None
        if value is None or not isinstance(bound, (int, float)):
            continue
        minimised = _minimised(str(name), float(bound), metrics, spec)
        if minimised is None:
            continue
        if (value < bound) if minimised else (value > bound):
            found.append(f"{key} = {value!r}, past its best value {float(bound)!r}")
    return found


def past_best_message(metrics: Any, spec: Any) -> str | None:
    """The observation for an evaluation whose metrics lie past their best values, or None when none does."""
    found = past_best(metrics, spec)
    if not found:
        return None
    return (f"The evaluation reported {'; '.join(found)}: no submission can score better than the best value, so "
            "the submission broke the evaluator's arithmetic (an overflowing sum, an out-of-range weight, a value "
            "where the evaluator expects none) and nothing is scored. Submit predictions of the kind the task asks "
            "for and validate again.")


def _minimised(name: str, bound: float, metrics: Mapping[str, Any], spec: Any) -> bool | None:
    """Whether ``name`` is minimised, read from an honest value of it beside ``bound`` (see the module's docstring):
    the worst score first (a floor is never past the best value), then the baseline; None when nothing tells."""
    for reference in (getattr(spec, "worst_score", None) or {}, spec_baseline(spec) or {}):
        key = find_metric(name, reference)
        value = _number(reference.get(key)) if key is not None else None
        if value is not None and value != bound:
            return value > bound
    try:
        rewarded = priority_metric(metrics, spec)
    except ValueError:
        return None
    return lower_is_better(spec) if rewarded.lower() == name.lower() else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
