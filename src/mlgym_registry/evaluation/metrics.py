"""MLGym's leaderboard metrics, as pure functions over plain numbers.

The rules follow MLGym's published analysis (its ``scripts/evaluation/get_ranks.py``), reimplemented:

- **per run**: the *best* score is the best value of the ranking metric over the agent's attempts (every validate and
  the final submission); the *last* score is the metric of its last attempt (the submission, or the last validate
  of a run that ended without one). A run with no attempt holding the metric has no score.
- **per model and task**: the best over the model's runs of the runs' best scores (*best attempt*) and of the runs'
  last scores (*best submission*). The baseline is a column like the models.
- **ranks**: per task, the columns with a score, best first (ties in column order), then the columns without one, in
  column order. Two overall orders follow: by mean position over the tasks (the row MLGym calls ``Plackett-Luce``)
  and by Borda count (``BORDA``), ties kept in the first task's order. There the columns without a score on a task
  share its last positions: each counts as their mean (MLGym puts them in an arbitrary order, so this is the mean
  of what its script gives).
- **performance profile**: per task, a column is *feasible* when its score is positive and no worse than the
  baseline's. A feasible column's ratio is best/score (higher is better) or score/best (lower is better), the best
  taken over the feasible columns; every other column gets the worst feasible ratio times ``1 + EPSILON``. A task is
  solved within ``tau`` when ``log10(ratio) <= tau``; ``tau`` runs over ``TAU_POINTS`` even steps from 0 to the largest
  per-task ceiling (``ceil`` of the penalty ratio) in log10, rounded up to a tenth. A column's profile is the share of
  tasks solved at each ``tau``.
- **AUP**: the area under a profile, as the left Riemann sum over that grid.

Two cases MLGym's script does not reach are given a meaning here: a score of exactly 0 is infeasible (its ratio
would divide by zero), and in a task where no column is feasible every ratio is infinite (nobody solves it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

BASELINE = "baseline"
"""The column of the task's baseline score in every table."""
EPSILON = 0.05
"""How much worse than the worst feasible ratio an infeasible or missing score counts."""
TAU_POINTS = 500
"""Grid points of the performance profile's tau axis (log10 of the performance ratio)."""
MEAN_RANK = "Plackett-Luce"
"""Row label of the order by mean position (MLGym's name for it)."""
BORDA = "BORDA"
"""Row label of the order by Borda count."""

Score = float | None


@dataclass
class TaskResult:
    """A task's input to the leaderboard: its ranking direction, baseline and each model's scored runs."""

    task: str
    title: str
    higher_is_better: bool
    baseline: Score
    runs: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)
    """Model -> (best, last) score of each of its runs that has one."""


@dataclass
class Leaderboard:
    """Everything MLGym's tables and profile plot hold, for some models over some tasks."""

    models: list[str]
    tasks: list[TaskResult]
    best: dict[str, dict[str, Score]]
    last: dict[str, dict[str, Score]]
    best_ranks: dict[str, list[str]]
    last_ranks: dict[str, list[str]]
    best_overall: dict[str, list[str]]
    last_overall: dict[str, list[str]]
    taus: np.ndarray
    best_profiles: dict[str, np.ndarray]
    last_profiles: dict[str, np.ndarray]
    aup: dict[str, tuple[float, float]]

    @property
    def columns(self) -> list[str]:
        """The score tables' columns: the baseline, then the models."""
        return [BASELINE, *self.models]

    @property
    def solvers(self) -> list[str]:
        """The profiles' and AUP table's rows: the models, then the baseline."""
        return [*self.models, BASELINE]


def run_score(
    attempts: Sequence[Mapping[str, float]], metric: str, higher_is_better: bool
) -> tuple[float, float] | None:
    """(best, last) value of ``metric`` over a run's attempts, in order; None when no attempt reports it."""
    values = [attempt[metric] for attempt in attempts if metric in attempt]
    if not values:
        return None
    return (max(values) if higher_is_better else min(values)), values[-1]


def best_of(values: Iterable[float], higher_is_better: bool) -> Score:
    """The best of ``values`` (None when there are none)."""
    values = list(values)
    if not values:
        return None
    return max(values) if higher_is_better else min(values)


def rank_order(scores: Mapping[str, Score], higher_is_better: bool) -> list[str]:
    """The columns of ``scores`` best first; ties and the columns without a score (last) keep their given order."""
    scored = [name for name, value in scores.items() if value is not None]
    scored.sort(key=lambda name: scores[name], reverse=higher_is_better)  # a stable sort, also when reversed
    return scored + [name for name, value in scores.items() if value is None]


def positions(scores: Mapping[str, Score], higher_is_better: bool) -> dict[str, float]:
    """Each column's position on one task (1 = best), as ``rank_order`` gives them, except that the columns without
    a score share the positions after the scored ones: each gets their mean (MLGym lists them in an arbitrary order;
    the mean is the position that order gives on average)."""
    order = rank_order(scores, higher_is_better)
    scored = sum(1 for value in scores.values() if value is not None)
    tail = (scored + 1 + len(order)) / 2
    return {name: float(index + 1) if index < scored else tail for index, name in enumerate(order)}


def mean_rank_order(tasks: Sequence[Mapping[str, float]]) -> list[str]:
    """Columns by mean position over the tasks' ``positions``, best first; ties in order of first appearance."""
    totals: dict[str, list[float]] = {}
    for task in tasks:
        for name, position in task.items():
            totals.setdefault(name, []).append(position)
    return sorted(totals, key=lambda name: sum(totals[name]) / len(totals[name]))


