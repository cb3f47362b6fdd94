"""Finding and ending the processes a shell session started, without third-party packages.

A session's shell leads its own session (``setsid``), so everything it starts shares its session id unless it called
``setsid`` itself; those escapees are still its descendants or members of its cgroup (see ``limits.PidsCgroup``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable


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


def first_descendant_named(ancestor: int, name: str) -> list[int]:
    """The pids from a child of ``ancestor`` down to its nearest descendant whose command name is ``name`` (breadth
    first), or an empty list when there is none yet."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _sid in _table():
        children.setdefault(ppid, []).append(pid)
    queue: list[list[int]] = [[child] for child in sorted(children.get(ancestor, []))]
    while queue:
        chain = queue.pop(0)
        if command_name(chain[-1]) == name:
            return chain
        queue += [[*chain, child] for child in sorted(children.get(chain[-1], []))]
    return []


def command_name(pid: int) -> str:
    """The command name of ``pid`` (``comm``), or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return ""
    return stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")


def signal_all(pids: Iterable[int], signum: int) -> None:
    """Send ``signum`` to every pid (gone ones are ignored)."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL every pid (gone ones are ignored)."""
    signal_all(pids, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
