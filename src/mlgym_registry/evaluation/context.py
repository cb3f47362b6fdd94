"""What a leaderboard's numbers mean beside each other: spread over runs, the starter code's noise band, warnings.

- **Spread**: per model and task, the mean and sample standard deviation of the counted runs' best and last scores,
  beside the best over runs that MLGym's tables show.
- **Noise band**: the starter code's score under each seed the runs were played with (``bench`` records a run's
  seed in its ``settings.json``): an episode of the task, seeded as the run was, whose only action is ``submit``.
  So the evaluator sees the seeds the run's own evaluations saw (``seeding.EpisodeSeeds``, keyed by this
  installation's key: another machine's runs reproduce only with the same ``MLGYM_REGISTRY_SEED_KEY``), with the
  task's backend options and training timeout as recorded, and the starter code as the task registered here has it
  now. A task that is not registered here, whose runs record no seed, or whose episode fails is skipped with a
  note.
- **Starter-like submissions**: a run whose last score equals the starter code's under the same seed submitted
  something that scores exactly as the starter code (most often the starter code itself).
- **Warnings**: model names asked for that no run has, runs recorded twice, and models with different numbers of
  runs on a task.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..policies.base import Policy, fenced
from .runs import RESULTS, Run

SPREAD_TABLE = "spread.csv"
NOISE_TABLE = "noise_band.csv"
NOISE_TIMEOUT = 120.0
"""Seconds one evaluation of the starter code may take; a task whose evaluator takes longer is skipped."""
SAME_SCORE = 1e-9


@dataclass
class Spread:
    """The counted runs' scores of one model on one task."""

    model: str
    task: str
    best: list[float]
    last: list[float]
    higher_is_better: bool = True

    def top(self, values: list[float]) -> float | None:
        """The best of ``values`` in the task's direction."""
        if not values:
            return None
        return max(values) if self.higher_is_better else min(values)


@dataclass
class NoiseBand:
    """The starter code's score under each seed of a task's runs (``scores``: seed -> value of the metric)."""

    task: str
    metric: str
    scores: dict[int, float] = field(default_factory=dict)

    @property
    def values(self) -> list[float]:
        """The scores, in seed order."""
        return [self.scores[seed] for seed in sorted(self.scores)]


@dataclass
class Context:
    """Spread, noise bands, starter-like runs, notes and warnings of a report."""

    spreads: list[Spread] = field(default_factory=list)
    bands: dict[str, NoiseBand] = field(default_factory=dict)
    starter_like: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why a task has no noise band."""
    warnings: list[str] = field(default_factory=list)
    """Models asked for without runs, runs recorded twice: shown on stderr and in the summary."""
    coverage: list[str] = field(default_factory=list)
    """Tasks whose models have different numbers of runs: in the summary only (common in published runs)."""


def run_record(run: Run) -> dict[str, Any]:
    """The run's whole ``settings.json`` (``bench``'s runs only; {} for others)."""
    from .settings import SETTINGS, read

    if run.results_path is None or run.results_path.name != RESULTS:
        return {}
    return read(Path(run.results_path).parent / SETTINGS) or {}


def run_seed(run: Run) -> int | None:
    """The seed run's episode was played with (``run_seed`` in its ``settings.json``), None when unknown."""
    seed = run_record(run).get("run_seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def spreads(statuses: Iterable[Any], models: Sequence[str], metrics: dict[str, Any]) -> list[Spread]:
    """A ``Spread`` per model and task with counted runs (``statuses``: the report's ``RunStatus`` list; ``metrics``:
    task -> its ``TaskMetric``, in the tables' order)."""
    table: dict[tuple[str, str], Spread] = {}
    for status in statuses:
        if status.score is None or status.excluded:
            continue
        key = (status.run.model, status.run.task)
        metric = metrics.get(status.run.task)
        entry = table.setdefault(key, Spread(*key, [], [], getattr(metric, "higher_is_better", True)))
        entry.best.append(status.score[0])
        entry.last.append(status.score[1])
    return [table[(m, t)] for t in metrics for m in models if (m, t) in table]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None for the std of fewer than two values)."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def noise_bands(runs: Sequence[Run], metrics: dict[str, Any], timeout: float = NOISE_TIMEOUT
                ) -> tuple[dict[str, NoiseBand], list[str]]:
    """The starter code's score under each seed of each task's runs, and a note for every task skipped."""
    bands: dict[str, NoiseBand] = {}
    notes: list[str] = []
    for task, metric in metrics.items():
        mine = [run for run in runs if run.task == task]
        band, note = _task_band(task, metric.metric, mine, timeout)
        if band is not None:
            bands[task] = band
        if note:
            notes.append(note)
    return bands, notes