def borda_order(tasks: Sequence[Mapping[str, float]]) -> list[str]:
    """Columns by Borda count over the tasks' ``positions`` (``columns + 1 - position`` points on each), most first;
    ties in order of first appearance."""
    points: dict[str, float] = {}
    for task in tasks:
        for name, position in task.items():
            points[name] = points.get(name, 0.0) + len(task) + 1 - position
    return sorted(points, key=lambda name: points[name], reverse=True)


def performance_ratios(
    scores: Mapping[str, Score], higher_is_better: bool, epsilon: float = EPSILON
) -> tuple[dict[str, float], int | None]:
    """Each column's performance ratio on one task (see the module docstring) and the task's tau ceiling.

    The ceiling is None (and every ratio infinite) when no column is feasible.
    """
    baseline = scores.get(BASELINE)

    def feasible(value: Score) -> bool:
        if value is None or value <= 0:
            return False
        if baseline is None:
            return True
        return value >= baseline if higher_is_better else value <= baseline

    ok = {name: value for name, value in scores.items() if feasible(value)}
    if not ok:
        return {name: math.inf for name in scores}, None
    best, worst = (max(ok.values()), min(ok.values())) if higher_is_better else (min(ok.values()), max(ok.values()))
    worst_ratio = best / worst if higher_is_better else worst / best
    penalty = worst_ratio * (1 + epsilon)
    ratios = {}
    for name in scores:
        if name in ok:
            ratios[name] = best / ok[name] if higher_is_better else ok[name] / best
        else:
            ratios[name] = penalty
    return ratios, math.ceil(penalty)


def tau_grid(ceilings: Iterable[int | None], points: int = TAU_POINTS) -> np.ndarray:
    """The tau axis (log10 ratios): ``points`` even steps from 0 to the largest ceiling's log10, rounded up to 0.1."""
    top = max((c for c in ceilings if c is not None), default=2)
    end = math.ceil(math.log10(top) * 10) / 10
    return np.linspace(0.0, end, points)


def profiles(
    ratios: Sequence[Mapping[str, float]], solvers: Sequence[str], taus: np.ndarray
) -> dict[str, np.ndarray]:
    """Each solver's share of tasks with ``log10(ratio) <= tau``, at each tau (zeros when there are no tasks)."""
    if not ratios:
        return {name: np.zeros_like(taus) for name in solvers}
    with np.errstate(divide="ignore"):
        logs = np.log10(np.array([[task[name] for name in solvers] for task in ratios], dtype=float))
    solved = logs[:, :, None] <= taus[None, None, :]
    shares = solved.sum(axis=0) / len(ratios)
    return {name: shares[index] for index, name in enumerate(solvers)}


def aup(profile: np.ndarray, taus: np.ndarray) -> float:
    """The area under a step profile: each step's height at its left end times its width, summed left to right."""
    total = 0.0
    for width, height in zip(np.diff(taus).tolist(), profile[:-1].tolist(), strict=True):
        total += width * height
    return total


def leaderboard(tasks: Sequence[TaskResult], models: Sequence[str]) -> Leaderboard:
    """Score tables, ranks, profiles and AUP of ``models`` (in this column order) over ``tasks`` (in row order)."""
    models = list(models)
    if BASELINE in models:
        raise ValueError(f"a model cannot be called {BASELINE!r}: that column holds the tasks' baselines")
    columns, solvers = [BASELINE, *models], [*models, BASELINE]
    best: dict[str, dict[str, Score]] = {}
    last: dict[str, dict[str, Score]] = {}
    for task in tasks:
        runs = {model: task.runs.get(model, ()) for model in models}
        best[task.task] = {BASELINE: task.baseline}
        last[task.task] = {BASELINE: task.baseline}
        for model in models:
            best[task.task][model] = best_of((b for b, _ in runs[model]), task.higher_is_better)
            last[task.task][model] = best_of((final for _, final in runs[model]), task.higher_is_better)
    best_ranks = {t.task: rank_order(best[t.task], t.higher_is_better) for t in tasks}
    last_ranks = {t.task: rank_order(last[t.task], t.higher_is_better) for t in tasks}
    best_ratios, last_ratios, ceilings = [], [], []
    for task in tasks:
        for table, into in ((best, best_ratios), (last, last_ratios)):
            ratios, ceiling = performance_ratios({c: table[task.task][c] for c in columns}, task.higher_is_better)
            into.append(ratios)
            ceilings.append(ceiling)
    taus = tau_grid(ceilings)
    best_profiles = profiles(best_ratios, solvers, taus)
    last_profiles = profiles(last_ratios, solvers, taus)
    return Leaderboard(
        models=models,
        tasks=list(tasks),
        best=best,
        last=last,
        best_ranks=best_ranks,
        last_ranks=last_ranks,
        best_overall=_overall([positions(best[t.task], t.higher_is_better) for t in tasks]),
        last_overall=_overall([positions(last[t.task], t.higher_is_better) for t in tasks]),
        taus=taus,
        best_profiles=best_profiles,
        last_profiles=last_profiles,
        aup={name: (aup(best_profiles[name], taus), aup(last_profiles[name], taus)) for name in solvers},
    )


def _overall(tasks: list[dict[str, float]]) -> dict[str, list[str]]:
    return {MEAN_RANK: mean_rank_order(tasks), BORDA: borda_order(tasks)}
