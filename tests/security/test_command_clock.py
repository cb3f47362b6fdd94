"""A command's time limits count only the time it could run (``backends/local/command_clock.py``): a command the
machine's load starves, or whose output this process reads late, is not timed out for it, while a command that uses
its time (running, sleeping, or waiting behind the agent's own busy loops) is timed out as in MLGym.

The starvation is the host's own squeeze (``helpers.squeeze``: the env's quota 1% of a core), and for the reader a
cgroup of its own with 0.1% of a core: real starvation, measured by the real counters."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest

from mlgym_registry.backends.local import cgroups, eval_clock

from .helpers import CFS_PERIOD_US, STARVED_QUOTA_US, open_backend, squeeze, status

pytestmark = [pytest.mark.security, pytest.mark.slow]

LIMIT = 3
"""The commands' time limits here, total and without output (seconds). Under the squeeze a few percent of the wall
time count neither as running nor as waiting (the kernel's accounting of a throttled cgroup), so a starved command's
clock still advances: the limit leaves room for the counting loop's ten to twenty seconds. The squeeze is the quota
alone, the env's weight kept: a weight lowered too made the loop's wall time, and so that share, grow with whatever
else the machine ran."""

COUNT_TO = 20_000
"""A bash loop to this count needs a few tenths of a second of CPU: at 1% of a core, ten seconds and more."""


def counting(to: int = COUNT_TO) -> str:
    """A bash loop that counts to ``to`` and says so."""
    return f"i=0; while [ $i -lt {to} ]; do i=$((i+1)); done; echo counted $i"


COUNTING = counting()
CHILDREN = 3
"""Children that count one after another, each to a third of ``COUNT_TO``: each is starved for seconds and ends, and
its wait must count after it ended (a process that ends loses what it waited since the clock's last reading, a few
tenths of a second: more children would leave the limit less room)."""


def limited_backend(spec, tmp_path, **options):
    """A backend whose commands have ``LIMIT`` seconds in all and without output (the no-output limit is the task's
    ``training_timeout``, as in MLGym)."""
    return open_backend(spec.replace(training_timeout=LIMIT), workspace_dir=str(tmp_path), command_timeout=LIMIT,
                        **options)


@pytest.mark.parametrize("command, counted", [
    (COUNTING, COUNT_TO),
    (f"bash -c {COUNTING!r}", COUNT_TO),
    (f"for _ in $(seq {CHILDREN}); do bash -c {counting(COUNT_TO // CHILDREN)!r}; done; echo all",
     COUNT_TO // CHILDREN),
], ids=["in the shell", "in a child", "in children one after another"])
def test_a_command_the_machine_starves_is_given_its_time(mini_spec, tmp_path, command, counted):
    """Starved, the counting loop runs far past its wall-time limits and is not timed out: it had its time only
    when it could run. The shell runs it, or a process the command starts (whose wait is the command's), or several
    that end one after another (whose waits add up: what an ended process waited still counts)."""
    env = limited_backend(mini_spec, tmp_path)
    try:
        squeeze(env, lowest_weight=False)
        started = time.monotonic()
        observation, _, _, _ = env.step(command)
        took = time.monotonic() - started
        assert f"counted {counted}" in observation and "TIMED OUT" not in observation, observation
        assert took > LIMIT, f"{took:.1f} s: the squeeze did not starve the command, so this tested nothing"
    finally:
        env.close()


def test_a_starved_command_stopped_at_its_backstop_says_it_was_the_machine(mini_spec, tmp_path, monkeypatch):
    """A command that cannot get the CPU it needs before the backstop is stopped there, and its observation says
    that the machine's load stopped it, not the command."""
    monkeypatch.setattr(eval_clock, "BACKSTOP_EXTRA", 0.0)  # a backstop of 4 x 3 s, not 4 x 3 + 60 s
    env = limited_backend(mini_spec, tmp_path)
    try:
        squeeze(env, lowest_weight=False)
        observation, _, _, _ = env.step("while :; do :; done")
        assert "EXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 3 SECONDS" in observation
        assert "This is the machine's load, not the command's doing" in observation, observation
        output, code = status(env, "echo still here")
        assert (output.strip(), code) == ("still here", 0)
    finally:
        env.close()


LOOPS = 8
"""Busy loops the agent leaves running in the background before its command, in an env held to one core (so that
they wait for a CPU among themselves, and burn no more than a core of the suite's)."""


@pytest.mark.parametrize("command, kind", [
    ("while :; do :; done", "THE COMMAND WAS RUNNING FOR MORE THAN 3 SECONDS"),
    ("sleep 600", "THE COMMAND WAS RUNNING FOR MORE THAN 3 SECONDS"),
    ("echo begun; sleep 600", "NO OUTPUT WAS PRODUCED FOR MORE THAN 3 SECONDS"),
], ids=["busy", "sleeping", "quiet"])
def test_a_command_that_uses_its_time_is_timed_out_as_in_mlgym(mini_spec, tmp_path, command, kind):
    """Beside the agent's own busy loops (the waiting they cause is the agent's, never a stall), a command that
    spins, sleeps or stays quiet runs out of its time before the backstop, with MLGym's text and no note."""
    env = limited_backend(mini_spec, tmp_path, max_processes=128)
    try:
        squeeze(env, CFS_PERIOD_US, lowest_weight=False)
        output, code = status(env, f"for i in $(seq {LOOPS}); do setsid sh -c 'while :; do :; done' "
                                   ">/dev/null 2>&1 & done; echo started", timeout=60)
        assert code == 0 and "started" in output, output
        if command.startswith("echo"):  # the total limit must not come first: only the quiet one is tested
            env.command_timeout = 600
        started = time.monotonic()
        observation, _, _, _ = env.step(command)
        took = time.monotonic() - started
        assert f"EXECUTION TIMED OUT BECAUSE {kind}" in observation, observation
        assert "machine's load" not in observation, observation
        assert took < eval_clock.backstop(LIMIT), f"{took:.1f} s: the agent's own loops were counted as a stall"
    finally:
        env.close()


def test_a_silent_spinning_command_is_timed_out_by_its_total_limit_even_when_the_reader_runs_late(
        mini_spec, tmp_path, monkeypatch):
    """With both limits equal, a command that spins and prints nothing is timed out as running too long (MLGym's
    order), however late the reading thread runs between its readings of the two limits: both are read at one time.
    The lateness is a stand-in: the thread sleeps a second after every other reading of the counters (the first of
    each pass's two). The env at half a core makes the clock pass its deadline in small steps, where two limits read
    at different times could end in either order."""
    from mlgym_registry.backends.local import command_clock

    read = command_clock.CommandClock.stalled
    readings = iter(range(1_000_000))

    def late(self, now):
        stall = read(self, now)
        if next(readings) % 2 == 0:
            time.sleep(1.0)  # the reading thread preempted after it read the counters
        return stall

    monkeypatch.setattr(command_clock.CommandClock, "stalled", late)
    env = limited_backend(mini_spec, tmp_path)
    try:
        squeeze(env, CFS_PERIOD_US // 2, lowest_weight=False)
        observation, _, _, _ = env.step("while :; do :; done")
        assert "EXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 3 SECONDS" in observation, observation
        assert "machine's load" not in observation, observation
    finally:
        env.close()


READER_PERIOD_US = 1_000_000
"""The period of the reading thread's quota (the kernel's longest): ``STARVED_QUOTA_US`` in it is 0.1% of a core."""


@contextlib.contextmanager
def this_thread_starved() -> Iterator[None]:
    """This thread alone in a cgroup with 0.1% of a core (v1 ``cpu``, where a thread may move alone): the process
    reading a command's output runs late, as a driver on a loaded machine does."""
    hierarchy = next((h for h in cgroups.hierarchies() if not h.v2 and "cpu" in h.controllers), None)
    own = hierarchy.own_folder() if hierarchy is not None else None
    if own is None:
        pytest.skip("needs a v1 cpu hierarchy, where one thread can be given a quota of its own")
    folder = own / f"mlgr-test-reader-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / "cpu.cfs_period_us").write_text(str(READER_PERIOD_US))
        (folder / "cpu.cfs_quota_us").write_text(str(STARVED_QUOTA_US))
    except OSError as exc:
        pytest.skip(f"cannot make a cpu cgroup here: {exc}")
    thread = str(threading.get_native_id())
    try:
        (folder / "tasks").write_text(thread)
        yield
    finally:
        (own / "tasks").write_text(thread)
        folder.rmdir()


def test_output_the_reader_takes_late_is_not_a_timeout(mini_spec, tmp_path):
    """The command prints four megabytes at once and ends; the thread that reads them gets 0.1% of a core, so it
    reads them long after the limits. Its own wait for a CPU is a stall: the output is whole, no timeout."""
    env = limited_backend(mini_spec, tmp_path, max_output_chars=10_000)
    try:
        with this_thread_starved():
            started = time.monotonic()
            observation, _, _, _ = env.step("seq 1 600000; echo all printed")
            took = time.monotonic() - started
        assert observation.rstrip().endswith("all printed") and "TIMED OUT" not in observation, observation[-300:]
        assert took > LIMIT, f"{took:.1f} s: the reader was not starved, so this tested nothing"
    finally:
        env.close()
