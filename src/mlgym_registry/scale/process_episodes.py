"""Several episodes at once on one machine: worker processes (``workers.WorkerPool``, forked warm), one per core
by default, each playing its envs' episodes itself (several envs of a worker each in a thread of its own) and sending
every step to this process, which records them.

Each env plays its episodes one after another, as a run in one process plays its episode (``EpisodePlayer``:
``frames.play_env``), and its worker reports a numbered frame per step on its pipe to this process. A worker waits
while its pipe is full: nothing is dropped however long this process takes to read, so a loaded machine only slows
the run down. The receiver (``frame_receiver``) still checks each episode's frames and records any episode it did
not fully get (its worker died, or raised) as an ``infra_error``, never as the agent's outcome; a worker that dies is
replaced and plays its envs' remaining episodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..episodes.episode import EpisodeResult
from ..machine import usable_cores
from .frame_receiver import FrameReceiver
from .frames import JOB_END, EnvJob, play_envs
from .run_plan import EpisodeRun

WAIT = 0.5
"""Seconds the pool's queue is waited on at a time."""

DEATH_CHECK = 2.0
"""Seconds between two looks at whether a worker died, while frames keep coming."""



def run_process_episodes(run: EpisodeRun, *, workers: int | None = None) -> list[EpisodeResult]:
    """Play ``run`` (``runs.run_episodes``, which checks it) in worker processes; an episode our machinery lost has
    a ``failure`` starting with ``infra_error:`` (``frame_receiver.is_infra_failure``).

    ``workers``: how many worker processes play the envs (default: one per core this process may use, at most one
    per env); env ``i`` plays in worker ``i % workers``, each of a worker's envs in a thread of its own.
    """
    from ..options import InvalidOptionError

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InvalidOptionError(f"workers={workers!r}: give a number of worker processes, 1 or more")
    receiver = FrameReceiver(run)

    def job(env: int) -> EnvJob:
        numbers = tuple(receiver.remaining(env))
        seeds = tuple(run.seed_of(env, number) for number in numbers)
        return EnvJob(run.spec.to_dict(), run.options, run.policy, env, numbers, seeds, run.known_problems)

    count = min(run.num_envs, workers or usable_cores())
    _play([list(range(slot, run.num_envs, count)) for slot in range(count)], receiver, job)
    receiver.close("its worker ended before the episode did")  # nothing is left by now, unless a worker misbehaved
    return receiver.results()


def _play(groups: list[list[int]], receiver: FrameReceiver, job: Callable[[int], EnvJob]) -> None:
    """Start a worker per group of envs, give each the jobs of its envs, and receive until every job is over."""
    from .workers import WorkerPool

    pool = WorkerPool(len(groups), play_envs)
    running = {env for group in groups for env in group}
    for slot, group in enumerate(groups):
        pool.give(slot, tuple(job(env) for env in group))
    interrupted = True
    try:
        checked = time.monotonic()
        while running:
            message = pool.receive(WAIT)
            if message is not None:
                _handle(message, groups, receiver, running)
            if message is None or time.monotonic() - checked > DEATH_CHECK:
                checked = time.monotonic()
                _replace_dead(pool, groups, receiver, running, job)
        interrupted = False
    except BaseException:
        receiver.interrupt("interrupted before the episode ended")
        raise
    finally:
        pool.close(interrupt=interrupted)


def _handle(message: tuple[int, str, Any], groups: list[list[int]], receiver: FrameReceiver,
            running: set[int]) -> None:
    """One message of the pool: a frame, the end of one env's job, or the end of a worker's jobs."""
    slot, kind, payload = message
    if kind == "event":
        frame = payload[0]
        if frame.kind == JOB_END:
            error = frame.data.get("error")
            _job_over(frame.env, f"its worker failed: {error}" if error else "its worker ended its job", receiver,
                      running)
        else:
            receiver.receive(frame)
        return
    reason = "its worker ended its job" if kind == "done" else f"its worker failed: {payload}"
    for env in groups[slot]:
        _job_over(env, reason, receiver, running)


def _job_over(env: int, reason: str, receiver: FrameReceiver, running: set[int]) -> None:
    """Env ``env``'s job ended: what it did not play is lost, for ``reason``."""
    running.discard(env)
    while receiver.next_episode(env) is not None:
        receiver.lose_env(env, reason)


def _replace_dead(pool: Any, groups: list[list[int]], receiver: FrameReceiver, running: set[int],
                  job: Callable[[int], EnvJob]) -> None:
    """Lose the episode each env of a worker that died was playing (after reading what it sent before), and start a
    worker that plays those envs' remaining episodes in its place."""
    for slot, code in pool.dead():
        if not running.intersection(groups[slot]):
            continue
        for message in pool.drain(slot):
            _handle(message, groups, receiver, running)
        left = []
        for env in groups[slot]:
            if env not in running:  # its job had ended after all
                continue
            receiver.lose_env(env, f"its worker process died (exit code {code})")
            if receiver.next_episode(env) is None:
                running.discard(env)
            else:
                left.append(env)
        if left:
            pool.restart(slot)
            pool.give(slot, tuple(job(env) for env in left))
