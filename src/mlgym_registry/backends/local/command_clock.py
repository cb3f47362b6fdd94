"""A shell command's time limits, MLGym's total and no-output timeouts, counted in the time the command could run:
what the machine's load took from it is not charged to the agent (the rule of ``eval_clock``, applied to commands).

A limit of ``T`` seconds is measured on the command's clock, the wall time less the time it *stalled*:

    stall  = eval_clock.stall_seconds(waited, wall, ran)
    waited = the command's wait for a CPU, plus the run-queue wait of the thread that reads its output (a reader that
             ran late must not make the command late). The command's wait is the longest run-queue wait
             (``/proc/<tid>/schedstat``) of a thread of the shell or of a process started since the command began
    ran    = the CPU time the shell's cgroup (everything the agent runs, exited processes included; without a
             unified cgroup, the threads above) and the reading thread used

What the agent left running before the command (background jobs) adds no wait: their waiting is not the command's.
Nor does the cgroup's ``cpu.pressure``, which counts theirs too (and averages over the CPUs a process moves between:
a starved loop hopping over 2 busy cores showed two thirds of its wait there). ``wall - ran`` bounds the stall as in
``eval_clock``: what the agent's processes kept waiting while its others held the CPUs is never a stall.

- The clock reaches ``T``: the command had its time, MLGym's timeout as before.
- The wall-time backstop, ``eval_clock.backstop(T)``, ends it anyway: its clock is then still short of ``T``, the
  machine's load stopped it (``starved``), and its observation says so.

A no-output limit counts from the command's last output. A command reads the reading thread's counters at its start
(one small file) and, when it still runs ``SETTLE`` seconds later, its shell's (two more); nothing else is read
before the wall time reaches a limit.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import procs
from .cgroups import process_threads, thread_times
from .eval_clock import stall_seconds, starved_account, time_left

Meter = Callable[[], float | None]
"""The CPU seconds the shell's processes used so far; None when they cannot be read (``cgroups.CpuMeter``)."""

TICKS = os.sysconf("SC_CLK_TCK")
"""The unit of a process's start time in ``/proc/<pid>/stat``, per second."""

SETTLE = 0.05
"""Seconds after its start at which a command still running has its shell's side read: nearly every command has ended
by then, and reads nothing but the reading thread's wait (one small file). What the shell itself waited for before
then is not counted (the processes the command starts are counted whole)."""


@dataclass(frozen=True)
class _ShellSide:
    cpu: float  # the cgroup's CPU (metered), else the shell's
    shell_wait: float
    metered: bool


class CommandClock:
    """The clock of one command, started when the command is sent, by the thread that reads its output. ``meter``
    counts the shell's cgroup (None: not counted), ``shell`` gives the shell's pid (None while it has not started:
    then it is the command's) and ``processes`` lists the session's processes (the command's among them). ``settle``
    is called as the command goes on."""

    def __init__(self, meter: Meter | None = None, shell: Callable[[], int | None] | None = None,
                 processes: Callable[[], set[int]] | None = None):
        self._meter = meter
        self._shell_of = shell
        self._shell: int | None = None
        self._processes = processes
        self.began = time.monotonic()
        self._born = _ticks_since_boot()
        self._reader_first = _reader_times()
        self._side_first: _ShellSide | None = None
        self.stall = 0.0
        """Seconds the command stalled since it began, as last read."""
        self._stall_read_at: float | None = None
        self.ran = 0.0
        """CPU seconds it (and the reading thread) used, as last read."""
        self.starved = False
        """Whether a limit ended at its backstop with the clock still short of it: the machine's fault."""

    def settle(self) -> None:
        """Read the shell's side once the command has run ``SETTLE`` seconds (the first ``stalled`` does too)."""
        if self._side_first is None and time.monotonic() - self.began >= SETTLE:
            self._shell = self._shell_of() if self._shell_of is not None else None
            self._side_first = self._read_side()
            if not self._side_first.metered:
                self._meter = None  # unread now, its later readings could not be compared

    def settles_in(self) -> float:
        """Seconds until ``settle`` is due (infinity once it is done): the longest the reader may wait before it."""
        if self._side_first is not None:
            return math.inf
        return max(self.began + SETTLE - time.monotonic(), 0.0)

    def _read_side(self) -> _ShellSide:
        shell_cpu, shell_waits = thread_times({self._shell}) if self._shell else (0.0, {})
        counted = self._meter() if self._meter is not None else None
        cpu = counted if counted is not None else shell_cpu
        return _ShellSide(cpu, sum(shell_waits.values()), counted is not None)

    def stalled(self, now: float) -> float:
        """Seconds the command stalled since it began, as of ``now``: the counters are read once per ``now``, however
        many limits are read at it."""
        if now == self._stall_read_at:
            return self.stall
        self.settle()
        first = self._side_first
        if first is None:
            return self.stall
        side = self._read_side()
        if side.metered != first.metered:  # the cgroup could not be read this time: the last reading stands
            return self.stall
        reader_cpu, reader_wait = _reader_times()
        newcomers_cpu, newcomers_wait = self._newcomers()
        own_wait = max(side.shell_wait - first.shell_wait, newcomers_wait, 0.0)
        waited = own_wait + max(reader_wait - self._reader_first[1], 0.0)
        self.ran = (max(side.cpu - first.cpu, 0.0) + (0.0 if side.metered else newcomers_cpu)
                    + max(reader_cpu - self._reader_first[0], 0.0))
        self.stall = max(self.stall, stall_seconds(waited, now - self.began, self.ran))
        self._stall_read_at = now
        return self.stall

    def _newcomers(self) -> tuple[float, float]:
        """The CPU the threads of the processes started since the command began used, and the longest wait of one."""
        if self._processes is None:
            return 0.0, 0.0
        newcomers = {pid for pid in self._processes() if procs.start_ticks(pid) >= self._born}
        cpu, waits = thread_times(process_threads(newcomers))
        return cpu, max(waits.values(), default=0.0)

    def left(self, timeout: float, since: float | None = None, stall_then: float = 0.0,
             now: float | None = None) -> float:
        """Seconds left at ``now`` (``time.monotonic``; default: the present) of a limit of ``timeout`` seconds counted
        from ``since`` (default: the command's start), when ``stall_then`` seconds of stall had been read by then; 0 or
        less once it is up. Limits compared with each other must be read at one ``now``: read one after the other,
        the later one could be up while the earlier was not, only because time passed between the two readings."""
        now = time.monotonic() if now is None else now
        wall = now - (self.began if since is None else since)
        left, starved = time_left(wall, timeout, lambda: max(self.stalled(now) - stall_then, 0.0))
        self.starved = self.starved or starved
        return left

    def starved_note(self, timeout: float) -> str:
        """What a command stopped at the backstop of its limit of ``timeout`` seconds is told (``starved``)."""
        account = starved_account(time.monotonic() - self.began, timeout, self.stall, self.ran)
        return f"NOTE: the command was {account} This is the machine's load, not the command's doing."


def _reader_times() -> tuple[float, float]:
    """The calling thread's CPU and run-queue wait so far, in seconds."""
    cpu, waits = thread_times()
    return cpu, sum(waits.values())


def _ticks_since_boot() -> int:
    """Now, in the unit and from the origin of a process's start time (one tick earlier: a process started in the
    same tick as the command counts as the command's)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * TICKS) - 1
