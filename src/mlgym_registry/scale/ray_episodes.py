"""Several episodes at once on a Ray cluster: one Ray actor per env, each rebuilding its env from the task's spec.

The driver (this process) checks the task, its components and the options before any actor starts, then starts
``num_envs`` actors (``EpisodeWorker``), spread over the cluster's nodes. Each actor loads the plugins through the
same entry points as the driver, builds ``registry.make(TaskSpec.from_dict(spec), **options)`` and plays its
episodes one turn per call, so that every turn reaches the driver as soon as it is played. The driver writes each
episode's ``.traj`` and ``results.json`` as it goes, in the same layout as ``runs.run_parallel``.

Faults: an actor that dies (killed, out of memory, its node lost) fails the episode it was playing, with the reason
in that episode's ``results.json``; a fresh actor takes over the slot's remaining episodes and the other slots go on.
An exception inside an episode (the env or the policy raised) fails that episode only. On an interrupt the actors are
killed, each episode being played is marked failed ("interrupted"), and every file stays valid JSON. The local
backend's folders of killed actors are removed on every node they ran on.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..episodes.episode import EpisodePlayer, EpisodeResult, Turn
from ..records.recorder import Call, CallRecorder, replay
from ..records.trajectories import TrajectoryWriter
from ..specs import TaskSpec
from .run_plan import EpisodeRun

SWEEP_WAIT = 10.0
"""Seconds a clean-up task waits for killed actors' processes to exit before removing their folders."""

@dataclass(frozen=True)
class Report:
    """What a worker sends back for each call: the recorder calls since the last one (``records.recorder.Call``),
    the plugin problems it saw, the run's provenance record (with an episode's first report), the turn it played,
    and, once the episode is over, its ``end`` (finished, stop reason, final info and ``failure``: why it could not go
    on, or why its policy gave up)."""

    calls: tuple[Call, ...] = ()
    warnings: tuple[str, ...] = ()
    provenance: dict[str, Any] | None = None
    turn: Turn | None = None
    end: EpisodeResult | None = None


