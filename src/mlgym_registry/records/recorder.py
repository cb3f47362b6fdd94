"""What an episode is recorded through, whatever plays it: the ``EpisodeRecorder`` protocol, and ``CallRecorder``,
which keeps the calls of an episode played elsewhere so that they can be made again on a real writer.

``EpisodePlayer`` records every episode through an ``EpisodeRecorder``: in this process that is the
``TrajectoryWriter`` itself; in a worker process or a Ray actor it is a ``CallRecorder``, whose calls travel to the
process that owns the files and are made there on its ``TrajectoryWriter`` (``replay``). Every engine records the
same calls in the same order, so the same episode leaves the same ``.traj`` and ``results.json`` on each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from .trajectories import Step

Call = tuple
"""One recorder call, as data: ``("system"|"user", text)``, ``("tool", text, call_id)``, ``("step", Step, info)``,
``("finish", info)`` or ``("fail", reason, info)``."""

ENDS = ("finish", "fail")
"""The calls that end an episode's record."""


@runtime_checkable
class EpisodeRecorder(Protocol):
    """What an episode is recorded through (``TrajectoryWriter`` and ``CallRecorder`` are ones).

    ``system`` once, then per turn the prompt (``user``, or ``tool`` for each answer to a native tool call) and the
    ``step``; the record ends with ``finish`` (the episode ended or stopped) or ``fail`` (it could not go on).
    ``provenance`` is the run's record (``records.provenance.provenance_record``), set by the player when None.
    """

    provenance: dict[str, Any] | None

    def batch(self) -> contextlib.AbstractContextManager[Any]:
        """A block whose calls may be saved together, once, when it ends."""
        ...

    def system(self, content: str) -> None:
        """Record the system message."""
        ...

    def user(self, content: str) -> None:
        """Record the prompt of the next turn."""
        ...

    def tool(self, content: str, tool_call_id: str) -> None:
        """Record the answer to a native tool call (it prompts the next turn, as ``user`` does)."""
        ...

    def step(self, step: Step, info: dict[str, Any] | None = None) -> None:
        """Record a finished step, and the backend's ``info`` after it."""
        ...

    def finish(self, info: dict[str, Any] | None = None) -> None:
        """End the record: the episode is over (the final ``info``)."""
        ...

    def fail(self, reason: str, info: dict[str, Any] | None = None) -> None:
        """End the record: the episode failed, for ``reason``."""
        ...


class CallRecorder:
    """An ``EpisodeRecorder`` that keeps its calls (``Call``) for another process, which makes them again on its own
    writer (``replay``); ``take()`` hands over the calls made since the last ``take``."""

    def __init__(self) -> None:
        self.provenance: dict[str, Any] | None = None
        self.calls: list[Call] = []

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Nothing to save: the calls are kept either way."""
        yield

    def system(self, content: str) -> None:
        """Keep the system message."""
        self.calls.append(("system", content))

    def user(self, content: str) -> None:
        """Keep the prompt of the next turn."""
        self.calls.append(("user", content))

    def tool(self, content: str, tool_call_id: str) -> None:
        """Keep the answer to a native tool call."""
        self.calls.append(("tool", content, tool_call_id))

    def step(self, step: Step, info: dict[str, Any] | None = None) -> None:
        """Keep a finished step."""
        self.calls.append(("step", step, info))

    def finish(self, info: dict[str, Any] | None = None) -> None:
        """Keep the end of the episode."""
        self.calls.append(("finish", info))

    def fail(self, reason: str, info: dict[str, Any] | None = None) -> None:
        """Keep the failure of the episode."""
        self.calls.append(("fail", reason, info))

    def take(self) -> tuple[Call, ...]:
        """The calls since the last ``take``."""
        calls, self.calls = tuple(self.calls), []
        return calls


def replay(calls: Iterable[Call], recorder: EpisodeRecorder | None, *, without_end: bool = False) -> None:
    """Make ``calls`` on ``recorder`` (nothing when it is None), saved together; ``without_end`` leaves out the end
    of the record (``finish``, ``fail``), for a caller that ends it itself. An unknown call raises ``ValueError``."""
    if recorder is None:
        return
    with recorder.batch():
        for call in calls:
            kind = call[0]
            if kind in ENDS and without_end:
                continue
            if kind == "system":
                recorder.system(call[1])
            elif kind == "user":
                recorder.user(call[1])
            elif kind == "tool":
                recorder.tool(call[1], call[2])
            elif kind == "step":
                recorder.step(call[1], info=call[2])
            elif kind == "finish":
                recorder.finish(call[1])
            elif kind == "fail":
                recorder.fail(call[1], info=call[2])
            else:
                raise ValueError(f"unknown recorder call {kind!r}: expected one of system, user, tool, step, finish, "
                                 "fail")
