"""Suite runs: K runs of each of several tasks with one policy, in MLGym's layout, resumable.

Every run has its own folder ``<out>/<model>__<task>__run_<k>/`` holding ``<task>.traj`` and ``results.json``, as
MLGym's own runs do (the model is the folder name's first ``__``-separated field, which is what ``report`` reads).
A run is finished when its trajectory records how the episode ended (``info.exit_status``) and its ``results.json``
does not say it failed; running the same suite again into the same folder skips finished runs and plays the others
again from scratch (runs that were interrupted, failed or never started). Run ``k`` of a task is seeded
``seed + k`` wherever it is played, so a resumed suite plays exactly the runs a complete one would have.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..episode import EpisodeResult
from ..policies.base import Policy
from ..specs import TaskSpec

RUN_FOLDER = re.compile(r"^(?P<model>.+?)__(?P<task>.+)__run_(?P<number>\d+)$")
"""``<model>__<task>__run_<k>``: the folder of one run."""


def policy_model_name(policy: str) -> str:
    """The model a policy string stands for, fit for a folder name: ``openai:org/m`` -> ``org-m``,
    ``transformers:/ckpt/tiny`` -> ``tiny``, ``replay:run.traj`` -> ``replay-run``, ``scripted`` -> ``scripted``."""
    kind, _, argument = policy.partition(":")
    if kind == "transformers" and argument:
        name = Path(argument.rstrip("/")).name
    elif kind == "replay" and argument:
        name = f"replay-{Path(argument).stem}"
    else:
        name = argument or kind
    return safe_name(name)


def safe_name(name: str) -> str:
    """``name`` as one folder-name field: no path separators, no ``__`` (the field separator), no spaces."""
    name = re.sub(r"[/\\\s:]+", "-", name.strip())
    name = re.sub(r"_{2,}", "_", name).strip("-_.")
    if not name:
        raise ValueError("a model name needs at least one letter or digit; pass --model-name NAME")
    return name


@dataclass(frozen=True)
class SuiteRun:
    """Run ``number`` of task ``spec`` by ``model``, recorded in ``folder``."""

    spec: TaskSpec
    model: str
    number: int
    folder: Path

    @property
    def task_file(self) -> str:
        """The trajectory's file name: ``<task>.traj`` (``/`` in a task id becomes ``_``)."""
        return f"{task_stem(self.spec.id)}.traj"

    @property
    def finished(self) -> bool:
        """True when the folder holds the run's end: a trajectory with an exit status and results that did not
        fail."""
        return run_finished(self.folder, self.task_file)


def task_stem(task_id: str) -> str:
    """A task id as a file and folder name field (``mlgym/prisonersDilemma`` -> ``mlgym_prisonersDilemma``)."""
    return task_id.replace("/", "_")