class EpisodeWorker:
    """The body of a Ray actor: one env, rebuilt from a task spec, and a text policy next to it (built as a worker
    process builds them: ``frames.build_env_and_policy``).

    ``start(seed)`` resets the env for a new episode, ``turn()`` plays one turn; each returns a ``Report`` of what
    the episode's ``EpisodeRecorder`` was told since the last call. The env lives as long as the actor (``close()``
    closes it).
    """

    def __init__(self, spec: dict[str, Any], options: dict[str, Any], policy: str, known_problems: list[str]):
        from ..registry import registry
        from .frames import build_env_and_policy

        self.spec = TaskSpec.from_dict(spec)
        self.problems = tuple(str(error) for error in registry.load_errors() if str(error) not in known_problems)
        self.env, self.policy = build_env_and_policy(self.spec, dict(options), policy)
        self.recorder = CallRecorder()
        self.player: EpisodePlayer | None = None

    def where(self) -> dict[str, Any]:
        """The node id, host name and process id this worker runs on."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": os.getpid()}

    def start(self, seed: int | None) -> Report:
        """Begin an episode."""
        warned, self.problems = self.problems, ()
        self.recorder = CallRecorder()
        self.player = EpisodePlayer(self.env, self.policy, spec=self.spec, writer=self.recorder, seed=seed)
        self.player.start()
        return Report(self.recorder.take(), warned, provenance=self.recorder.provenance)

    def turn(self) -> Report:
        """Play the next turn; the report has an ``end`` once the episode is over. An exception inside the episode
        (the env or the policy raised) ends it as failed, with the failure the player recorded."""
        try:
            turn = self.player.play_turn()
        except Exception as exc:  # the episode fails alone
            failure = self.player.result.failure or f"{type(exc).__name__}: {exc}"
            return Report(self.recorder.take(), end=self._end(failure))
        if turn is None or turn.done:
            return Report(self.recorder.take(), turn=turn, end=self._end(self.policy.error))
        return Report(self.recorder.take(), turn=turn)

    def _end(self, failure: str) -> EpisodeResult:
        result = self.player.result
        return EpisodeResult(result.spec, [], result.info, result.finished, result.stop_reason, failure)

    def close(self) -> None:
        """Close the env and the policy."""
        self.env.close()
        self.policy.close()


def sweep_local_workspaces(workspace_dir: str | None, pids: list[int], wait: float = SWEEP_WAIT) -> int:
    """Remove the local backend's folders whose owners are gone, once ``pids`` (killed workers) have exited.

    Runs on a node (as a Ray task) after actors there were killed; returns how many of ``pids`` were still alive
    when the wait ran out.
    """
    import tempfile

    from ..backends.local.resources import sweep_orphans

    deadline = time.monotonic() + wait
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        if alive:
            time.sleep(0.1)
    sweep_orphans(Path(workspace_dir or tempfile.gettempdir()))
    return len(alive)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Slot:
    """One env slot: its actor, the episode it is playing and how many it has played."""

    index: int
    actor: Any = None
    where: dict[str, Any] = field(default_factory=dict)
    number: int = 0
    result: EpisodeResult | None = None
    writer: TrajectoryWriter | None = None
    done: list[EpisodeResult] = field(default_factory=list)


class RayEpisodeRunner:
    """Plays episodes of one task on Ray; see ``run_ray_episodes``."""

    def __init__(self, run: EpisodeRun, cpus_per_env: float):
        import ray

        self.ray, self.plan, self.spec = ray, run, run.spec
        self.per_env, self.on_step = run.episodes_per_env, run.on_step
        self.worker_class = ray.remote(EpisodeWorker).options(num_cpus=cpus_per_env, scheduling_strategy="SPREAD",
                                                              max_restarts=0)
        self.slots = [_Slot(index) for index in range(run.num_envs)]
        self.pending: dict[Any, _Slot] = {}
        self.steps = 0
        self.warned: set[str] = set()
        self.killed: dict[str, list[int]] = {}  # node id -> pids of actors killed there

    @property
    def finished(self) -> int:
        """Episodes over so far (finished or failed)."""
        return sum(len(slot.done) for slot in self.slots)

    def run(self) -> list[EpisodeResult]:
        """Play every episode; on an interrupt, stop the actors and mark the episodes being played as failed."""
        try:
            for slot in self.slots:
                self._begin(slot)
            while self.pending:
                ready, _ = self.ray.wait(list(self.pending), num_returns=1)
                for ref in ready:
                    self._receive(self.pending.pop(ref), ref)
        except BaseException:
            self._abandon("interrupted before the episode ended")
            raise
        finally:
            self._close_all()
        return [result for slot in self.slots for result in slot.done]

    # -- one slot --------------------------------------------------------------------------------------------------
    def _begin(self, slot: _Slot) -> None:
        """Start the slot's next episode (and its actor, when it has none)."""
        if slot.actor is None:
            slot.actor = self.worker_class.remote(self.spec.to_dict(), self.plan.options, self.plan.policy,
                                                 self.plan.known_problems)
            slot.where = {}
            self._ask(slot, slot.actor.where.remote())
        slot.result = EpisodeResult(self.spec)
        slot.writer = self.plan.writer(slot.index, slot.number)
        self._ask(slot, slot.actor.start.remote(self.plan.seed_of(slot.index, slot.number)))

    def _ask(self, slot: _Slot, ref: Any) -> None:
        self.pending[ref] = slot

    def _receive(self, slot: _Slot, ref: Any) -> None:
        try:
            reply = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:
            self._fail(slot, f"its Ray actor died: {_death_reason(exc)}", dead=True)
            return
        except self.ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None) or exc
            self._fail(slot, f"{type(cause).__name__}: {cause}", dead=False)
            return
        if isinstance(reply, dict):  # where the actor runs (asked when it starts)
            slot.where = reply
            return
        ended = self._apply(slot, reply)
        if not ended:
            self._ask(slot, slot.actor.turn.remote())

    def _apply(self, slot: _Slot, report: Report) -> bool:
        """Record a worker's report; whether the episode ended."""
        writer, result = slot.writer, slot.result
        for problem in report.warnings:
            self._warn(problem)
        if writer is not None and report.provenance is not None:
            writer.provenance = report.provenance
        replay(report.calls, writer)
        if report.turn is not None:
            result.turns.append(report.turn)
            if report.turn.info is not None:
                result.info = report.turn.info
            self.steps += 1
            if self.on_step is not None:
                self.on_step(self.finished, self.steps)
        if report.end is None:
            return False
        end = report.end
        result.info = end.info or result.info
        result.finished, result.stop_reason, result.failure = end.finished, end.stop_reason, end.failure
        if end.failure and writer is not None and writer.failure != end.failure:
            # the policy gave up (the episode ended with exit_api), or the env raised before the player recorded it
            writer.fail(end.failure, info=result.info)
        self._episode_over(slot)
        return True

    def _episode_over(self, slot: _Slot) -> None:
        slot.result.worker = dict(slot.where)
        slot.done.append(slot.result)
        slot.result, slot.writer = None, None
        slot.number += 1
        if self.on_step is not None:
            self.on_step(self.finished, self.steps)
        if slot.number < self.per_env:
            self._begin(slot)

    def _fail(self, slot: _Slot, reason: str, *, dead: bool) -> None:
        """The slot's episode cannot go on: record why, then go on with a fresh actor if the old one died."""
        for ref in [ref for ref, owner in self.pending.items() if owner is slot]:
            del self.pending[ref]
        if dead:
            self._forget_actor(slot)
        if slot.result is None:  # the actor died between episodes (asked where it runs): start the next one afresh
            self._begin(slot)
            return
        slot.result.failure = reason
        if slot.writer is not None:
            slot.writer.fail(reason)
        self._episode_over(slot)

    def _forget_actor(self, slot: _Slot) -> None:
        if slot.where:
            self.killed.setdefault(slot.where["node_id"], []).append(slot.where["pid"])
        slot.actor = None

    # -- the end ---------------------------------------------------------------------------------------------------
    def _abandon(self, reason: str) -> None:
        """Mark every episode being played as failed (its files stay valid) and kill the actors."""
        self.pending.clear()
        for slot in self.slots:
            if slot.result is not None:
                slot.result.failure = reason
                slot.result.worker = dict(slot.where)
                if slot.writer is not None:
                    slot.writer.fail(reason)
                slot.done.append(slot.result)
                slot.result = None
            if slot.actor is not None:
                self.ray.kill(slot.actor, no_restart=True)
                self._forget_actor(slot)

    def _close_all(self) -> None:
        """Close every actor's env (which removes its folders), kill the actors, and sweep the folders of any that
        died or were killed before they could close it."""
        closing = {slot.actor.close.remote(): slot for slot in self.slots if slot.actor is not None}
        if closing:
            ready, _ = self.ray.wait(list(closing), num_returns=len(closing), timeout=30)
            for ref, slot in closing.items():
                if ref not in ready:
                    self._forget_actor(slot)
                self.ray.kill(slot.actor, no_restart=True)
                slot.actor = None
        self._sweep()

    def _sweep(self) -> None:
        if not self.killed or self.spec.backend != "local":
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        sweep = self.ray.remote(sweep_local_workspaces)
        alive = {node["NodeID"] for node in self.ray.nodes() if node.get("Alive")}
        workspace_dir = self.spec.backend_options.get("workspace_dir")
        refs = [sweep.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(workspace_dir, pids) for node, pids in self.killed.items() if node in alive]
        self.ray.wait(refs, num_returns=len(refs), timeout=SWEEP_WAIT + 20)
        self.killed.clear()

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _warn(self, problem: str) -> None:
        if problem not in self.warned:
            self.warned.add(problem)
            warnings.warn(f"in a Ray worker: {problem}", RuntimeWarning, stacklevel=2)


