"""Suite runs: K runs of each of several tasks with one policy, in MLGym's layout, resumable.

Every run has its own folder ``<out>/<model>__<task>__run_<k>/`` holding ``<task>.traj`` and ``results.json``, as
MLGym's own runs do (the model is the folder name's first ``__``-separated field, which is what ``report`` reads).
A run is finished when its trajectory records how the episode ended (``info.exit_status``) and its ``results.json``
does not say it failed; running the same suite again into the same folder skips finished runs and plays the others
again from scratch (runs that were interrupted, failed or never started). Run ``k`` of a task is seeded
``seed + k`` wherever it is played, so a resumed suite plays exactly the runs a complete one would have.

Several runs at once are played by one pool of worker processes started for the whole suite
(``workers.WorkerPool``): each worker plays a run as this process would (``_play_run``) and takes the next pending
run, of any task, as soon as it is done, so the pool stays full across tasks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..episodes.episode import EpisodeResult
from ..policies.give_up import GiveUpWithExitApi
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
    in_flight: int = 0
    """Runs being played right now."""
    cost: float = 0.0
    """What the runs played in this session have cost so far (USD, ``task_cost``), those still going included."""

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

    With ``num_envs`` 1 and no ``engine`` the runs are played one by one in this process. With ``engine``
    ``"process"`` ``num_envs`` worker processes, started once for the suite, play them: each worker takes the next
    pending run (of whichever task) as soon as it is done with one, so ``num_envs`` runs are always going until
    fewer are left (``_play_pooled``). With ``engine`` ``"ray"`` they are played ``num_envs`` at a time, one task at a
    time, through ``scale.runs.run_episodes``. However it is played, run ``k`` is seeded ``seed + k`` and a policy
    that gives up (``PolicyError``: the API failed) ends only its run, with MLGym's ``exit_api``, and the suite goes
    on. A run about to be played again loses what its folder held. With ``record`` (the suite's settings record,
    ``settings.start_suite``) each run's folder gets its ``settings.json``.
    """
    pending = [run for run in runs if not run.finished]
    progress = SuiteProgress(total=len(runs), skipped=len(runs) - len(pending))
    played: list[tuple[SuiteRun, EpisodeResult]] = []
    if on_progress is not None:
        on_progress(progress)
    if engine == "ray":
        _play_batches(pending, policy, num_envs, address, seed, options, record, progress, on_progress, played)
    elif engine is None and num_envs == 1:
        for run in pending:
            progress.in_flight = 1
            result = _play_run(run, policy, _run_seed(seed, run), options, record, _counting_turns(progress,
                                                                                                    on_progress))
            _count(progress, played, run, result, on_progress)
        progress.in_flight = 0
    elif pending:
        _play_pooled(pending, policy, num_envs, seed, options, record, progress, on_progress, played)
    order = {run.folder: index for index, run in enumerate(runs)}
    played.sort(key=lambda pair: order[pair[0].folder])  # workers end their runs in any order
    return progress, played


def _run_seed(seed: int | None, run: SuiteRun) -> int | None:
    return None if seed is None else seed + run.number


def _counting_turns(progress: SuiteProgress, on_progress: ProgressCallback | None) -> Callable[[float], None]:
    """``on_turn(cost)`` for a run played in this process: the steps and the run's cost so far in ``progress``."""
    cost_before = progress.cost

    def on_turn(cost: float) -> None:
        progress.steps += 1
        progress.cost = cost_before + cost
        if on_progress is not None:
            on_progress(progress)

    return on_turn


def _count(progress: SuiteProgress, played: list[tuple[SuiteRun, EpisodeResult]], run: SuiteRun,
           result: EpisodeResult, on_progress: ProgressCallback | None) -> None:
    """Count a run that is over into ``progress`` and ``played``."""
    played.append((run, result))
    if result.finished and not result.failure:
        progress.done += 1
    else:
        progress.failed += 1
    progress.last_scores = (progress.last_scores + [_score_text(run, result)])[-3:]
    if on_progress is not None:
        on_progress(progress)


def _play_run(run: SuiteRun, policy: str, seed: int | None, options: dict[str, Any] | None,
              record: dict[str, Any] | None, on_turn: Callable[[float], None] | None = None) -> EpisodeResult:
    """Play ``run`` from scratch in this process (its folder emptied first), with its ``settings.json`` opened before
    and closed after when ``record`` is given; ``on_turn(cost so far)`` after every turn."""
    if run.folder.exists():
        shutil.rmtree(run.folder)
    if record is not None:
        _start_record(run, record, seed, os.getpid())
    started = time.monotonic()
    result = _play_here(run, policy, seed, options, on_turn)
    if record is not None:
        _end_record(run, result, time.monotonic() - started)
    return result


