"""What a local backend holds and must release: its shells, cgroups, started evaluation and private folder.

The folder's owner keeps a lock for as long as it lives, so that a later env can remove the folders of owners that
died before they could (``sweep_orphans``). The cgroups also count the limit events the agent's commands run into.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cgroups, layers, quota
from . import limits as limits_mod
from .evaluation import Started, force_rmtree
from .owners import owner_lives
from .session import ShellSession

ROOT_PREFIX = quota.ENV_FOLDER_PREFIX
OWNER_FILE = quota.OWNER_FILE
NewSession = Callable[[limits_mod.PidsCgroup | None, limits_mod.MemoryCgroup | None], ShellSession]
"""Starts a shell whose processes are in the given pids and memory cgroups."""


@dataclass(frozen=True)
class Folders:
    """The layout of a backend's private folder ``root``: ``workspace`` (the agent's, on this machine), ``home`` and
    ``tmp`` (its shell's when unsandboxed), ``commands`` (the files of ``add_commands``), ``pristine`` (the copies
    evaluations put back) and ``scratch`` (where evaluations copy the workspace)."""

    root: Path
    workspace: Path
    home: Path
    tmp: Path
    commands: Path
    pristine: Path
    scratch: Path

    @classmethod
    def make(cls, root: Path) -> Folders:
        """Create the folders inside ``root``."""
        folders = cls(root, root / "workspace", root / "home", root / "tmp", root / "commands", root / "pristine",
                      root / "scratch")
        for folder in (folders.home, folders.tmp, folders.commands, folders.pristine, folders.scratch,
                       folders.workspace):
            folder.mkdir()
        return folders


class Resources:
    """Everything the backend must release: the session, the cgroup and its private folder.

    Kept apart from the backend so that ``weakref.finalize`` can release them without holding the backend alive.
    """

    def __init__(self, root: Path):
        self.root = root
        self.owner = os.getpid()
        self.session: ShellSession | None = None
        self.cgroup: limits_mod.PidsCgroup | None = None
        self.memory: limits_mod.MemoryCgroup | None = None
        self.envelope: cgroups.Envelope | None = None
        """The env's CPU cgroups (and, on the unified hierarchy, the folder holding its limits): ``cgroups.py``."""
        self.joining = cgroups.AGENT
        """Which part of the envelope a shell started now joins: ``SPARE`` while ``start_warm`` starts one."""
        self.owner_lock: int | None = None
        self.warm: ShellSession | None = None
        """The next episode's shell, started ahead in its own sandbox and in the spare cgroups (see ``reset``)."""
        self.warm_workspace: tuple[int, int] | None = None
        """The workspace folder (device, inode) that ``warm``'s sandbox mounted."""
        self.spare_cgroup: limits_mod.PidsCgroup | None = None
        self.spare_memory: limits_mod.MemoryCgroup | None = None
        self.evaluation: Started | None = None
        """The episode's next evaluation, started ahead after the previous one (see ``Evaluator.start``)."""
        self.limit_hits = 0
        """The pids cgroup's count of refused forks when the session's last command started."""
        self.oom_kills = 0
        """The memory cgroup's count of kills when the session's last command started."""
        self.view: layers.OverlayView | None = None
        """A forked env's copy-on-write workspace (``forking.py``), None for a plain one."""
        self.layers: list[layers.Layer] = []
        """The frozen layers ``view`` stands on (topmost first), held while this env lives."""
        self.spares: Any = None
        """The children made ahead for this env's next fork (``spares.Spares``), None before its first."""

    # -- cgroups ---------------------------------------------------------------------------------------------------
    def make_cgroups(self, limits: limits_mod.Limits, notes: list[str]) -> int | None:
        """Make the session's cgroups for ``limits``; return the ``RLIMIT_NPROC`` to set instead when no pids cgroup
        could be made (None when none is needed or it would not apply: then a note says so)."""
        nproc: int | None = None
        self.envelope = cgroups.Envelope.create(
            limits.cpu_cores, limits.max_processes, limits.memory_limit_mb << 20 if limits.memory_limit_mb else None)
        envelope = self.envelope
        if envelope is None:
            cgroups.warn_no_envelope()
            notes.append(cgroups.NO_CPU_ENVELOPE)
        elif not envelope.weighted:
            notes.append(cgroups.NO_CPU_WEIGHT)
        if envelope is not None and "pids" in envelope.v2_limits:
            self.cgroup = limits_mod.PidsCgroup(envelope.roots["unified"], joinable=False)
        if envelope is not None and "memory" in envelope.v2_limits:
            self.memory = limits_mod.MemoryCgroup(envelope.roots["unified"], v2=True, joinable=False)
        if limits.max_processes and self.cgroup is None:
            self.cgroup = limits_mod.PidsCgroup.create(limits.max_processes)
            if self.cgroup is None and os.geteuid() != 0:
                nproc = limits_mod.user_process_count() + limits.max_processes
            elif self.cgroup is None:
                notes.append("max_processes is not enforced: no pids cgroup could be created, and running as "
                             "root RLIMIT_NPROC does not apply")
        if limits.memory_limit_mb and self.memory is None:
            self.memory = limits_mod.MemoryCgroup.create(limits.memory_limit_mb)
        if limits.memory_limit_mb:
            _PROMISED[str(self.root)] = limits.memory_limit_mb
            warn_if_overcommitted(self.memory)
        return nproc

    def make_spare_cgroups(self, limits: limits_mod.Limits) -> bool:
        """Make the spare cgroups a warm shell waits in, like the session's; False when they cannot be made. On the
        unified hierarchy the env's folder holds the limits, and the spare shell waits in its own subfolder of it."""
        if self.cgroup is not None:
            self.spare_cgroup = self.cgroup if not self.cgroup.joinable else limits_mod.PidsCgroup.create(
                limits.max_processes or 0)
        if self.memory is not None:
            self.spare_memory = self.memory if not self.memory.joinable else limits_mod.MemoryCgroup.create(
                limits.memory_limit_mb or 0)
        return (self.spare_cgroup is None) == (self.cgroup is None) and (self.spare_memory is None) == (
            self.memory is None)

    def swap_cgroups(self) -> None:
        """The spare cgroups (the warm shell's) become the session's, and the session's the spare ones."""
        self.cgroup, self.spare_cgroup = self.spare_cgroup, self.cgroup
        self.memory, self.spare_memory = self.spare_memory, self.memory
        if self.envelope is not None:
            self.envelope.swap()

    def join_files(
        self, part: str, cgroup: limits_mod.PidsCgroup | None, memory: limits_mod.MemoryCgroup | None
    ) -> list[str]:
        """The files a process writes its pid to so as to be in ``cgroup``, ``memory`` and the envelope's ``part``
        (``cgroups.AGENT``, ``SPARE`` or ``EVAL``) before it runs anything."""
        files = [c.procs_file for c in (cgroup, memory) if c is not None and c.joinable]
        return files + (self.envelope.procs_files(part) if self.envelope is not None else [])

    def members_of_part(self, part: str, cgroup: limits_mod.PidsCgroup | None) -> Callable[[], set[int]] | None:
        """What lists the processes of a shell started now in ``part``: its envelope folder (the one it joins now,
        whatever part it plays later), else its pids cgroup; None when there is neither."""
        if self.envelope is not None:
            name, envelope = self.envelope.folder_name(part), self.envelope
            return lambda: envelope.members_of(name)
        return cgroup.members if cgroup is not None else None

    def cpu_meter(self, part: str) -> cgroups.CpuMeter | None:
        """What counts the CPU a shell started now in ``part`` uses: its envelope folder's, whatever part it plays
        later (``cgroups.CpuMeter``); None where nothing counts it."""
        if self.envelope is None:
            return None
        return self.envelope.cpu_meter(self.envelope.folder_name(part))

    def limit_events(self) -> int:
        """Memory kills and process-limit hits of this env so far (each cgroup's own count)."""
        memory, pids = self.memory, self.cgroup
        return (memory.oom_kills() if memory else 0) + (pids.hit_limit_count() if pids else 0)

    def count_limit_events(self) -> None:
        """Take the cgroups' counts now, as the ones ``after_command`` compares with (a new session starts)."""
        self.limit_hits = self.cgroup.hit_limit_count() if self.cgroup else 0
        self.oom_kills = self.memory.oom_kills() if self.memory else 0

    def after_command(self, output: str, limits: limits_mod.Limits) -> str:
        """Say when the command ran into the memory limit; stop what it left behind at the process limit."""
        memory = self.memory
        if memory is not None and memory.oom_kills() != self.oom_kills:
            self.oom_kills = memory.oom_kills()
            note = (
                f"NOTE: the command ran out of memory: this environment may use {limits.memory_limit_mb} MB in "
                "all, and the system killed the process that went over it."
            )
            output = f"{output}\n{note}" if output else note
        cgroup = self.cgroup
        if cgroup is None:
            return output
        hits = cgroup.hit_limit_count()
        if hits == self.limit_hits:
            return output
        if self.session is not None:
            self.session.kill_processes()
            # killed processes hold their slots until reaped (by init, for orphans): wait so the shell can fork again
            cgroup.wait_reaped(keep=len(cgroup.members()))
            # the shell reports its killed background jobs ("Killed", "Done") when it next runs something: let it do
            # so now, in a command whose output nobody sees, rather than in front of the agent's next command
            self.session.run("builtin wait", timeout=10)
            self.session.discard_pending()  # what the stopped processes printed after the command ended
        self.limit_hits = cgroup.hit_limit_count()
        note = (
            f"NOTE: the command reached the limit of {limits.max_processes} processes; every process it left "
            "running was stopped."
        )
        return f"{output}\n{note}" if output else note

    # -- shells and evaluation -------------------------------------------------------------------------------------
    def start_warm(self, workspace: Path, new_session: NewSession) -> None:
        """Start the next episode's shell now (``new_session`` in the spare cgroups), so that the next reset need not
        wait for a sandbox to start.

        It is a whole new sandbox (namespaces, in-memory folders, shell), as a reset would start, and nothing runs in
        it before it is taken: ``reset`` then runs the shell's set-up in it. It waits in cgroups of its own (the
        spare ones, with the session's limits), so the agent's processes and limits never include it, and joining
        them (which costs the kernel milliseconds) happens in the background, in the sandbox's own starter.
        """
        if self.warm is not None:
            return
        try:
            self.warm_workspace = folder_identity(workspace)
            self.joining = cgroups.SPARE
            self.warm = new_session(self.spare_cgroup, self.spare_memory)
        except OSError:
            self.warm = None
        finally:
            self.joining = cgroups.AGENT

    def take_warm(self, workspace: Path) -> ShellSession | None:
        """The warm shell, whose cgroups become the session's; None when there is none to take: it ended (its
        sandbox could not start), or ``workspace`` is another folder than the one its sandbox shows."""
        warm, self.warm = self.warm, None
        if warm is None:
            return None
        if not warm.alive or self.warm_workspace != folder_identity(workspace):
            warm.kill()
            return None
        self.swap_cgroups()
        return warm

    @contextlib.contextmanager
    def frozen_session(self) -> Iterator[None]:
        """Nothing of the agent's runs while the block does (the workspace is being copied)."""
        session = self.session
        stopped = session.pause() if session is not None and session.alive else set()
        try:
            yield
        finally:
            if session is not None:
                session.resume(stopped)

    def stop_session(self) -> None:
        """Kill the agent's shell and everything it started: what is still in its cgroup too (nothing, normally:
        the sandbox's PID namespace ends with its shell)."""
        if self.session is not None:
            self.session.kill()
            self.session = None
            if self.envelope is not None:
                self.envelope.kill(cgroups.AGENT, until_gone=False)

    def stop_warm(self) -> None:
        """Kill the next episode's shell, started ahead."""
        if self.warm is not None:
            self.warm.kill()
            self.warm = None

    def stop_evaluation(self) -> None:
        """End the evaluation started ahead."""
        if self.evaluation is not None:
            self.evaluation.end()
            self.evaluation = None

    # -- release ---------------------------------------------------------------------------------------------------
    def release(self) -> None:
        """Release everything; never raises (``close()`` must not fail on what the agent left): each part that
        fails is warned about and the others are still released."""
        if os.getpid() != self.owner:
            return  # a forked child inherited this finalizer: the resources belong to the parent
        for part in (self.stop_spares, self.stop_session, self.stop_warm, self.stop_evaluation, self.stop_view,
                     self._remove_cgroups, self._remove_root):
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - reported, and the rest is released anyway
                warnings.warn(f"local backend: closing {self.root} failed in part: {exc!r}", RuntimeWarning,
                              stacklevel=2)
        if self.owner_lock is not None:
            os.close(self.owner_lock)
            self.owner_lock = None

    def stop_spares(self) -> None:
        """Close the children made ahead for a fork (``spares.py``)."""
        spares, self.spares = self.spares, None
        if spares is not None:
            spares.close()

    def stop_view(self) -> None:
        """Unmount a forked env's copy-on-write view and let go of its frozen layers (the last user removes one)."""
        view, self.view = self.view, None
        if view is not None:
            view.stop()
        held, self.layers = self.layers, []
        for layer in held:
            layer.release()

    def _remove_cgroups(self) -> None:
        _PROMISED.pop(str(self.root), None)
        envelope, self.envelope = self.envelope, None
        for _ in range(2):  # the session's and the spare ones
            if self.cgroup is not None:
                from . import procs

                deadline = time.monotonic() + 2
                while self.cgroup.members() and time.monotonic() < deadline:
                    procs.kill_all(self.cgroup.members())
                    time.sleep(0.01)
                self.cgroup.remove()
                self.cgroup = None
            if self.memory is not None:
                self.memory.remove()
                self.memory = None
            self.swap_cgroups()
        if envelope is not None:
            envelope.remove()

    def _remove_root(self) -> None:
        if not force_rmtree(self.root):
            warnings.warn(f"local backend: could not delete all of {self.root}", RuntimeWarning, stacklevel=3)


