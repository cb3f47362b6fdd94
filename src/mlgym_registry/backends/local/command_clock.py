"""A shell command's time limits, MLGym's total and no-output timeouts, counted in the time the command could run:
what the machine's load took from it is not charged to the agent (the rule of ``eval_clock``, applied to commands).

A limit of ``T`` seconds is measured on the command's clock, the wall time less the time it *stalled*:

    stall  = eval_clock.stall_seconds(waited, wall, ran)
    waited = the time in which a runnable process of the shell's cgroup waited for a CPU (its ``cpu.pressure``
             ``some`` total: exited processes count, and one second counts once however many waited), plus the
             run-queue wait of the thread that reads the command's output (a reader that ran late must not make the
             command late)
    ran    = the CPU time the shell's cgroup (everything the agent runs) and the reading thread used

Without a cgroup that counts waiting (no unified hierarchy, or a kernel without PSI) only the reading thread's wait
counts. ``wall - ran`` bounds the stall as in ``eval_clock``: what the agent's own processes kept waiting, while its
others held the CPUs, is never a stall.

- The clock reaches ``T``: the command had its time, MLGym's timeout as before.
- The wall-time backstop, ``eval_clock.backstop(T)``, ends it anyway: its clock is then still short of ``T``, the
  machine's load stopped it (``starved``), and its observation says so.

A no-output limit counts from the command's last output. Nothing is read before the wall time reaches a limit, so a
command that ends in time costs one reading, at its start.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .cgroups import thread_times
from .eval_clock import MIN_WAIT, backstop, stall_seconds

Meter = Callable[[], tuple[float, float] | None]
"""The CPU seconds the shell's processes used and the seconds they waited for a CPU, both cumulative; None when they
cannot be read (``cgroups.Envelope.cpu_and_wait``)."""


class CommandClock:
    """The clock of one command, started when the command is sent; ``meter`` counts the shell's processes (None: only
    the reading thread, the one that makes the clock, is counted)."""

    def __init__(self, meter: Meter | None = None):
        self._meter = meter
        self.began = time.monotonic()
        self._first = self._read()
        if not self._first[2]:
            self._meter = None  # unread at the start, its later readings could not be compared
        self.stall = 0.0
        """Seconds the command stalled since it began, as last read."""
        self.ran = 0.0
        """CPU seconds it (and the reading thread) used, as last read."""
        self.starved = False
        """Whether a limit ended at its backstop with the clock still short of it: the machine's fault."""

    def _read(self) -> tuple[float, float, bool]:
        """CPU used and time waited so far, and whether the meter's part is in them."""
        cpu, waits = thread_times()
        waited = sum(waits.values())
        shell = self._meter() if self._meter is not None else None
        if shell is None:
            return cpu, waited, False
        return cpu + shell[0], waited + shell[1], True

    def stalled(self, now: float) -> float:
        """Seconds the command stalled since it began."""
        cpu, waited, metered = self._read()
        first_cpu, first_waited, first_metered = self._first
        if metered != first_metered:  # the shell's count could not be read this time: the last reading stands
            return self.stall
        self.ran = max(cpu - first_cpu, 0.0)
        self.stall = max(self.stall, stall_seconds(max(waited - first_waited, 0.0), now - self.began, self.ran))
        return self.stall

    def left(self, timeout: float, since: float | None = None, stall_then: float = 0.0) -> float:
        """Seconds left of a limit of ``timeout`` seconds counted from ``since`` (wall, ``time.monotonic``; default
        the command's start), when ``stall_then`` seconds of stall had been read by then; 0 or less once it is up."""
        now = time.monotonic()
        wall = now - (self.began if since is None else since)
        if wall < timeout:
            return timeout - wall  # the clock cannot be ahead of the wall: nothing to read yet
        charged = wall - max(self.stalled(now) - stall_then, 0.0)
        limit = backstop(timeout)
        if wall >= limit:
            self.starved = self.starved or charged < timeout
            return 0.0
        left = timeout - charged
        return min(max(left, MIN_WAIT), limit - wall) if left > 0 else left

    def starved_note(self) -> str:
        """What a command stopped at its backstop was told (``starved``)."""
        wall = time.monotonic() - self.began
        return (
            f"NOTE: the command was stopped after {wall:.0f} seconds of wall time, though its time limit counts only "
            f"the time it could run: it waited {self.stall:.0f} seconds for a CPU that other work of this machine "
            f"held, and used {self.ran:.1f} seconds of CPU. This is the machine's load, not the command's doing."
        )
