"""The CPU time the suite used, for the time table (``conftest.py``).

When the suite keeps every core busy, its wall time is its CPU time over the cores: a test's CPU seconds say what it
costs the session, where its wall seconds, stretched by whatever else runs, do not. What is counted:

- each test's: its worker's own CPU time and that of the child processes the worker waited for (``getrusage``),
  from one report of the worker to the next. What a test leaves running (a Ray runtime, a server, a forkserver and
  the processes it starts) is counted when it is waited for: in a later test, at the session's end (the worker's
  last teardown, counted apart), or nowhere when that is after the last report;
- the background replays': the replay pool's processes, waited for as the pool ends (``measured``, in
  ``conftest.py``);
- the machine's (``/proc/stat``): everything that ran during the session, the suite's or not.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

import pytest

CPU_PROPERTY = "cpu_seconds"
"""The name of the user property (``TestReport.user_properties``) that carries a report's CPU seconds."""
SESSION_END_PROPERTY = "cpu_seconds_at_session_end"
"""The user property that carries them instead for a worker's last teardown: the session's fixtures end there, and
what they started (servers, forkservers, runtimes) is waited for, which is no test's cost."""


def own_cpu() -> float:
    """CPU seconds of this process and of the child processes it has waited for, so far."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@dataclass(frozen=True)
class MachineCpu:
    """The machine's CPU time so far, from the first line of ``/proc/stat``, in seconds."""

    busy: float
    """Time the cores ran anything (idle and waiting for I/O left out)."""
    total: float
    """Time the cores existed: busy, idle and waiting for I/O."""


def machine_cpu(stat: str = "/proc/stat") -> MachineCpu | None:
    """The machine's CPU time so far; None where ``/proc/stat`` cannot be read."""
    try:
        with open(stat) as file:
            fields = file.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
    hertz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    return MachineCpu(busy=(sum(ticks) - idle) / hertz, total=sum(ticks) / hertz)


def measured(action: Callable[[], object]) -> float:
    """CPU seconds of the child processes that ``action`` waits for (its own work in this process too)."""
    before = own_cpu()
    action()
    return own_cpu() - before


class CpuPerReport:
    """In a worker: each report carries the CPU seconds since the previous one (``CPU_PROPERTY``; the last teardown,
    ``SESSION_END_PROPERTY``)."""

    def __init__(self) -> None:
        self.mark = own_cpu()
        self.last = False

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        self.last = nextitem is None
        yield

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        self.mark = own_cpu()  # collecting is no test's

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        now = own_cpu()
        name = SESSION_END_PROPERTY if self.last and call.when == "teardown" else CPU_PROPERTY
        outcome.get_result().user_properties.append((name, now - self.mark))
        self.mark = now


def report_cpu(report: pytest.TestReport, name: str = CPU_PROPERTY) -> float:
    """The CPU seconds ``report`` carries under ``name`` (0 for a report without them)."""
    return sum(value for key, value in report.user_properties if key == name)
