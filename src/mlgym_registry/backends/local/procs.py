"""Finding and ending the processes a shell session started, without third-party packages.

A session's shell leads its own session (``setsid``), so everything it starts shares its session id unless it called
``setsid`` itself; those escapees are still its descendants or members of its cgroup (see ``limits.PidsCgroup``).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable


def _table() -> list[tuple[int, int, int]]:
    """``(pid, ppid, sid)`` of every process on the machine."""
    rows: list[tuple[int, int, int]] = []
    if os.path.isdir("/proc"):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            # the command name is in parentheses and may contain spaces: split after the last ')'
            fields = stat[stat.rfind(b")") + 2 :].split()
            rows.append((int(name), int(fields[1]), int(fields[3])))
        return rows
    out = subprocess.run(["ps", "-axo", "pid=,ppid=,sess="], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return rows


def session_processes(leader: int) -> set[int]:
    """The processes of the session led by ``leader`` plus all descendants of ``leader`` (``leader`` excluded)."""
    rows = _table()
    children: dict[int, list[int]] = {}
    found = set()
    for pid, ppid, sid in rows:
        children.setdefault(ppid, []).append(pid)
        if sid == leader:
            found.add(pid)
    stack = [leader, *found]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(leader)
    return found


END_WITHIN = 2.0
"""Seconds ``end_session`` goes on looking for processes of the session that a kill left (a ceiling: it returns as
soon as none runs)."""


def end_session(leader: int, leader_running: Callable[[], bool], within: float = END_WITHIN) -> None:
    """SIGKILL the session led by ``leader`` (``leader`` too while ``leader_running()``) and everything below it, and
    look again after each kill until none of it runs: a process killed while it forks may leave a child the look
    before the kill did not see (``bwrap`` killed in its start-up leaves its half-made sandbox waiting forever for a
    parent that is gone, outside every cgroup where the driver may make none)."""
    deadline = time.monotonic() + within
    while True:
        running = {pid for pid in session_processes(leader) if alive(pid)}
        if leader_running() and alive(leader):
            running.add(leader)
        if not running or time.monotonic() > deadline:
            return
        kill_all(running)
        time.sleep(0.001)  # the kernel takes them down meanwhile


def first_descendant_named(ancestor: int, name: str) -> list[int]:
    """The pids from a child of ``ancestor`` down to its nearest descendant whose command name is ``name`` (breadth
    first), or an empty list when there is none yet."""
    children_of = _children_reader()
    queue: list[list[int]] = [[child] for child in sorted(children_of(ancestor))]
    while queue:
        chain = queue.pop(0)
        if command_name(chain[-1]) == name:
            return chain
        queue += [[*chain, child] for child in sorted(children_of(chain[-1]))]
    return []


def descendants(ancestor: int) -> set[int]:
    """Every descendant of ``ancestor`` (``ancestor`` excluded), found from the kernel's per-task ``children`` lists
    where it has them: the cost grows with the tree, not with every process on the machine as a scan of ``/proc``
    does. A process forked or reparented during the walk may be missed, as in any scan: callers that kill repeat."""
    children_of = _children_reader()
    found: set[int] = set()
    stack = [ancestor]
    while stack:
        for child in children_of(stack.pop()):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(ancestor)
    return found


def _children_reader() -> Callable[[int], list[int]]:
    """A function giving the children of a pid: from ``/proc/<pid>/task/<tid>/children`` when this kernel has those
    files (``CONFIG_PROC_CHILDREN``), else from one scan of the process table taken now."""
    if _has_children_files():
        return _children
    table: dict[int, list[int]] = {}
    for pid, ppid, _sid in _table():
        table.setdefault(ppid, []).append(pid)
    return lambda pid: table.get(pid, [])


@functools.cache
def _has_children_files() -> bool:
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (none when it is gone)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                found += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return found


def command_name(pid: int) -> str:
    """The command name of ``pid`` (``comm``), or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return ""
    return stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")


def start_ticks(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``); -1 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return int(stat[stat.rfind(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


def signal_all(pids: Iterable[int], signum: int) -> None:
    """Send ``signum`` to every pid (gone ones are ignored)."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: Iterable[int], within: float = END_WITHIN) -> bool:
    """Wait until none of ``pids`` can run code (``alive``), at most ``within`` seconds; True when none can."""
    waiting = set(pids)
    deadline = time.monotonic() + within
    while waiting := {pid for pid in waiting if alive(pid)}:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL every pid (gone ones are ignored)."""
    signal_all(pids, signal.SIGKILL)


PF_EXITING = 0x4
"""The kernel's flag of a process whose code has ended (killed, or returning) while it is taken down."""


def runs_code(stat: bytes) -> bool:
    """Whether the process whose ``/proc/<pid>/stat`` line is ``stat`` is neither a zombie nor exiting."""
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0] not in (b"Z", b"X") and not int(fields[6]) & PF_EXITING


def alive(pid: int) -> bool:
    """Whether ``pid`` can still run code: it exists, is not a zombie and is not exiting. A killed process is
    exiting, its code ended, for as long as the kernel takes to free it (long on a loaded machine): nothing it runs
    can change a file or start a process any more, so it is nobody's running process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return runs_code(stat)
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
