"""Score a task's starter code, or its baseline program's output, exactly as ``validate`` scores an agent's work.

Each run is an episode of the local backend: a fresh sandboxed workspace with the task's starter files and data,
the task's interpreter, the secret files shown to the evaluator only, the pristine evaluator, and the evaluator's
seed chosen by the caller. Before validating, the baseline program runs in the agent's shell, as an agent would run
it: ``baseline_command`` from the task's extras when it has one, else ``python <script>`` for the first of
``baseline_paths`` that is not the evaluator (CSV tasks, whose baseline script writes the submission), else, for a
task of an MLGym checkout without a baseline program of its own (an ``...L1`` variant), the program of the task it
derives from, put among its starter files for the run (``mlgym_source.borrowed_baseline``). ``baseline_run`` says
which program that is, and ``recorded_baseline`` which published scores the runs are compared with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import MLGymRegistryError
from ..specs import BASELINE_COMMAND_KEY, TaskSpec, baseline_command

BASELINE_NOTE_KEY = "baseline_note"
"""A task extra: why a fresh baseline differs from the recorded one, when the cause is known."""
BASELINE_TOLERANCE_KEY = "baseline_tolerance"
"""A task extra: the relative difference a reproduced baseline may show (default ``DEFAULT_TOLERANCE``)."""
DEFAULT_TOLERANCE = 0.001


@dataclass(frozen=True)
class BaselineRun:
    """The baseline program scored before the evaluator runs (``baseline_run``)."""

    spec: TaskSpec
    """The spec the run uses: the task's own, or with a borrowed program among its starter files."""
    command: str | None
    """The shell command that makes the baseline's submission; None when the starter code is scored as it is."""
    description: str
    """Which program that is and where it comes from, as ``check`` prints it."""


def baseline_run(spec: TaskSpec) -> BaselineRun:
    """The baseline program to score for ``spec``: its ``baseline_command``, its own baseline script, or the script of
    the MLGym task it derives from (``mlgym_source.borrowed_baseline``), or none (the starter code as it is)."""
    from ..tasks.mlgym_source import borrowed_baseline

    command = baseline_command(spec)
    if command is not None:
        whose = (f"the task's {BASELINE_COMMAND_KEY}" if spec.extra.get(BASELINE_COMMAND_KEY)
                 else f"the task's baseline program {command.removeprefix('python ')}")
        return BaselineRun(spec, command, f"`{command}` ({whose})")
    borrowed = borrowed_baseline(spec)
    if borrowed is None:
        return BaselineRun(spec, None, "none: the starter code is scored as it is")
    run_spec = spec.replace(starter_code=[*spec.starter_code, borrowed.program], baseline_paths=[borrowed.script])
    return BaselineRun(run_spec, f"python {borrowed.script}", (
        f"`python {borrowed.script}` ({borrowed.program}), borrowed from task {borrowed.task_id!r} "
        f"({borrowed.task_file}): this task names no baseline program, and that task has the same evaluator, "
        "datasets and task class"))


def recorded_baseline(spec: TaskSpec) -> str:
    """The published scores fresh runs are compared with, and where they come from, as ``check`` prints it."""
    from ..tasks.mlgym_source import overlay_baseline_metrics

    if not spec.baseline:
        return "none recorded"
    shown = ", ".join(f"{metric} {value!r}" for metric, value in spec.baseline.items())
    where = f"baseline_scores[0] of task {spec.id!r} ({spec.source or 'registered in code'})"
    added = overlay_baseline_metrics(spec)
    if added:
        where += (f"; {', '.join(added)} from our overlay (mlgym_overlay.BASELINE_METRICS), since the task file "
                  f"omits {'it' if len(added) == 1 else 'them'}")
    return f"{shown}: {where}"