def _task_band(task: str, metric: str, runs: Sequence[Run], timeout: float) -> tuple[NoiseBand | None, str | None]:
    from .tasks import find_spec

    seeds = sorted({seed for seed in map(run_seed, runs) if seed is not None})
    if not seeds:
        return None, f"{task}: no noise band: its runs record no seed (runs of bench with --seed do)"
    spec = find_spec(task)
    if spec is None:
        return None, f"{task}: no noise band: the task is not registered here"
    spec = _as_played(spec, runs)
    band = NoiseBand(task, metric)
    for seed in seeds:
        value, why = starter_score(spec, seed, metric, timeout)
        if why:
            return (band if band.scores else None), f"{task}: noise band stopped at seed {seed}: {why}"
        band.scores[seed] = value
    return band, None


def _as_played(spec: Any, runs: Sequence[Run]) -> Any:
    """``spec`` with the training timeout the runs recorded (the first run that records any). Their backend options
    are never taken: a run folder may come from anywhere, and a record never chooses how the starter code is confined
    (``records.trust``); the band is measured under the task's own options."""
    settings = next((run.settings for run in runs if run.settings), None) or {}
    changes: dict[str, Any] = {}
    if settings.get("training_timeout"):
        changes["training_timeout"] = settings["training_timeout"]
    return spec.replace(**changes) if changes else spec


def starter_score(spec: Any, seed: int, metric: str, timeout: float) -> tuple[float | None, str | None]:
    """The starter code's ``metric`` in an episode seeded ``seed`` that only submits; (None, why) on failure."""
    from ..episodes.episode import run_episode
    from ..registry import registry

    env = None
    try:
        env = registry.make(spec.replace(training_timeout=int(min(spec.training_timeout or timeout, timeout))),
                            batch_size=())
        result = run_episode(env, SubmitAtOnce(), spec=spec, seed=seed)
    except Exception as exc:  # noqa: BLE001 - the band is context: a failing episode is a note, not a failed report
        return None, " ".join(str(exc).split())[:300]
    finally:
        if env is not None:
            env.close()
    metrics = result.score or {}
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None, f"the evaluator reported no {metric!r} ({sorted(metrics)})"
    return float(value), None


class SubmitAtOnce(Policy):
    """A policy whose only action is ``submit``: the episode scores the starter code as it is."""

    name = "submit-at-once"

    def respond(self, messages: Any) -> str:
        """``submit``, in MLGym's format."""
        return fenced("I submit the starter code as it is.", "submit")


def starter_like(statuses: Iterable[Any], bands: dict[str, NoiseBand]) -> list[Run]:
    """Runs whose last score equals the starter code's under the run's own seed."""
    found = []
    for status in statuses:
        band = bands.get(status.run.task)
        seed = run_seed(status.run) if band is not None else None
        if status.score is None or seed is None or seed not in band.scores:
            continue
        if abs(status.score[1] - band.scores[seed]) <= SAME_SCORE:
            found.append(status.run)
    return found


def duplicate_runs(runs: Sequence[Run]) -> list[str]:
    """A warning per run recorded more than once: the same model, task and run folder name, or (for ``bench``'s
    runs) the same model, task, settings and seed."""
    by_folder = Counter((run.model, run.task, Path(run.label).name) for run in runs)
    warnings = [f"{model}/{task}: run {name} is recorded {count} times (the same folder given twice, or copied); "
                f"each copy counts as a run" for (model, task, name), count in sorted(by_folder.items()) if count > 1]
    seeded = Counter((run.model, run.task, seed) for run in runs if (seed := run_seed(run)) is not None)
    warnings += [f"{model}/{task}: {count} runs were played with the same seed {seed} and settings (the same "
                 f"episode, not independent runs)" for (model, task, seed), count in sorted(seeded.items())
                 if count > 1]
    return warnings