def sweep_orphans(parent: Path) -> None:
    """Remove backend folders whose owning process is gone (it was SIGKILLed before it could clean up).

    The owner holds a lock on its ``owner.pid`` for as long as it lives; a folder is an orphan only when that lock
    can be taken. Locks, unlike pids, mean the same in every PID namespace, and writing the file forges nothing.
    A folder that cannot be deleted is warned about, never an error: it is another process's leftover, and this
    env can start without it gone.
    """
    try:
        candidates = list(parent.glob(f"{ROOT_PREFIX}*/{OWNER_FILE}"))
    except OSError:
        return
    for owner_file in candidates:
        if owner_lives(owner_file) is not False:
            continue  # its owner is alive, or the file is gone
        try:
            removed = force_rmtree(owner_file.parent)
        except Exception as exc:  # noqa: BLE001 - someone else's folder must not stop this env
            removed, why = False, f": {exc!r}"
        else:
            why = ""
        if not removed:
            warnings.warn(f"local backend: could not delete the abandoned folder {owner_file.parent}{why}",
                          RuntimeWarning, stacklevel=3)


def hold_owner_lock(root: Path) -> int:
    """Write ``owner.pid`` and lock it for this process's lifetime (see ``sweep_orphans``).

    The file is locked under another name and then renamed: a sweep (another env starting, in this process or
    another) that found ``owner.pid`` between its creation and its lock would take it for an orphan's.
    """
    pending = root / f".{OWNER_FILE}.pending"
    fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, str(os.getpid()).encode())
    os.rename(pending, root / OWNER_FILE)
    return fd


