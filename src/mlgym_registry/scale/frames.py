"""What a worker process sends for each episode it plays (``Frame``), and the worker job that plays and sends them
(``play_env``).

A worker plays one env's episodes one after another (``EpisodePlayer``, as a run in one process does) and reports a
frame at the start of each episode, one per turn and one at its end. Every frame names its env, its episode on that
env and its place in the episode (``seq``: 0 for the start, ``k`` for turn ``k``, then the end), and the end frame
says how many turns there were: the receiver (``frame_receiver``) can tell whether it got every step. A frame holds
what the episode's writer would have written since the last frame (the new messages and the step), never the whole
conversation, so a frame costs the same at turn 2 and at turn 200.

Nothing here imports torch at import time: the process that receives the frames need not.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..records.recorder import Call, CallRecorder
from ..specs import TaskSpec

START, TURN, END, WARNING, JOB_END = "start", "turn", "end", "warning", "job_end"
"""The kinds of frame: an episode's start, one of its turns, its end; a plugin problem seen in the worker; and the end
of an env's job (``data["error"]``: what raised, when the job could not go on)."""


@dataclass(frozen=True)
class Frame:
    """One message of a worker about one episode: env ``env``'s episode number ``episode``, its ``seq``-th frame."""

    env: int
    episode: int
    seq: int
    kind: str
    events: tuple[Call, ...] = ()
    """The recorder calls since the previous frame, in order (``records.recorder.Call``)."""
    turn: Any = None
    """The ``Turn`` of a turn frame."""
    data: dict[str, Any] = field(default_factory=dict)
    """A start frame's ``provenance`` and ``worker``; an end frame's ``turns`` (how many turn frames were sent),
    ``finished``, ``stop_reason``, ``info``, ``error`` (what raised in the worker) and ``gave_up`` (why the policy gave
    up); a warning's ``text``."""


@dataclass(frozen=True)
class EnvJob:
    """What a worker needs to play env ``env``'s episodes ``episodes`` (numbers on that env), seeded ``seeds``."""

    spec: dict[str, Any]
    options: dict[str, Any]
    policy: Any
    env: int
    episodes: tuple[int, ...]
    seeds: tuple[int | None, ...]
    known_problems: tuple[str, ...] = ()


class _Sender:
    """Numbers one episode's frames and reports them."""

    def __init__(self, report: Callable[..., None], env: int, episode: int):
        self.report, self.env, self.episode, self.seq = report, env, episode, 0

    def send(self, kind: str, **fields: Any) -> None:
        self.report(Frame(self.env, self.episode, self.seq, kind, **fields))
        self.seq += 1


def play_env(job: EnvJob, report: Callable[..., None]) -> int:
    """In a worker: build the job's env and policy, play its episodes in turn and report every frame; return how
    many episodes were played. An episode that raises ends with an end frame that says what raised, and the next
    one gets a fresh env."""
    from ..registry import registry

    spec = TaskSpec.from_dict(job.spec)
    problems = [str(error) for error in registry.load_errors() if str(error) not in job.known_problems]
    for problem in problems:
        report(Frame(job.env, job.episodes[0] if job.episodes else 0, -1, WARNING, data={"text": problem}))
    env = policy = None
    try:
        for number, seed in zip(job.episodes, job.seeds, strict=True):
            if env is None:
                env, policy = build_env_and_policy(spec, job.options, job.policy)
            if not _play_episode(env, policy, spec, _Sender(report, job.env, number), seed):
                env.close()
                policy.close()
                env = policy = None
    finally:
        if env is not None:
            env.close()
            policy.close()
    return len(job.episodes)


def play_envs(jobs: tuple[EnvJob, ...], report: Callable[..., None]) -> int:
    """In a worker: play several envs' jobs at once, each in a thread of its own for its whole job (one job plays in
    this thread), and report a ``JOB_END`` frame for each job as it ends; return how many jobs were played.

    Hosting several envs per worker process is how a machine with fewer cores than envs plays them all without a
    process per env (as TorchRL's ``AsyncEnvPool(envs_per_worker=...)`` does): the envs' steps mostly wait on their
    shells and their policies, and one process per core keeps the cores busy at a fraction of the memory and of the
    scheduler's work. The threads share the worker's pipe, one frame at a time."""
    if len(jobs) == 1:  # this thread: a sandbox started from the main thread dies with the worker even if killed
        _play_job(jobs[0], report)
        return 1
    lock = threading.Lock()

    def one_at_a_time(*event: Any) -> None:
        with lock:
            report(*event)

    threads = [threading.Thread(target=_play_job, args=(job, one_at_a_time), name=f"mlgym-registry-env-{job.env}",
                                daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(jobs)


def _play_job(job: EnvJob, report: Callable[..., None]) -> None:
    """Play one env's job and report its end (with what raised, when its env or policy could not be built)."""
    error = ""
    try:
        play_env(job, report)
    except Exception as exc:  # the receiver loses the episodes the job did not play, saying why
        error = f"{type(exc).__name__}: {exc}"
    report(Frame(job.env, job.episodes[0] if job.episodes else 0, -1, JOB_END, data={"error": error}))


def build_env_and_policy(spec: TaskSpec, options: dict[str, Any], policy: Any) -> tuple[Any, Any]:
    """What a remote engine (a worker process, a Ray actor) plays an episode with: the env ``registry.make`` builds
    from ``spec`` and ``options``, and the policy ``policy`` names, writing in the env's parser's format and giving
    up as MLGym does (``GiveUpWithExitApi``: its ``error`` says why, once it has)."""
    from ..policies import make_policy
    from ..policies.give_up import GiveUpWithExitApi
    from ..registry import registry

    env = registry.make(spec, **options)
    try:
        built = make_policy(policy, task_id=spec.id, parser=spec.components.get("parser") or spec.parser)
    except BaseException:
        env.close()
        raise
    return env, GiveUpWithExitApi(built)


def _play_episode(env: Any, policy: Any, spec: TaskSpec, sender: _Sender, seed: int | None) -> bool:
    """Play one episode and report its frames; False when something raised (the env may be broken)."""
    from ..episodes.episode import EpisodePlayer

    recorder = CallRecorder()
    player = EpisodePlayer(env, policy, spec=spec, writer=recorder, seed=seed)
    turns, error = 0, ""
    try:
        player.start()
        sender.send(START, events=recorder.take(), data={
            "provenance": recorder.provenance, "worker": {"host": socket.gethostname(), "pid": os.getpid()}})
        while (turn := player.play_turn()) is not None:
            sender.send(TURN, events=recorder.take(), turn=turn)
            turns += 1
            if turn.done:
                break
    except Exception as exc:  # the episode fails alone; the receiver records why
        error = f"{type(exc).__name__}: {exc}"
    result = player.result
    sender.send(END, events=recorder.take(), data={
        "turns": turns, "finished": bool(result and result.finished), "stop_reason": result.stop_reason if result
        else "", "info": dict(result.info) if result else {}, "error": error, "gave_up": policy.error})
    return not error
