"""A shell command's time limits, MLGym's total and no-output timeouts, counted in the time the command could run:
what the machine's load took from it is not charged to the agent (the rule of ``eval_clock``, applied to commands).

A limit of ``T`` seconds is measured on the command's clock, the wall time less the time it *stalled*:

    stall  = eval_clock.stall_seconds(waited, wall, ran)
    waited = the command's wait for a CPU, plus the run-queue wait of the thread that reads its output (a reader that
             ran late must not make the command late). The command's threads are the shell's and those of every
             process started since the command began; their run-queue waits (``/proc/<tid>/schedstat``) are read
             every ``SAMPLE_EVERY`` seconds while it runs, and its wait is the sum, over those readings, of the most
             one thread waited since the reading before
    ran    = the CPU time the shell's cgroup (everything the agent runs, exited processes included; without a
             unified cgroup, the command's threads as read) and the reading thread used

Summed over the readings, the waits of processes that run one after another add up (a child, then the shell that
waited for it; one child after another), and a process that ended keeps what it had waited at its last reading (its
counters go with it: it loses at most what it waited since then). Taken as the most one thread waited between two
readings, the waits of threads that wait side by side count once: a herd of threads or processes that wake together
adds nothing, where a sum over every thread grew past the wall clock. What the agent left running before the command
(background jobs) adds no wait: their waiting is not the command's. Nor does the cgroup's ``cpu.pressure``, which
counts theirs too (and averages over the CPUs a process moves between: a starved loop hopping over 2 busy cores showed
two thirds of its wait there). ``wall - ran`` bounds the stall as in ``eval_clock``: what the agent's processes kept
waiting while its others held the CPUs is never a stall.

- The clock reaches ``T``: the command had its time, MLGym's timeout as before.
- The wall-time backstop, ``eval_clock.backstop(T)``, ends it anyway: its clock is then still short of ``T``, the
  machine's load stopped it (``starved``), and its observation says so.

A no-output limit counts from the command's last output. A command reads the reading thread's counters at its start
(one small file); nearly every command has ended before its first reading of the rest, ``SETTLE`` seconds later.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from . import procs
from .cgroups import each_thread_times, process_threads, thread_times
from .eval_clock import stall_seconds, starved_account, time_left

Meter = Callable[[], float | None]
"""The CPU seconds the shell's processes used so far; None when they cannot be read (``cgroups.CpuMeter``)."""

TICKS = os.sysconf("SC_CLK_TCK")
"""The unit of a process's start time in ``/proc/<pid>/stat``, per second."""

SETTLE = 0.05
"""Seconds after its start at which a command still running has its threads first read: nearly every command has
ended by then, and reads nothing but the reading thread's wait (one small file). What the shell itself waited for
before then is not counted (the processes the command starts are counted whole)."""

SAMPLE_EVERY = 0.2
"""Seconds between two readings of the command's threads while it runs, at least: a process that ends loses what it
waited since the last one."""

SAMPLE_SHARE = 0.01
"""The most of a core the readings may take: a command with many processes is read less often (a reading of a few
processes takes about a millisecond)."""


class CommandClock:
    """The clock of one command, started when the command is sent, by the thread that reads its output. ``meter``
    counts the shell's cgroup (None: not counted), ``shell`` gives the shell's pid (None while it has not started:
    then it is the command's) and ``processes`` lists the session's processes (the command's among them). The reader
    calls ``read_if_due`` as the command goes on, at least every ``due_in`` seconds."""

    def __init__(self, meter: Meter | None = None, shell: Callable[[], int | None] | None = None,
                 processes: Callable[[], set[int]] | None = None):
        self._meter = meter
        self._shell_of = shell
        self._shell: int | None = None
        self._processes = processes
        self.began = time.monotonic()
        self._born = _ticks_since_boot()
        self._reader_first = _reader_times()
        self._settled = False
        self._meter_first: float | None = None
        self._newcomers: set[int] = set()  # the processes started since the command began, as found so far
        self._elders: set[int] = set()  # and those started before it
        self._seen: dict[int, tuple[float, float]] = {}  # each thread's CPU and wait at the last reading
        self._waited = 0.0
        self._threads_ran = 0.0
        self._next_reading = self.began + SETTLE
        self.stall = 0.0
        """Seconds the command stalled since it began, as last read."""
        self._stall_read_at: float | None = None
        self.ran = 0.0
        """CPU seconds it (and the reading thread) used, as last read."""
        self.starved = False
        """Whether a limit ended at its backstop with the clock still short of it: the machine's fault."""

    def read_if_due(self) -> None:
        """Read the command's threads when a reading is due (``due_in``)."""
        now = time.monotonic()
        if now >= self._next_reading:
            self._read_threads(now)

    def due_in(self) -> float:
        """Seconds until the next reading of the command's threads is due: the longest the reader may wait."""
        return max(self._next_reading - time.monotonic(), 0.0)

    def _settle(self) -> None:
        """At the first reading: the shell (one that starts later is the command's), the cgroup's CPU, and the
        shell's threads' counters so far, which are not the command's."""
        self._settled = True
        self._shell = self._shell_of() if self._shell_of is not None else None
        if self._meter is not None:
            self._meter_first = self._meter()
            if self._meter_first is None:
                self._meter = None  # unread now, its later readings could not be compared
        if self._shell:
            self._seen = each_thread_times(process_threads({self._shell}))

    def _read_threads(self, now: float) -> None:
        """Add what the command's threads waited and ran since the last reading (``now``)."""
        if not self._settled:
            self._settle()
        threads = self._newcomer_threads() | (process_threads({self._shell}) if self._shell else set())
        current = each_thread_times(threads)
        longest = 0.0
        for tid, (cpu, wait) in current.items():
            last_cpu, last_wait = self._seen.get(tid, (0.0, 0.0))
            if wait < last_wait or cpu < last_cpu:  # a new thread that took an ended one's id
                last_cpu, last_wait = 0.0, 0.0
            longest = max(longest, wait - last_wait)
            self._threads_ran += cpu - last_cpu
        self._waited += longest
        self._seen = current
        done = time.monotonic()
        self._next_reading = done + max(SAMPLE_EVERY, (done - now) / SAMPLE_SHARE)

    def _newcomer_threads(self) -> set[int]:
        """The threads of the processes started since the command began (each process's start is read once)."""
        if self._processes is None:
            return set()
        running = self._processes()
        for pid in running - self._newcomers - self._elders:
            (self._newcomers if procs.start_ticks(pid) >= self._born else self._elders).add(pid)
        return process_threads(running & self._newcomers)

    def stalled(self, now: float) -> float:
        """Seconds the command stalled since it began, as of ``now``: the counters are read once per ``now``, however
        many limits are read at it."""
        if now == self._stall_read_at:
            return self.stall
        self._read_threads(now)
        if self._meter is not None:  # read at the first reading too (``_settle``), else it would be None now
            counted = self._meter()
            if counted is None:  # unread this time: the last reading stands
                return self.stall
            ran = max(counted - (self._meter_first or 0.0), 0.0)
        else:
            ran = self._threads_ran
        reader_cpu, reader_wait = _reader_times()
        waited = self._waited + max(reader_wait - self._reader_first[1], 0.0)
        self.ran = ran + max(reader_cpu - self._reader_first[0], 0.0)
        self.stall = max(self.stall, stall_seconds(waited, now - self.began, self.ran))
        self._stall_read_at = now
        return self.stall

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