def _play_here(run: SuiteRun, policy_text: str, seed: int | None, options: dict[str, Any] | None,
               on_turn: Callable[[float], None] | None = None) -> EpisodeResult:
    from ..episodes.episode import run_episode
    from ..policies import make_policy
    from ..records.trajectories import TrajectoryWriter
    from ..registry import registry

    writer = TrajectoryWriter(run.folder, task_stem(run.spec.id), baseline=run.spec.baseline,
                              environment=f"mlgym_registry:{run.spec.backend}")
    policy = GiveUpWithExitApi(make_policy(policy_text, task_id=run.spec.id))
    env = registry.make(run.spec, batch_size=(), **(options or {}))

    def turned(turn: Any) -> None:
        if on_turn is not None:
            on_turn(_cost_of(turn.info))

    try:
        result = run_episode(env, policy, spec=run.spec, writer=writer, on_turn=turned, seed=seed)
        if policy.error:  # as a worker records it (collectors.TextPolicy): the run ended with exit_api, and failed
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


def _cost_of(info: dict[str, Any] | None) -> float:
    """The ``task_cost`` of an episode's ``info`` so far (0 when its policy keeps no usage)."""
    cost = ((info or {}).get("model_stats") or {}).get("task_cost")
    return float(cost) if isinstance(cost, (int, float)) else 0.0


def _start_record(run: SuiteRun, record: dict[str, Any], seed: int | None, pid: int | None = None) -> None:
    from . import settings

    digest = (record.get("tasks") or {}).get(run.spec.id, "")
    settings.write(run.folder / settings.SETTINGS, settings.run_record(
        record, task=run.spec.id, number=run.number, task_digest=digest, seed=seed, max_steps=run.spec.max_steps,
        pid=pid))


def _end_record(run: SuiteRun, result: EpisodeResult, seconds: float | None = None) -> None:
    """The run's end, wall time, usage and problems in its ``settings.json``; the problems in its ``results.json``
    too."""
    from ..backends.protocol import infra_errors
    from . import settings
    from .runs import run_problems

    path = run.folder / settings.SETTINGS
    data = settings.read(path) or {}
    status = (result.info or {}).get("exit_status")
    usage = settings.usage_of(result.info)
    problems = run_problems(result.failure or None, str(status) if status else None,
                            (result.info or {}).get("model_stats"), infra_errors(result.info or {}))
    data.update(ended=settings.now(precise=True), exit_status=status, usage=usage, problems=problems)
    if result.worker.get("pid") is not None:  # a Ray actor's
        data["pid"] = result.worker["pid"]
    if seconds is not None:
        data["wall_seconds"] = round(seconds, 3)
    settings.write(path, data)
    results = settings.read(run.folder / "results.json")
    if problems and results is not None:
        settings.write(run.folder / "results.json", {**results, "problems": problems})


# -- several runs at once: one pool of worker processes for the whole suite ------------------------------------------
WAIT = 0.5
"""Seconds between two looks at whether a worker died, while no worker reports anything."""


def _play_pooled(pending: Sequence[SuiteRun], policy: str, num_envs: int, seed: int | None,
                 options: dict[str, Any] | None, record: dict[str, Any] | None, progress: SuiteProgress,
                 on_progress: ProgressCallback | None, played: list[tuple[SuiteRun, EpisodeResult]]) -> None:
    """Play ``pending`` on ``num_envs`` worker processes started once: a worker done with a run gets the next
    pending one at once, whatever its task, so there is no wait between tasks. Each worker records its runs itself
    (``_play_job``), exactly as a run played here is recorded; a worker that dies fails only its run and is
    replaced."""
    from ..scale.workers import WorkerPool

    queue = list(reversed(pending))
    running: dict[int, SuiteRun] = {}
    costs: dict[int, float] = {}
    spent = progress.cost  # by the runs that are over

    def dispatch() -> None:
        for slot in range(len(pool.processes)):
            if queue and slot not in running:
                running[slot] = run = queue.pop()
                costs[slot] = 0.0
                pool.give(slot, _job(run, policy, _run_seed(seed, run), options, record))
        progress.in_flight = len(running)

    pool = WorkerPool(min(num_envs, len(pending)), _play_job)
    interrupted = True
    try:
        while queue or running:
            dispatch()
            message = pool.receive(WAIT)
            if message is None:
                _fail_dead_workers(pool, running, progress, played, on_progress, more=bool(queue))
                continue
            slot, kind, payload = message
            if kind == "event":
                progress.steps += 1
                costs[slot] = payload[0]
                progress.cost = spent + sum(costs.values())
                if on_progress is not None:
                    on_progress(progress)
                continue
            run = running.pop(slot)
            result = _received(run, kind, payload, record)
            costs.pop(slot)
            spent += _cost_of(result.info)
            dispatch()  # before the count: the next run is in flight as soon as this one is over
            progress.cost = spent + sum(costs.values())
            _count(progress, played, run, result, on_progress)
        interrupted = False
    finally:
        progress.in_flight = 0
        pool.close(interrupt=interrupted)


