"""An evaluation's time limit, counted in the time it could run: what other envs and the machine's load took from it
is not charged to the agent.

The rule. An evaluation has ``timeout`` seconds (the task's ``training_timeout``) from its start, the copy of the
workspace included. Its clock is the wall time since then less the time it *stalled*, waiting for a CPU that others
held:

    stall  = min(waited, wall - ran)
    waited = the longer of its cgroup's CPU pressure (v2 ``cpu.pressure`` ``some``: wall-clock time in which one of
             its processes was runnable and got no CPU) and the run-queue waits of its threads
             (``/proc/<tid>/schedstat``), plus the driver thread's own run-queue wait (it copies the workspace)
    ran    = the CPU time its processes and the driver thread used

``wall - ran`` is the time in which nothing of it ran, so waiting while it also ran (its own threads contending for
the CPUs it got) is never a stall: busy threads of the agent's code cannot buy it time.

- The clock reaches ``timeout``: the evaluation had its time, and used it (running, or sleeping, waiting for its own
  input): the agent's failure (``agent_error``, or ``invalid_submission`` for a file the evaluator only reads), as
  before.
- A wall-time backstop, ``backstop(timeout)`` = 4 x ``timeout`` + 60 s, ends it anyway. Its clock is then still short
  of ``timeout``, so it spent most of its wall time waiting for a CPU: the machine's failure, ``infra_error``.

Before the wall time reaches ``timeout`` nothing is read (the clock cannot be ahead of the wall), so an evaluation
that ends in time pays nothing for this; past it, the clock is read again each time the stall it has earned runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .cgroups import Usage, thread_times

BACKSTOP_FACTOR = 4
BACKSTOP_EXTRA = 60.0
MIN_WAIT = 0.05
"""The shortest wait between two readings past the nominal deadline."""

Sampler = Callable[[set[int]], Usage | None]
"""The evaluation's CPU so far (cumulative), given its first processes' pids; None when it cannot be read."""


def backstop(timeout: float) -> float:
    """The wall-time limit of an evaluation of ``timeout`` seconds, whatever it waited for."""
    return BACKSTOP_FACTOR * timeout + BACKSTOP_EXTRA


@dataclass
class EvaluationClock:
    """The time limit of one evaluation (see the module's rule), made on the thread that runs it, when it starts:
    ``began`` (``time.monotonic``). ``roots``: its first processes, once started (the sampler's fallback finds the
    others among their descendants)."""

    began: float
    timeout: float
    sampler: Sampler | None = None
    roots: frozenset[int] = frozenset()
    stall: float = field(default=0.0, init=False)
    """Seconds it stalled, as last read."""
    ran: float = field(default=0.0, init=False)
    """CPU seconds it used, as last read."""
    hit_backstop: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.first = self._read()

    def _read(self) -> tuple[Usage, float, float] | None:
        """The evaluation's usage and the driver thread's CPU and wait, now."""
        if self.sampler is None:
            return None
        usage = self.sampler(set(self.roots))
        if usage is None:
            return None
        cpu, waits = thread_times()
        return usage, cpu, sum(waits.values())

    def stalled(self, now: float) -> float:
        """Seconds the evaluation stalled since it began (0 without a sampler)."""
        reading = self._read() if self.first is not None else None
        if reading is None or self.first is None:
            return self.stall
        (usage, driver_cpu, driver_wait), (first, first_cpu, first_wait) = reading, self.first
        pressure = usage.pressure - first.pressure if usage.pressure is not None and first.pressure is not None else 0
        queued = sum(wait - first.waits.get(tid, 0.0) for tid, wait in usage.waits.items())
        waited = max(pressure, queued, 0.0) + max(driver_wait - first_wait, 0.0)
        self.ran = max(usage.cpu - first.cpu, 0.0) + max(driver_cpu - first_cpu, 0.0)
        self.stall = max(self.stall, min(waited, max(now - self.began - self.ran, 0.0)))
        return self.stall

    def left(self) -> float:
        """Seconds the evaluation may still run at least; 0 or less when its time is up (``starved`` says whose
        fault that was)."""
        now = time.monotonic()
        wall = now - self.began
        limit = backstop(self.timeout)
        if wall < self.timeout:
            return self.timeout - wall  # the clock cannot be ahead of the wall: nothing to read yet
        charged = wall - self.stalled(now)
        if wall >= limit:
            self.hit_backstop = charged < self.timeout
            return 0.0
        left = self.timeout - charged
        return min(max(left, MIN_WAIT), limit - wall) if left > 0 else left

    def starved(self) -> bool:
        """Whether the time ran out at the backstop with the evaluation's own clock still short: the machine's
        fault, not the agent's."""
        return self.hit_backstop

    def starved_message(self) -> str:
        """What a starved evaluation's failure says."""
        wall = time.monotonic() - self.began
        return (
            f"the evaluation was stopped after {wall:.0f} seconds of wall time (its limit of {_seconds(self.timeout)} "
            f"seconds counts only the time it could run): it waited {self.stall:.0f} seconds for a CPU that other "
            f"work of this machine held, and used {self.ran:.1f} seconds of CPU. This is the machine's load, not the "
            "submission's fault."
        )


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
