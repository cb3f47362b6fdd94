"""Checks of a task for suite maintainers: its files, its evaluator, its baseline (``check_task``); and
``run_evaluator``."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MLGymRegistryError
from ..specs import TaskSpec
from ._common import ConformanceError


@dataclass
class EvaluationRun:
    """One run of a task's evaluator: the seed, the metrics it printed, how long it took."""

    seed: int
    metrics: dict[str, float]


@dataclass
class TaskCheck:
    """What ``check_task`` found: the spec, each evaluation run, and the verdict per metric."""

    spec: TaskSpec
    runs: list[EvaluationRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    known_differences: list[str] = field(default_factory=list)
    """Baseline metrics that differ from the recorded ones for a cause the task states (its ``baseline_note``)."""
    warnings: list[str] = field(default_factory=list)
    """What is not a problem but deserves a look: a single run beyond the tolerance (no noise estimate), a key of
    the task file that looks like a misspelt field."""
    baseline_program: str = ""
    """The baseline program each run scores and where it comes from (``evaluator_runs.baseline_run``)."""
    compared_with: str = ""
    """The published scores the runs are compared with and where they come from (``recorded_baseline``)."""

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems


def check_task(task: TaskSpec | str | Path, *, runs: int = 3, raise_on_failure: bool = True,
               budget: float | None = None, backend_options: dict[str, Any] | None = None) -> TaskCheck:
    """Check a task for suite maintainers: it loads, its files exist, its evaluator runs on the starter code and
    prints its metrics, and its recorded baseline matches fresh runs within the evaluator's own noise.

    ``task`` is a registered name, a ``TaskSpec`` or a path to a task YAML file. The starter code is scored ``runs``
    times with different evaluator seeds, as ``validate`` scores it (``run_evaluator``: sandboxed, the task's data and
    interpreter, its baseline program first when it has one, or the one of the MLGym task it derives from); the
    report names that program (``baseline_program``) and the published scores (``compared_with``), which must lie
    within four standard deviations of the fresh runs' mean, or within the task's ``baseline_tolerance`` (relative,
    default 0.1 %) of it.
    A difference whose cause the task states (``baseline_note``) is listed in ``known_differences``, not a problem.
    ``budget``: the seconds each run's baseline program may take (default the task's ``training_timeout``); one that
    does not finish in it is a problem, never scored, and a budget below ``training_timeout`` is warned about.
    ``backend_options``: the local backend's options for each run (``python=``, ``data_dir=``, ...).
    """
    spec = _load_task(task)
    report = TaskCheck(spec)
    report.problems.extend(_task_field_problems(spec))
    report.warnings.extend(_misspelt_field_warnings(spec))
    missing = [path for path in spec.starter_code if not spec.resolve_path(path).exists()]
    if missing:
        report.problems.append(f"starter files missing: {missing} (resolved against {spec.root})")
    starter_names = {Path(path).name for path in spec.starter_code}
    for path in spec.evaluation_paths + spec.baseline_paths:
        if Path(path).parts[0] not in starter_names:
            report.problems.append(f"{path!r} is not among the starter files {sorted(starter_names)}")
    if not spec.evaluation_paths:
        report.problems.append("no evaluation_paths: the task has no evaluator")
    report.problems.extend(_metric_name_problems(spec))
    if report.problems:
        return _conclude(report, raise_on_failure)
    from ..evaluation.evaluator_runs import baseline_run, recorded_baseline

    report.baseline_program = baseline_run(spec).description
    report.compared_with = recorded_baseline(spec)
    full = spec.training_timeout or 1800
    if budget is not None and budget < full and baseline_run(spec).command is not None:
        report.warnings.append(
            f"--budget gives the baseline program {budget:.0f} s a run; the full baseline may take up to {full} s "
            "(the task's training_timeout, MLGym's limit): one cut short is reported as a problem, never scored")
    for seed in range(runs):
        try:
            report.runs.append(EvaluationRun(seed, run_evaluator(spec, seed=seed, timeout=budget,
                                                                  backend_options=backend_options)))
        except MLGymRegistryError as exc:
            report.problems.append(str(exc))
            return _conclude(report, raise_on_failure)
    report.problems.extend(_metric_name_problems(spec, report.runs[0].metrics if report.runs else None))
    _compare_baseline(report)
    return _conclude(report, raise_on_failure)


def _task_field_problems(spec: TaskSpec) -> list[str]:
    """What of the task's own fields breaks its episodes: an unknown ``task_entrypoint`` (every ``validate`` would
    fail), an empty description (the prompt's TASK DESCRIPTION would be empty), a component name nothing registered
    (``make`` would fail)."""
    import difflib

    from ..entries import is_task_file
    from ..kinds import PATH_LOADERS
    from ..registry import registry
    from ..specs import COMPONENT_KINDS, TASK_ENTRYPOINTS

    problems = []
    if spec.task_entrypoint not in TASK_ENTRYPOINTS:
        close = difflib.get_close_matches(spec.task_entrypoint, TASK_ENTRYPOINTS, n=1, cutoff=0.6)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        problems.append(f"task_entrypoint {spec.task_entrypoint!r} is not one of MLGym's task classes "
                        f"({', '.join(TASK_ENTRYPOINTS)}), so no backend can evaluate the agent's work. {hint}Fix "
                        f"'task_entrypoint:' in the task file")
    if not str(spec.description or "").strip():
        problems.append("description is empty: the prompt's TASK DESCRIPTION would show nothing; describe the task "
                        "in 'description'")
    for kind in COMPONENT_KINDS:
        name = getattr(spec, kind)
        if name in registry.names(kind) or (kind in PATH_LOADERS and is_task_file(name) and Path(name).is_file()):
            continue
        try:
            registry.entry(kind, name)
        except KeyError as exc:  # UnknownNameError, with its did-you-mean
            problems.append(f"{exc} The task's '{kind}:' field names it: fix that name, or install the plugin that "
                            f"registers {name!r} (`mlgym-registry list --kind {kind}` shows the registered ones)")
    return problems


def _misspelt_field_warnings(spec: TaskSpec) -> list[str]:
    """A warning per key of the task file that looks like a misspelt field (``specs.misspelt_fields``)."""
    from ..specs import misspelt_field_message, misspelt_fields

    where = spec.source or spec.id
    return [misspelt_field_message(where, key, name) for key, name in misspelt_fields(spec).items()]


def _metric_name_problems(spec: TaskSpec, metrics: dict[str, float] | None = None) -> list[str]:
    """Mismatches between the metric the task is rewarded on and its baseline (``metrics`` None) or what its
    evaluator printed (``metrics``): each would make every scored step an ``infra_error``."""
    from ..scores import baseline_metric_problem, evaluation_metric_problem

    problem = baseline_metric_problem(spec) if metrics is None else evaluation_metric_problem(metrics, spec)
    return [problem] if problem is not None else []


def _load_task(task: TaskSpec | str | Path) -> TaskSpec:
    from ..registry import registry
    from ..specs import TaskFieldWarning
    from ..tasks.mlgym_source import load_task_file

    if isinstance(task, TaskSpec):
        return task
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskFieldWarning)  # check_task reports them itself
        if isinstance(task, Path) or str(task).endswith((".yaml", ".yml")):
            return load_task_file(task)
        return registry.spec(str(task))


