"""Which metric ranks a task's runs, in which direction, and the name its row gets in the tables.

The metric comes, in this order, from an explicit choice (``report --metric``), the task spec's ``priority_metric``
(``registry.spec``; MLGym's own tasks carry MLGym's choice there), MLGym's per-task table for an id it ranks, the
spec's baseline when it holds a single metric, and last the single metric every run reports. The direction comes from
the explicit choice, the spec's ``metric_direction``, MLGym's table, else higher is better.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..scores import mlgym_ranking_metric

MLGYM_TASK_TITLES: dict[str, str] = {
    "regressionKaggleHousePrice": "House Price",
    "3SATTime": "3-SAT",
    "imageClassificationCifar10": "CIFAR-10",
    "imageClassificationFMnist": "Fashion MNIST",
    "imageCaptioningCOCO": "MS-COCO",
    "languageModelingFineWeb": "Language Modeling",
    "naturalLanguageInferenceMNLI": "MNLI",
    "battleOfSexes": "Battle of Sexes",
    "prisonersDilemma": "Prisoners Dilemma",
    "blotto": "Blotto",
    "rlBreakoutMinAtar": "Breakout",
    "rlMetaMazeMisc": "Meta Maze",
    "rlMountainCarContinuous": "Mountain Car Continuous",
}
"""The row names of MLGym's published tables, in their row order (a fact about those tables, kept as data)."""

MODEL_PREFIXES = ("metagen-",)
"""Prefixes MLGym's run folders put before a model name (its internal model provider); dropped from model names."""


@dataclass(frozen=True)
class TaskMetric:
    """How a task's runs are ranked: the metric, its direction and where that choice came from."""

    task: str
    metric: str
    higher_is_better: bool
    source: str

    @property
    def direction(self) -> str:
        """``"higher"`` or ``"lower"`` (is better)."""
        return "higher" if self.higher_is_better else "lower"


def task_title(task: str) -> str:
    """The row name of ``task`` in the tables: MLGym's name for its tasks, else the task id."""
    return MLGYM_TASK_TITLES.get(task, task)


def task_order(tasks: Iterable[str]) -> list[str]:
    """``tasks`` in table order: MLGym's tasks in MLGym's row order, then the others by id."""
    known = list(MLGYM_TASK_TITLES)
    return sorted(set(tasks), key=lambda t: (0, known.index(t), "") if t in MLGYM_TASK_TITLES else (1, 0, t))


def model_name(field: str) -> str:
    """A model name from the first ``__`` field of a run folder's name, without MLGym's provider prefix."""
    for prefix in MODEL_PREFIXES:
        if field.startswith(prefix) and len(field) > len(prefix):
            return field[len(prefix):]
    return field


def parse_metric_choice(text: str) -> tuple[str, str, bool | None]:
    """``TASK=METRIC[:max|:min]`` (the ``report --metric`` syntax) as (task, metric, higher is better or None)."""
    task, sep, rest = text.partition("=")
    if not sep or not task or not rest:
        raise ValueError(f"--metric {text!r}: expected TASK=METRIC, TASK=METRIC:max or TASK=METRIC:min")
    metric, higher = rest, None
    head, colon, tail = rest.rpartition(":")
    if colon and tail.lower() in ("max", "min", "maximize", "minimize", "higher", "lower"):
        metric, higher = head, tail.lower() in ("max", "maximize", "higher")
    if not metric:
        raise ValueError(f"--metric {text!r}: the metric name is empty")
    return task.strip(), metric.strip(), higher


def find_spec(task: str) -> Any | None:
    """The registered spec of ``task`` (or of ``mlgym/<task>``), None when neither is registered or loadable."""
    from ..registry import registry

    try:
        names = set(registry.names("task"))
    except Exception:  # noqa: BLE001 - a broken plugin must not stop a report over recorded files
        return None
    for name in (task, f"mlgym/{task}"):
        if name in names:
            try:
                return registry.spec(name)
            except Exception:  # noqa: BLE001 - same: fall back to MLGym's table or the runs' metrics
                continue
    return None


def spec_baseline(spec: Any | None) -> dict[str, float]:
    """The spec's first baseline metric dict ({} when none)."""
    scores = getattr(spec, "baseline_scores", None) or []
    return dict(scores[0]) if scores and isinstance(scores[0], dict) else {}


def _is_min(direction: Any) -> bool | None:
    if direction is None:
        return None
    text = str(direction).lower()
    if text.startswith(("min", "lower")):
        return True
    if text.startswith(("max", "higher")):
        return False
    return None


def resolve_metric(
    task: str,
    spec: Any | None,
    run_metrics: Iterable[Iterable[str]] = (),
    choice: tuple[str, bool | None] | None = None,
) -> TaskMetric | None:
    """How to rank ``task``'s runs (see the module docstring for the order of sources); None when nothing decides.

    ``run_metrics``: the metric names each run reported; ``choice``: an explicit (metric, higher is better or None).
    """
    extra: Mapping[str, Any] = getattr(spec, "extra", None) or {}
    known = mlgym_ranking_metric(task)
    lower = _is_min(extra.get("metric_direction"))
    if lower is None and known is not None:
        lower = known.direction == "min"
    if choice is not None:
        metric, higher = choice
        if higher is None:
            higher = not lower if lower is not None else True
        return TaskMetric(task, metric, higher, "--metric")
    spec_name = f"task spec {getattr(spec, 'id', task)!r}"
    if extra.get("priority_metric"):
        return TaskMetric(task, str(extra["priority_metric"]), not lower, spec_name)
    if known is not None:
        return TaskMetric(task, known.name, known.direction != "min", "MLGym's table")
    baseline = spec_baseline(spec)
    if len(baseline) == 1:
        return TaskMetric(task, next(iter(baseline)), not lower, f"{spec_name} (its only metric)")
    common: set[str] | None = None
    for names in run_metrics:
        common = set(names) if common is None else common & set(names)
    if common is not None and len(common) == 1:
        return TaskMetric(task, next(iter(common)), not lower, "the only metric its runs report")
    return None
