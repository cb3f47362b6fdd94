"""Turning the frames workers send (``frames.Frame``) into recorded episodes, and checking that none is lost.

Each env plays its episodes in order and each episode's frames are numbered, so the receiver knows what it should
get: for every env, episodes ``0 .. per_env - 1``, each a start frame, its turn frames in order, and an end frame
that says how many turns were sent. Whatever is missing (a frame skipped, an episode that never ended because its
worker died, an episode that never started, an episode whose worker raised) makes that episode an ``infra_error``:
its ``failure`` (and ``results.json``'s ``"failed"``) says so and what was lost, so that it is not counted as the
agent's outcome, and ``lost`` lists it for the command to report. An episode is never recorded from frames that
belong to another.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from ..backends.protocol import INFRA_ERROR
from ..episodes.episode import EpisodeResult
from ..records.recorder import replay
from ..records.trajectories import TrajectoryWriter
from .frames import END, START, TURN, WARNING, Frame
from .run_plan import EpisodeRun

INFRA_PREFIX = f"{INFRA_ERROR}: "
"""How the ``failure`` of an episode the infrastructure lost begins (not the agent's outcome: never scored)."""


def is_infra_failure(result: EpisodeResult) -> bool:
    """True when ``result`` is an episode our machinery failed or lost (not the agent's doing)."""
    return result.failure.startswith(INFRA_PREFIX)


@dataclass
class _Episode:
    """An episode being received."""

    result: EpisodeResult
    writer: TrajectoryWriter | None
    seq: int = -1
    """The ``seq`` of the last frame received."""
    gaps: list[str] = field(default_factory=list)


class FrameReceiver:
    """Records the episodes of ``run`` from their frames, under its ``out``."""

    def __init__(self, run: EpisodeRun):
        self.run, self.spec, self.num_envs, self.per_env = run, run.spec, run.num_envs, run.episodes_per_env
        self.on_step = run.on_step
        self.playing: dict[int, tuple[int, _Episode]] = {}
        self.over: dict[tuple[int, int], EpisodeResult] = {}
        self.steps = 0
        self.lost: list[str] = []
        """One line per episode that is an ``infra_error``: which, and what was lost."""
        self._warned: set[str] = set()

    @property
    def finished(self) -> int:
        """Episodes over so far (ended, failed or lost)."""
        return len(self.over)

    def next_episode(self, env: int) -> int | None:
        """The number of env ``env``'s first episode that is not over (None when all are)."""
        return next((number for number in range(self.per_env) if (env, number) not in self.over), None)

    def remaining(self, env: int) -> list[int]:
        """The numbers of env ``env``'s episodes that are not over."""
        return [number for number in range(self.per_env) if (env, number) not in self.over]

    def receive(self, frame: Frame) -> None:
        """Record one frame."""
        if frame.kind == WARNING:
            self._warn(frame.data.get("text", ""))
            return
        key = (frame.env, frame.episode)
        if not (0 <= frame.env < self.num_envs and 0 <= frame.episode < self.per_env) or key in self.over:
            self._warn(f"a frame of env {frame.env} episode {frame.episode} that is not expected (seq {frame.seq}, "
                       f"{frame.kind}) was dropped")
            return
        episode = self._episode_of(frame)
        if frame.seq != episode.seq + 1:
            episode.gaps.append(_missing(episode.seq + 1, frame.seq - 1))
        episode.seq = max(episode.seq, frame.seq)
        if frame.kind == START and frame.data.get("worker"):
            episode.result.worker = dict(frame.data["worker"])
            if episode.writer is not None and frame.data.get("provenance") is not None:
                episode.writer.provenance = frame.data["provenance"]
        if frame.kind == END:
            self._end(frame, episode)
            return
        replay(frame.events, episode.writer)
        if frame.kind == TURN:
            turn = frame.turn
            if turn.index != len(episode.result.turns):
                episode.gaps.append(f"turn {turn.index} came as turn {len(episode.result.turns)}")
            episode.result.turns.append(turn)
            if turn.info is not None:
                episode.result.info = dict(turn.info)
            self.steps += 1
            self._progress()

    def lose_env(self, env: int, reason: str) -> None:
        """Env ``env``'s worker is gone (``reason``): its episode being played, or else the next one it was to play,
        is lost (an ``infra_error``)."""
        if env in self.playing:
            number, episode = self.playing.pop(env)
        else:
            number = self.next_episode(env)
            if number is None:
                return
            episode = self._new(env, number)
        self._lose(env, number, episode, f"{reason}, {_received(episode)}")

    def close(self, reason: str) -> None:
        """End the run: every episode being played is lost for ``reason``, and so is every episode that never
        started (an ``infra_error`` each)."""
        for env in list(self.playing):
            number, episode = self.playing.pop(env)
            self._lose(env, number, episode, f"{reason}, {_received(episode)}")
        for env in range(self.num_envs):
            for number in self.remaining(env):
                self._lose(env, number, self._new(env, number), f"{reason}; no frame of it arrived")

    def interrupt(self, reason: str) -> None:
        """Mark every episode being played as failed for ``reason`` (the run was interrupted: not an
        ``infra_error``)."""
        for env in list(self.playing):
            number, episode = self.playing.pop(env)
            episode.result.failure = reason
            if episode.writer is not None:
                episode.writer.fail(reason, info=episode.result.info)
            self.over[(env, number)] = episode.result

    def results(self) -> list[EpisodeResult]:
        """Every episode over, in env order then episode order."""
        return [self.over[key] for key in sorted(self.over)]

    # -- internals -------------------------------------------------------------------------------------------------
    def _episode_of(self, frame: Frame) -> _Episode:
        """The episode ``frame`` belongs to; an episode still playing on its env is lost first, and so is any
        episode of the env skipped before this one."""
        env, number = frame.env, frame.episode
        current = self.playing.get(env)
        if current is not None and current[0] == number:
            return current[1]
        if current is not None:
            self.lose_env(env, f"its frames stopped when episode {number} began")
        for skipped in range(number):
            if (env, skipped) not in self.over:
                self._lose(env, skipped, self._new(env, skipped), "no frame of it arrived (a later episode's did)")
        episode = self._new(env, number)
        self.playing[env] = (number, episode)
        return episode

    def _new(self, env: int, number: int) -> _Episode:
        return _Episode(EpisodeResult(self.spec), self.run.writer(env, number))

    def _end(self, frame: Frame, episode: _Episode) -> None:
        data, result = frame.data, episode.result
        self.playing.pop(frame.env, None)
        sent = int(data.get("turns", 0))
        if sent != len(result.turns) and not episode.gaps:
            episode.gaps.append(f"{sent} turns were sent, {len(result.turns)} arrived")
        result.info = dict(data.get("info") or result.info)
        result.finished, result.stop_reason = bool(data.get("finished")), str(data.get("stop_reason") or "")
        if episode.gaps or data.get("error"):
            replay(frame.events, episode.writer, without_end=True)
            what = "; ".join(episode.gaps) if episode.gaps else f"its worker raised {data['error']}"
            if episode.gaps and data.get("error"):
                what += f"; its worker raised {data['error']}"
            self._lose(frame.env, frame.episode, episode, f"{what} ({_received(episode)})")
            return
        replay(frame.events, episode.writer)
        if data.get("gave_up"):  # the policy gave up (exit_api): the episode ended, and failed, as in one process
            result.failure = str(data["gave_up"])
            if episode.writer is not None:
                episode.writer.fail(result.failure, info=result.info)
        self.over[(frame.env, frame.episode)] = result
        self._progress()

    def _lose(self, env: int, number: int, episode: _Episode, what: str) -> None:
        """Record env ``env``'s episode ``number`` as an ``infra_error`` because of ``what``."""
        result = episode.result
        result.failure = INFRA_PREFIX + what
        if episode.writer is not None:
            episode.writer.fail(result.failure, info=result.info)
        self.over[(env, number)] = result
        self.lost.append(f"env {env} episode {number}: {what}")
        self._progress()

    def _progress(self) -> None:
        if self.on_step is not None:
            self.on_step(self.finished, self.steps)

    def _warn(self, problem: str) -> None:
        if problem and problem not in self._warned:
            self._warned.add(problem)
            warnings.warn(f"in a worker process: {problem}", RuntimeWarning, stacklevel=3)


def _missing(first: int, last: int) -> str:
    """Which frames (by ``seq``) never arrived."""
    return f"frame {first} never arrived" if first == last else f"frames {first}-{last} never arrived"


def _received(episode: _Episode) -> str:
    count = len(episode.result.turns)
    return f"{count} step{'' if count == 1 else 's'} received"
