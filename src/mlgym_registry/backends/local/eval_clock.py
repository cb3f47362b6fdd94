"""An evaluation's time limit, counted in the time it could run: what other envs and the machine's load took from it
is not charged to the agent.

The rule. An evaluation has ``timeout`` seconds (the task's ``training_timeout``) from its start, the copy of the
workspace included. Its clock is the wall time since then less the time it *stalled*, waiting for a CPU that others
held:

    stall  = min(waited, wall - ran)
    waited = the run-queue wait (``/proc/<tid>/schedstat``) of the evaluation's own two processes, the pristine
             evaluator and the process that answers for the agent's code (each the first process of its sandbox),
             each counted as its longest-waiting thread's, plus the driver thread's own wait (it copies the workspace)
    ran    = the CPU time the evaluation's processes (all of them: what the agent's code started too) and the driver
             thread used

Only those two processes' waiting counts, and each once however many threads it has: what the agent's code starts
(children, a herd of threads or processes that wake together) adds nothing to ``waited``, where a sum over every
thread grew past the wall clock. ``wall - ran`` is the time in which nothing of it ran, so waiting while its own
processes held the CPUs is never a stall either: keeping itself waiting costs the agent's code at least as much CPU
time as it could buy, which leaves the clock at least a third of the wall time (far from the backstop below).

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

from . import procs
from .cgroups import Usage, process_threads, thread_times

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
        waited = sum(own_wait(pid) for pid in own_processes(self.roots)) + max(driver_wait - first_wait, 0.0)
        self.ran = max(usage.cpu - first.cpu, 0.0) + max(driver_cpu - first_cpu, 0.0)
        self.stall = max(self.stall, stall_seconds(waited, now - self.began, self.ran))
        return self.stall

    def left(self) -> float:
        """Seconds the evaluation may still run at least; 0 or less when its time is up (``starved`` says whose
        fault that was)."""
        now = time.monotonic()
        left, self.hit_backstop = time_left(now - self.began, self.timeout, lambda: self.stalled(now))
        return left

    def starved(self) -> bool:
        """Whether the time ran out at the backstop with the evaluation's own clock still short: the machine's
        fault, not the agent's."""
        return self.hit_backstop

    def starved_message(self) -> str:
        """What a starved evaluation's failure says."""
        return (
            f"the evaluation was {starved_account(time.monotonic() - self.began, self.timeout, self.stall, self.ran)}"
            " This is the machine's load, not the submission's fault."
        )


def time_left(wall: float, timeout: float, stalled: Callable[[], float]) -> tuple[float, bool]:
    """Seconds left of a limit of ``timeout`` after ``wall`` seconds, ``stalled()`` of them stalled (read only once
    ``wall`` reaches ``timeout``): 0 or less when it is up; and whether it ended at the backstop with the clock still
    short of ``timeout`` (starved: the machine's fault)."""
    if wall < timeout:
        return timeout - wall, False  # the clock cannot be ahead of the wall: nothing to read yet
    charged = wall - stalled()
    limit = backstop(timeout)
    if wall >= limit:
        return 0.0, charged < timeout
    left = timeout - charged
    return (min(max(left, MIN_WAIT), limit - wall) if left > 0 else left), False


def starved_account(wall: float, timeout: float, stall: float, ran: float) -> str:
    """How a run stopped at the backstop spent its ``wall`` seconds: ``stall`` waiting, ``ran`` of CPU."""
    return (
        f"stopped after {wall:.0f} seconds of wall time (its limit of {_seconds(timeout)} seconds counts only the "
        f"time it could run): it waited {stall:.0f} seconds for a CPU that other work of this machine held, and used "
        f"{ran:.1f} seconds of CPU."
    )


def stall_seconds(waited: float, wall: float, ran: float) -> float:
    """The module's rule: of ``wall`` seconds, those in which its processes ``waited`` for a CPU and nothing of it
    ran (``ran``: the CPU seconds they used)."""
    return min(waited, max(wall - ran, 0.0))


def own_processes(roots: frozenset[int] | set[int]) -> set[int]:
    """The evaluation's own processes: each of ``roots`` (what the evaluation started: ``bwrap``, or the program
    itself unsandboxed) and, below it, the first process of a PID namespace of its own (the sandbox's program).
    Nothing the agent's code starts is among them: it cannot make a PID namespace in the sandbox."""
    own = set(roots)
    for root in roots:
        own |= {pid for pid in procs.descendants(root) if _first_of_its_namespace(pid)}
    return own


def own_wait(pid: int) -> float:
    """The seconds ``pid`` waited for a CPU: its longest-waiting live thread's run-queue wait (threads' waits overlap,
    so a sum would count one wall-clock second once per thread)."""
    _, waits = thread_times(process_threads({pid}))
    return max(waits.values(), default=0.0)


def _first_of_its_namespace(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