def folder_identity(path: Path) -> tuple[int, int] | None:
    """``path``'s (device, inode), None when it cannot be read: tells a folder from another made in its place."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


# -- memory promised to envs ------------------------------------------------------------------------------------------
_PROMISED: dict[str, int] = {}
"""This process's live envs: private folder -> ``memory_limit_mb``."""

class MemoryOvercommitWarning(RuntimeWarning):
    """The memory limits of the envs on this machine, every process's, add up to more than its memory. It says what
    the machine holds now, not what the code asked: filter it by this class, never turn it into an error."""


OVERCOMMITTED = (
    "the memory limits of the {count} envs on this machine add up to {promised} MB, more than its {total} MB of "
    "memory: when they use it, the kernel's OOM killer will kill envs' processes (each sandboxed process is its first "
    "choice, oom_score_adj 1000, never the trainer), so envs lose work. Lower memory_limit_mb or run fewer envs.")


def promised_memory_mb(memory: limits_mod.MemoryCgroup | None) -> tuple[int, int]:
    """(envs, MB) the envs on this machine may use together: the limits of every env's memory cgroup beside
    ``memory`` (every process's envs that share its parent cgroup), else this process's envs' ``memory_limit_mb``."""
    if memory is None:
        return len(_PROMISED), sum(_PROMISED.values())
    name = "memory.max" if memory.v2 else "memory.limit_in_bytes"
    count, total = 0, 0
    for folder in memory.path.parent.glob(f"{cgroups.PREFIX}*"):
        try:
            value = (folder / name).read_text().strip()
        except OSError:
            continue
        if value.isdigit():
            count, total = count + 1, total + (int(value) >> 20)
    return count, total


def machine_memory_mb() -> int | None:
    """The machine's memory (``MemTotal``), None where ``/proc/meminfo`` cannot be read."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) >> 10
    except (OSError, ValueError, IndexError):
        pass
    return None


def warn_if_overcommitted(memory: limits_mod.MemoryCgroup | None) -> bool:
    """Warn (once per process) when the envs' memory limits add up to more than the machine's memory; True if so."""
    total = machine_memory_mb()
    count, promised = promised_memory_mb(memory)
    if total is None or promised <= total:
        return False
    if not _warned:
        _warned.append(True)
        warnings.warn(OVERCOMMITTED.format(count=count, promised=promised, total=total), MemoryOvercommitWarning,
                      stacklevel=4)
    return True


_warned: list[bool] = []