def _compare_baseline(report: TaskCheck) -> None:
    spec = report.spec
    if not spec.baseline:
        report.problems.append("no baseline_scores recorded; run the evaluator on the starter code and record them")
        return
    from ..evaluation.evaluator_runs import compare_baseline

    comparison = compare_baseline(spec, [run.metrics for run in report.runs])
    report.notes.extend(comparison.lines)
    report.warnings.extend(comparison.unconfirmed)
    if comparison.mismatches and comparison.note:
        report.known_differences.extend(f"{line}: {comparison.note}" for line in comparison.mismatches)
    else:
        report.problems.extend(f"baseline does not match: {line}" for line in comparison.mismatches)


def _conclude(report: TaskCheck, raise_on_failure: bool) -> TaskCheck:
    if report.problems and raise_on_failure:
        raise ConformanceError(f"task {report.spec.id!r}: " + "; ".join(report.problems))
    return report


def run_evaluator(spec: TaskSpec, *, seed: int | None = None, timeout: float | None = None,
                  backend_options: dict[str, Any] | None = None) -> dict[str, float]:
    """The metrics ``validate`` gives the task's starter code, with the evaluator's seed ``seed``: a fresh sandboxed
    workspace of the local backend with the task's files, data and interpreter, the baseline program run first when
    the task has one (``mlgym_registry.evaluation.evaluator_runs.baseline_run``), then the pristine evaluator."""
    from ..evaluation.evaluator_runs import score_starter

    return score_starter(spec, seed=seed, timeout=timeout, backend_options=backend_options)