def run_finished(folder: Path, task_file: str) -> bool:
    """True when ``folder`` holds a run that ended: ``results.json`` without ``"failed"`` and a ``.traj`` whose
    ``info`` says how the episode ended. Anything unreadable counts as not finished."""
    try:
        results = json.loads((folder / "results.json").read_text())
        trajectory = json.loads((folder / task_file).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(results, dict) or results.get("failed") or not isinstance(trajectory, dict):
        return False
    info = trajectory.get("info")
    return isinstance(info, dict) and bool(info.get("exit_status"))


def plan(specs: Sequence[TaskSpec], model: str, runs: int, out: Path) -> list[SuiteRun]:
    """Every run of the suite, task by task, each with its folder under ``out``."""
    return [
        SuiteRun(spec, model, number, Path(out) / f"{model}__{task_stem(spec.id)}__run_{number}")
        for spec in specs
        for number in range(runs)
    ]


def batches(pending: Sequence[SuiteRun], size: int) -> Iterator[list[SuiteRun]]:
    """``pending`` in groups of at most ``size`` runs of one task with consecutive numbers (so that env ``i`` of a
    group, seeded ``seed + first + i``, plays run ``first + i``)."""
    group: list[SuiteRun] = []
    for run in pending:
        follows = group and run.spec.id == group[-1].spec.id and run.number == group[-1].number + 1
        if group and (not follows or len(group) == size):
            yield group
            group = []
        group.append(run)
    if group:
        yield group


@dataclass
class SuiteProgress:
    """What a suite has done so far, for a progress display."""

    total: int
    skipped: int = 0
    done: int = 0
    failed: int = 0
    steps: int = 0
    last_scores: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Runs that are over (finished before or now, or failed now)."""
        return self.skipped + self.done + self.failed


ProgressCallback = Callable[[SuiteProgress], None]


def play(
    runs: Sequence[SuiteRun],
    policy: str,
    *,
    num_envs: int = 1,
    engine: str | None = None,
    address: str | None = None,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    on_progress: ProgressCallback | None = None,
    record: dict[str, Any] | None = None,
) -> tuple[SuiteProgress, list[tuple[SuiteRun, EpisodeResult]]]:
    """Play every run of ``runs`` that is not finished yet; return the progress and each played run's result.

    With ``num_envs`` 1 and no ``engine`` the runs are played one by one in this process; otherwise up to
    ``num_envs`` at once through ``parallel.run_episodes`` (``engine`` ``"process"`` or ``"ray"``). Either way a
    policy that gives up (``PolicyError``: the API failed) ends only its run, with MLGym's ``exit_api``, and the suite
    goes on. A run about to be played again loses what its folder held. With ``record`` (the suite's settings record,
    ``settings.start_suite``) each run's folder gets its ``settings.json``.
    """
    pending = [run for run in runs if not run.finished]
    progress = SuiteProgress(total=len(runs), skipped=len(runs) - len(pending))
    played: list[tuple[SuiteRun, EpisodeResult]] = []
    if on_progress is not None:
        on_progress(progress)
    for group in batches(pending, num_envs):
        for run in group:
            if run.folder.exists():
                shutil.rmtree(run.folder)
        first_seed = None if seed is None else seed + group[0].number
        if record is not None:
            for run in group:
                _start_record(run, record, None if seed is None else seed + run.number)
        started = time.monotonic()
        if engine is None and num_envs == 1:
            results = [_play_here(group[0], policy, first_seed, options, progress, on_progress)]
        else:
            results = _play_many(group, policy, engine or "process", address, first_seed, options, progress,
                                 on_progress)
        seconds = time.monotonic() - started  # the runs of a group are played at once: each took the group's time
        for index, run in enumerate(group):
            result = results[index] if index < len(results) else _never_started(run)
            played.append((run, result))
            if record is not None:
                _end_record(run, result, seconds)
            if result.finished and not result.failure:
                progress.done += 1
            else:
                progress.failed += 1
            progress.last_scores = (progress.last_scores + [_score_text(run, result)])[-3:]
        if on_progress is not None:
            on_progress(progress)
    return progress, played


def _play_here(run: SuiteRun, policy_text: str, seed: int | None, options: dict[str, Any] | None,
               progress: SuiteProgress, on_progress: ProgressCallback | None) -> EpisodeResult:
    from ..episode import run_episode
    from ..policies import make_policy
    from ..registry import registry
    from ..trajectories import TrajectoryWriter

    writer = TrajectoryWriter(run.folder, task_stem(run.spec.id), baseline=run.spec.baseline,
                              environment=f"mlgym_registry:{run.spec.backend}")
    policy = GiveUpWithExitApi(make_policy(policy_text, task_id=run.spec.id))
    env = registry.make(run.spec, batch_size=(), **(options or {}))

    def on_turn(turn: Any) -> None:
        progress.steps += 1
        if on_progress is not None:
            on_progress(progress)

    try:
        result = run_episode(env, policy, spec=run.spec, writer=writer, on_turn=on_turn, seed=seed)
        if policy.error:  # as a worker records it (parallel.TextPolicy): the run ended with exit_api, and failed
            result.failure = policy.error
            writer.fail(policy.error, info=result.info)
        return result
    except BaseException as exc:  # the files stay valid and say why the run ended early; a later run redoes it
        if not writer.failure:  # the episode records a policy's failure itself
            writer.fail("interrupted before the episode ended" if isinstance(exc, KeyboardInterrupt)
                        else f"{type(exc).__name__}: {exc}")
        raise
    finally:
        env.close()
        policy.close()


class GiveUpWithExitApi(Policy):
    """A policy that answers MLGym's ``exit_api`` (which autosubmits) once the policy it wraps gives up
    (``PolicyError``), and keeps why in ``error``: what a worker process does (``parallel.TextPolicy``), so one run at a
    time fails the same way as several at once."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.name = policy.name
        self.version = policy.version
        self.error = ""

    def reset(self, spec: Any = None) -> None:
        """Start a new episode."""
        self.error = ""
        self.policy.reset(spec)

    def respond(self, messages: Any) -> str:
        """The wrapped policy's answer, or ``exit_api`` once it gave up."""
        from ..parallel import GAVE_UP_RESPONSE
        from ..policies.base import PolicyError

        if self.error:
            return GAVE_UP_RESPONSE
        try:
            return self.policy(messages)
        except PolicyError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return GAVE_UP_RESPONSE

    def last_generation(self) -> Any:
        """The wrapped policy's (None after it gave up)."""
        return None if self.error else self.policy.last_generation()

    def last_call(self) -> dict[str, Any] | None:
        """The wrapped policy's (None after it gave up)."""
        return None if self.error else self.policy.last_call()

    def stats(self) -> dict[str, Any] | None:
        """The wrapped policy's usage."""
        return self.policy.stats()

    def close(self) -> None:
        """Close the wrapped policy."""
        self.policy.close()


def _start_record(run: SuiteRun, record: dict[str, Any], seed: int | None) -> None:
    from . import settings

    digest = (record.get("tasks") or {}).get(run.spec.id, "")
    settings.write(run.folder / settings.SETTINGS, settings.run_record(
        record, task=run.spec.id, number=run.number, task_digest=digest, seed=seed, max_steps=run.spec.max_steps))


def _end_record(run: SuiteRun, result: EpisodeResult, seconds: float | None = None) -> None:
    """The run's end, wall time, usage and problems in its ``settings.json``; the problems in its ``results.json``
    too."""
    from . import settings
    from .runs import run_problems

    path = run.folder / settings.SETTINGS
    data = settings.read(path) or {}
    status = (result.info or {}).get("exit_status")
    usage = settings.usage_of(result.info)
    problems = run_problems(result.failure or None, str(status) if status else None,
                            (result.info or {}).get("model_stats"))
    data.update(ended=settings.now(), exit_status=status, usage=usage, problems=problems)
    if seconds is not None:
        data["wall_seconds"] = round(seconds, 3)
    settings.write(path, data)
    results = settings.read(run.folder / "results.json")
    if problems and results is not None:
        settings.write(run.folder / "results.json", {**results, "problems": problems})


def _play_many(group: list[SuiteRun], policy: str, engine: str, address: str | None, seed: int | None,
               options: dict[str, Any] | None, progress: SuiteProgress,
               on_progress: ProgressCallback | None) -> list[EpisodeResult]:
    from ..parallel import run_episodes

    out = group[0].folder.parent
    steps_before = progress.steps

    def on_step(finished: int, steps: int) -> None:
        progress.steps = steps_before + steps
        if on_progress is not None:
            on_progress(progress)

    return run_episodes(group[0].spec, policy, len(group), engine=engine, address=address, out=out, seed=seed,
                        on_step=on_step, options=options, folders=lambda index, number: group[index].folder.name)


def _never_started(run: SuiteRun) -> EpisodeResult:
    result = EpisodeResult(run.spec)
    result.failure = "the run never started"
    return result


def _score_text(run: SuiteRun, result: EpisodeResult) -> str:
    """``task#k: Score=0.91`` (or why the run did not end)."""
    head = f"{run.spec.id}#{run.number}"
    if result.failure:
        return f"{head}: failed"
    score = result.score
    if not score:
        return f"{head}: no score"
    metric = result.metric or next(iter(score))
    value = score.get(metric, next(iter(score.values())))
    return f"{head}: {metric}={value:.4g}"
