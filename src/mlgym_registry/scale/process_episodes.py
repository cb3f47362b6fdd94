"""Several episodes at once on one machine: one worker process per env (``workers.WorkerPool``, forked warm), each
playing its env's episodes itself and sending every step to this process, which records them.

Each worker plays its episodes one after another, as a run in one process plays its episode (``EpisodePlayer``:
``episode_frames.play_env``), and reports a numbered frame per step on its pipe to this process. A worker waits
while its pipe is full: nothing is dropped however long this process takes to read, so a loaded machine only slows
the run down. The receiver (``frame_receiver``) still checks each episode's frames and records any episode it did
not fully get (its worker died, or raised) as an ``infra_error``, never as the agent's outcome; a worker that dies is
replaced and plays the env's remaining episodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..episodes.episode import EpisodeResult
from ..episodes.folders import FolderName
from ..specs import TaskSpec
from .frame_receiver import FrameReceiver
from .frames import EnvJob, play_env

WAIT = 0.5
"""Seconds the pool's queue is waited on at a time."""

DEATH_CHECK = 2.0
"""Seconds between two looks at whether a worker died, while frames keep coming."""



def run_process_episodes(
    spec: TaskSpec | str,
    policy: Any,
    num_envs: int,
    *,
    out: Path | None = None,
    seed: int | None = None,
    on_step: Callable[[int, int], None] | None = None,
    options: dict[str, Any] | None = None,
    episodes_per_env: int = 1,
    folders: FolderName | None = None,
) -> list[EpisodeResult]:
    """Play ``num_envs * episodes_per_env`` episodes, ``num_envs`` at once in worker processes, and return their
    results in env order (each env's in episode order).

    Env ``i``'s episode ``k`` is seeded ``seed + k * num_envs + i`` and written to ``out/env<i>/`` (one episode per
    env) or ``out/env<i>-<k>/`` (or what ``folders`` names), its ``.traj`` and ``results.json`` saved at every step.
    ``on_step(episodes_over, steps_so_far)`` is called as steps arrive. An episode our machinery lost has a
    ``failure`` starting with ``infra_error:`` (``frame_receiver.is_infra_failure``).
    """
    from ..options import check_option
    from ..registry import registry

    spec = registry.spec(spec)
    registry.resolve(spec)  # an unknown component or option fails here, before any worker starts
    check_option("seed", seed)
    options = {"batch_size": (), **(options or {})}
    known = tuple(str(error) for error in registry.load_errors())
    receiver = FrameReceiver(spec, num_envs, episodes_per_env, out=out, folders=folders, on_step=on_step)

    def job(env: int) -> EnvJob:
        numbers = tuple(receiver.remaining(env))
        seeds = tuple(None if seed is None else seed + number * num_envs + env for number in numbers)
        return EnvJob(spec.to_dict(), options, policy, env, numbers, seeds, known)

    _play(num_envs, receiver, job)
    receiver.close("its worker ended before the episode did")  # nothing is left by now, unless a worker misbehaved
    return receiver.results()


def _play(num_envs: int, receiver: FrameReceiver, job: Callable[[int], EnvJob]) -> None:
    """Start a worker per env, give each its env's job, and receive until every job is over."""
    from .workers import WorkerPool

    pool = WorkerPool(num_envs, play_env)
    running = set(range(num_envs))
    for env in running:
        pool.give(env, job(env))
    interrupted = True
    try:
        checked = time.monotonic()
        while running:
            message = pool.receive(WAIT)
            if message is not None:
                _handle(message, receiver, running)
            if message is None or time.monotonic() - checked > DEATH_CHECK:
                checked = time.monotonic()
                _replace_dead(pool, receiver, running, job)
        interrupted = False
    except BaseException:
        receiver.interrupt("interrupted before the episode ended")
        raise
    finally:
        pool.close(interrupt=interrupted)


def _handle(message: tuple[int, str, Any], receiver: FrameReceiver, running: set[int]) -> None:
    """One message of the pool: a frame, or the end of an env's job."""
    env, kind, payload = message
    if kind == "event":
        receiver.receive(payload[0])
        return
    running.discard(env)
    reason = "its worker ended its job" if kind == "done" else f"its worker failed: {payload}"
    while receiver.next_episode(env) is not None:  # a job that ended early: what it did not play is lost
        receiver.lose_env(env, reason)


def _replace_dead(pool: Any, receiver: FrameReceiver, running: set[int], job: Callable[[int], EnvJob]) -> None:
    """Lose the episode of each worker that died (after reading what it sent before), and start a worker that
    plays the env's remaining episodes in its place."""
    for env, code in pool.dead():
        if env not in running:
            continue
        for message in pool.drain(env):
            _handle(message, receiver, running)
        if env not in running:  # its job had ended after all
            continue
        receiver.lose_env(env, f"its worker process died (exit code {code})")
        if receiver.next_episode(env) is None:
            running.discard(env)
            continue
        pool.restart(env)
        pool.give(env, job(env))