def _job(run: SuiteRun, policy: str, seed: int | None, options: dict[str, Any] | None,
         record: dict[str, Any] | None) -> dict[str, Any]:
    """What a worker needs to play ``run`` (``_play_job``): plain data, the spec as ``TaskSpec.to_dict()``."""
    return {"spec": run.spec.to_dict(), "model": run.model, "number": run.number, "folder": str(run.folder),
            "policy": policy, "seed": seed, "options": options, "record": record}


def _play_job(job: dict[str, Any], report: Callable[..., None]) -> EpisodeResult:
    """In a worker: play the run ``job`` describes (``_play_run``), reporting ``(cost so far,)`` after every turn.

    A run that raises fails alone: its files and its ``settings.json`` say why, and the worker goes on. The result
    travels without its spec (the owner has it)."""
    run = SuiteRun(TaskSpec.from_dict(job["spec"]), job["model"], job["number"], Path(job["folder"]))
    started = time.monotonic()
    try:
        result = _play_run(run, job["policy"], job["seed"], job["options"], job["record"], report)
    except Exception as exc:
        result = EpisodeResult(run.spec, failure=f"{type(exc).__name__}: {exc}")
        if job["record"] is not None:
            _end_record(run, result, time.monotonic() - started)
    return dataclasses.replace(result, spec=None)


def _received(run: SuiteRun, kind: str, payload: Any, record: dict[str, Any] | None) -> EpisodeResult:
    """The result a worker sent for ``run`` (``"done"``), or a failed one for a job that raised (``"error"``)."""
    if kind == "done":
        payload.spec = run.spec
        return payload
    result = EpisodeResult(run.spec, failure=f"its worker failed: {payload}")
    if record is not None:
        _end_record(run, result)
    return result


def _fail_dead_workers(pool: Any, running: dict[int, SuiteRun], progress: SuiteProgress,
                       played: list[tuple[SuiteRun, EpisodeResult]], on_progress: ProgressCallback | None,
                       more: bool) -> None:
    """Fail the run of each worker that died, and start another worker in its place when runs are left."""
    for slot, code in pool.dead():
        run = running.pop(slot, None)
        if run is not None:
            result = EpisodeResult(run.spec, failure=f"its worker process died (exit code {code})")
            if (run.folder / "settings.json").exists():
                _end_record(run, result)
            _count(progress, played, run, result, on_progress)
        if more:
            pool.restart(slot)


# -- Ray: runs of one task at a time ---------------------------------------------------------------------------------
def _play_batches(pending: Sequence[SuiteRun], policy: str, num_envs: int, address: str | None, seed: int | None,
                  options: dict[str, Any] | None, record: dict[str, Any] | None, progress: SuiteProgress,
                  on_progress: ProgressCallback | None, played: list[tuple[SuiteRun, EpisodeResult]]) -> None:
    """Play ``pending`` as Ray actors, ``num_envs`` runs of one task at a time (``batches``)."""
    for group in batches(pending, num_envs):
        for run in group:
            if run.folder.exists():
                shutil.rmtree(run.folder)
            if record is not None:
                _start_record(run, record, _run_seed(seed, run))
        started = time.monotonic()
        progress.in_flight = len(group)
        results = _play_many(group, policy, "ray", address, _run_seed(seed, group[0]), options, progress,
                             on_progress)
        seconds = time.monotonic() - started  # the runs of a group are played at once: each took the group's time
        progress.in_flight = 0
        for index, run in enumerate(group):
            result = results[index] if index < len(results) else _never_started(run)
            if record is not None:
                _end_record(run, result, seconds)
            progress.cost += _cost_of(result.info)
            _count(progress, played, run, result, on_progress)


def _play_many(group: list[SuiteRun], policy: str, engine: str, address: str | None, seed: int | None,
               options: dict[str, Any] | None, progress: SuiteProgress,
               on_progress: ProgressCallback | None) -> list[EpisodeResult]:
    from ..scale.runs import run_episodes

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