def _death_reason(exc: Exception) -> str:
    """A short reason for an actor's death, from Ray's long message: why it died (its process or its node), the
    exit type and the process, or the constructor's exception when the actor could not be built."""
    import re

    import ray

    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return "out of memory (Ray's memory monitor killed it)"
    text = str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if getattr(exc, "actor_init_failed", False) or "creation task" in lines[0]:
        return f"it could not be built: {lines[-1][:300]}"
    because = re.search(r"The actor is dead because ([^.]*)\.", text)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    pid = re.search(r"\bpid: (\d+)", text)
    reason = because.group(1) if because else lines[0].rstrip(".")[:300]
    details = [f"exit type {exit_type.group(1)}" if exit_type else "", f"pid {pid.group(1)}" if pid else ""]
    details = [detail for detail in details if detail]
    return reason + (f" ({', '.join(details)})" if details else "")


def check_ray_options(cpus_per_env: float | None) -> None:
    """Ray can be imported, and ``cpus_per_env`` (when given) is a share above 0: said before anything starts."""
    from ..options import InvalidOptionError
    from .ray_runtime import import_ray

    import_ray()
    if cpus_per_env is not None and not cpus_per_env > 0:
        raise InvalidOptionError(f"cpus_per_env={cpus_per_env!r}: each actor needs a CPU share above 0 (e.g. 0.5)")


def run_ray_episodes(run: EpisodeRun, *, address: str | None = None,
                     cpus_per_env: float | None = None) -> list[EpisodeResult]:
    """Play ``run`` (``runs.run_episodes``, which checks it and ``check_ray_options``) as Ray actors and return the
    results in slot order.

    ``address`` is an existing cluster (``host:port``, ``ray://host:port`` or ``auto``); without one a local runtime
    is started for the run and stopped at the end (an already initialised Ray is used as it is). ``cpus_per_env`` is
    each actor's CPU request: by default what lets every env run at once on the cluster's nodes (at most 1); more than
    the largest node has is refused (``RayResourceError``).
    """
    from .ray_resources import RayResourceError, cpus_per_collector
    from .ray_runtime import ray_session

    with ray_session(address) as session:
        largest = session.largest_node_cpus()
        if cpus_per_env is None:
            cpus_per_env = cpus_per_collector(run.num_envs)  # 1 CPU each, or the share that lets every env run at once
        elif cpus_per_env > largest:
            raise RayResourceError(f"cpus_per_env={cpus_per_env:g} is more than the largest node of the cluster has "
                                   f"({largest:g} CPUs): no actor could ever start; ask for at most {largest:g}")
        return RayEpisodeRunner(run, cpus_per_env).run()