def uneven_coverage(runs: Sequence[Run], models: Sequence[str], tasks: Sequence[str]) -> list[str]:
    """A warning per task whose models have different numbers of runs (best-of-K favours the larger K)."""
    counts = Counter((run.model, run.task) for run in runs)
    warnings = []
    for task in tasks:
        per_model = {model: counts.get((model, task), 0) for model in models}
        if len(set(per_model.values())) > 1:
            shown = ", ".join(f"{model} {count}" for model, count in per_model.items())
            warnings.append(f"{task}: models have different numbers of runs ({shown}); a best over more runs "
                            f"is favoured")
    return warnings


def unknown_models(asked: Sequence[str] | None, found: Iterable[str]) -> list[str]:
    """The names in ``asked`` (``--models``) that no run has."""
    known = set(found)
    return [name for name in dict.fromkeys(asked or ()) if name not in known]


def build_context(report: Any, noise_band: bool = True, timeout: float = NOISE_TIMEOUT) -> Context:
    """The context of a ``report.Report``: spreads, noise bands (unless ``noise_band`` is false), starter-like runs
    and warnings."""
    board = report.board
    tasks = [task.task for task in board.tasks]
    reported = [status.run for status in report.statuses]
    metrics = {task: report.metrics[task] for task in tasks}
    context = Context(spreads=spreads(report.statuses, board.models, metrics))
    if noise_band:
        context.bands, context.notes = noise_bands(reported, report.metrics, timeout)
        context.starter_like = starter_like(report.statuses, context.bands)
    context.warnings = duplicate_runs(reported)
    context.coverage = uneven_coverage(reported, board.models, tasks)
    return context


def _number(value: float | None) -> str:
    return "" if value is None else repr(round(float(value), 3))


def spread_rows(context: Context) -> list[list[str]]:
    """``spread.csv``: per model and task, the runs counted, best and last (over runs) and their mean and std."""
    rows = [["Model", "Task", "Runs", "Best", "Best mean", "Best std", "Last", "Last mean", "Last std"]]
    for entry in context.spreads:
        cells = []
        for values in (entry.best, entry.last):
            mean, std = mean_std(values)
            cells += [_number(entry.top(values)), _number(mean), _number(std)]
        rows.append([entry.model, entry.task, str(len(entry.best)), *cells])
    return rows


def noise_rows(context: Context) -> list[list[str]]:
    """``noise_band.csv``: per task, the starter code's score under each seed and their mean, std, min and max."""
    rows = [["Task", "Metric", "Seeds", "Starter mean", "Starter std", "Starter min", "Starter max", "Per seed",
             "Runs scoring as the starter"]]
    for task, band in context.bands.items():
        mean, std = mean_std(band.values)
        same = sum(run.task == task for run in context.starter_like)
        per_seed = " ".join(f"{seed}:{_number(value)}" for seed, value in sorted(band.scores.items()))
        rows.append([task, band.metric, str(len(band.scores)), _number(mean), _number(std),
                     _number(min(band.values)), _number(max(band.values)), per_seed, str(same)])
    return rows


def context_markdown(context: Context, spread_table: list[list[str]], noise_table: list[list[str]],
                     md_table: Any) -> list[str]:
    """The summary's sections: spread over runs, the noise band, starter-like runs and warnings."""
    lines = ["## Spread over runs", "", f"`{SPREAD_TABLE}`: per model and task, the best over the counted runs (as in "
             "the tables above) beside the mean and sample standard deviation of the runs' scores.", ""]
    lines += (md_table(spread_table) if len(spread_table) > 1 else ["No counted runs."]) + [""]
    lines += ["## Noise band of the starter code", "", f"`{NOISE_TABLE}`: the unchanged starter code scored under "
              "each seed the runs were played with. A model whose scores stay inside this band did no better than "
              "the starter code's luck.", ""]
    if len(noise_table) > 1:
        lines += md_table(noise_table) + [""]
    lines += [f"- Note: {note}" for note in context.notes] or ([] if len(noise_table) > 1 else ["Not computed."])
    lines.append("")
    if context.starter_like:
        lines += [f"{len(context.starter_like)} runs submitted something that scores exactly as the starter code "
                  "under the same seed (most likely the starter code itself):", ""]
        lines += [f"- `{run.label}` ({run.model}, {run.task})" for run in context.starter_like] + [""]
    lines += ["## Warnings", ""]
    lines += [f"- {warning}" for warning in context.warnings + context.coverage] or ["None."]
    lines.append("")
    return lines