def score_starter(spec: TaskSpec, *, seed: int | None = None, timeout: float | None = None,
                  backend_options: dict[str, Any] | None = None) -> dict[str, float]:
    """The metrics ``validate`` gives the starter code after the baseline program (``baseline_run``), with the
    evaluator's seed ``seed``, scored on every row of the answers as MLGym's published baselines are
    (``validation_rows="all"`` unless ``backend_options`` say otherwise). Raises ``MLGymRegistryError`` with the
    output when the command or the evaluation fails."""
    from ..backends.local import CommandTimeout, LocalBackend
    from ..backends.protocol import EVALUATION_STATUS_KEY

    run = baseline_run(spec)
    spec, command = run.spec, run.command
    timeout = float(timeout or spec.training_timeout or 1800)
    backend = LocalBackend(spec, **{"long_timeout": timeout, "validation_rows": "all", **(backend_options or {})})
    try:
        backend.reset(options={"evaluation_seed": seed} if seed is not None else None)
        backend.install_tools()
        if command is not None:
            try:
                output = backend.communicate(command, timeout_duration=timeout)
            except CommandTimeout:
                raise MLGymRegistryError(unfinished_baseline(spec, command, timeout)) from None
            if backend.returncode:
                raise MLGymRegistryError(
                    f"task {spec.id!r}: `{command}` exited with {backend.returncode}:\n{output.strip()[-2000:]}")
        observation, _, _, info = backend.step("validate")
        scores = info.get("score") or []
        if info.get(EVALUATION_STATUS_KEY) != "ok" or not scores:
            raise MLGymRegistryError(
                f"task {spec.id!r}: the evaluation failed ({info.get(EVALUATION_STATUS_KEY)}):\n{observation}")
        return dict(scores[-1])
    finally:
        backend.close()


def unfinished_baseline(spec: TaskSpec, command: str, seconds: float) -> str:
    """The message for a baseline program that did not finish within ``seconds``: nothing was scored, since what a
    cut-short training left (a few checkpoints, an early one) is not the baseline's work."""
    full = spec.training_timeout or 1800
    more = (f"; the full baseline may take up to {full} s (the task's training_timeout, MLGym's limit)"
            if seconds < full else "")
    return (f"task {spec.id!r}: `{command}` did not finish within {seconds:.0f} s, so the baseline was not scored (a "
            f"training cut short is not the baseline){more}. Give it more time (check --budget SECONDS); MLGym's "
            "published RL baselines took hours of CPU training")


@dataclass
class BaselineComparison:
    """A recorded baseline against fresh runs of the baseline: per metric, recorded and fresh values and whether
    they agree within ``tolerance`` (relative) or the fresh runs' own noise (four standard deviations).

    One run gives no noise estimate: a difference beyond ``tolerance`` is then ``unconfirmed`` (listed with how to
    confirm it), not a mismatch, since a stochastic evaluator's single run differs from the recorded mean by its noise.
    """

    recorded: dict[str, float]
    fresh: dict[str, list[float]]
    tolerance: float
    note: str | None = None
    lines: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)
    """Differences beyond ``tolerance`` seen in a single run, which cannot tell the evaluator's noise from a wrong
    baseline; each line says that more runs give a noise estimate."""

    @property
    def reproduced(self) -> bool:
        """Every recorded metric agrees with the fresh runs."""
        return not self.mismatches


def compare_baseline(spec: TaskSpec, runs: list[dict[str, float]], *, tolerance: float | None = None
                     ) -> BaselineComparison:
    """Compare ``spec.baseline`` with the metrics of ``runs`` (see ``BaselineComparison``)."""
    from ..scores import find_metric

    tolerance = float(tolerance if tolerance is not None else spec.extra.get(BASELINE_TOLERANCE_KEY,
                                                                             DEFAULT_TOLERANCE))
    note = spec.extra.get(BASELINE_NOTE_KEY)
    result = BaselineComparison(dict(spec.baseline or {}), {}, tolerance, str(note) if note else None)
    for metric, recorded in result.recorded.items():
        values = [run.get(find_metric(metric, run) or metric) for run in runs]
        if not values or any(not isinstance(v, (int, float)) for v in values):
            result.mismatches.append(f"{metric}: the evaluator did not print it")
            continue
        result.fresh[metric] = [float(v) for v in values]
        mean = sum(values) / len(values)
        spread = math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))
        allowed = max(4 * spread, tolerance * max(abs(float(recorded)), 1e-9))
        line = (f"{metric}: recorded {float(recorded):.6g}, fresh {mean:.6g} +/- {spread:.2g} over {len(values)} "
                f"run(s) (allowed difference {allowed:.2g})")
        if abs(float(recorded) - mean) <= allowed:
            result.lines.append(line)
        elif len(values) == 1:
            result.unconfirmed.append(_single_run_note(line, tolerance))
        else:
            result.mismatches.append(line)
    return result


def _single_run_note(line: str, tolerance: float) -> str:
    """``line`` of a single run beyond ``tolerance``, saying why it is not judged and how to judge it."""
    return (f"{line}: one run gives no noise estimate, so the difference was judged against the task's "
            f"{BASELINE_TOLERANCE_KEY} ({tolerance:.2%}) only; run the evaluator several times (check --runs 3) "
            f"to compare it with the evaluator's own spread, or declare a {BASELINE_TOLERANCE_KEY} that covers "
            f"one run's noise")
