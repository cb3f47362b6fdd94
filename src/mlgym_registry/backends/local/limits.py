"""Resource limits and network isolation for a session's shell.

- CPU seconds and address space: ``resource.setrlimit`` in the child before ``exec``.
- Process count: a ``pids`` cgroup when this process may create one (typically as root, where ``RLIMIT_NPROC`` does
  not apply), else ``RLIMIT_NPROC`` set to the user's current count plus the allowance.
- Memory: a memory cgroup for the whole env when this process may make one, else ``RLIMIT_AS`` per process.
- CPU share: the env's CPU cgroups (``cgroups.py``); on the unified (v2) hierarchy they also hold the process and
  memory limits, since a process is in one v2 cgroup only.
- File size: ``RLIMIT_FSIZE``.
- The OOM killer's choice: every process of an env starts with ``oom_score_adj`` ``OOM_SCORE_ADJ`` (1000, the most),
  inherited by everything it starts, so when the machine runs out of memory the kernel kills an env's process, never
  the trainer (which keeps its own, lower value); the sandbox's ``/proc`` is read-only, so no process of the agent
  can lower it again.
- Network, only for ``sandbox="none"`` (the sandbox has its own network namespace): the shell runs under
  ``unshare -n`` when the OS permits it; this is checked once per process, with a one-time warning when it is not.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

OOM_SCORE_ADJ = 1000
"""The ``oom_score_adj`` of every process an env starts (the kernel's most: such a process is the OOM killer's first
choice, whatever its size). Raising one's own value needs no privilege; lowering it again does, or a writable
``/proc`` where the raise was made without ``CAP_SYS_RESOURCE`` (the sandbox's ``/proc`` is read-only)."""

OOM_SCORE_ADJ_FILE = "/proc/self/oom_score_adj"

SANDBOX_PENDING_SIGNALS = 1024
"""``RLIMIT_SIGPENDING`` in the sandbox: the most signals its processes may have queued (the host counts them against
the driver's user)."""


@dataclass(frozen=True)
class Limits:
    """What a session may use. ``None`` means no limit."""

    memory_limit_mb: int | None = None
    cpu_seconds: int | None = None
    max_processes: int | None = None
    cpu_cores: float | None = None
    """A hard quota on the env's CPU, in cores (None: no quota, the env's fair share when CPUs are contended)."""


def _set(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def make_preexec(
    limits: Limits, nproc: int | None, cgroup_procs: str | list[str] | None, *, memory_rlimit: bool = True,
    file_size_mb: int | None = None,
) -> Callable[[], None]:
    """The function run in the child between fork and exec: join the cgroups, then set the rlimits.

    ``memory_rlimit=False`` when a memory cgroup enforces the memory limit (for the whole env, not per process).
    It only makes system calls on values computed beforehand, so it is safe to run in a forked child.
    """
    pid_files = [p.encode() for p in ([cgroup_procs] if isinstance(cgroup_procs, str) else cgroup_procs or [])]
    memory = limits.memory_limit_mb * 1024 * 1024 if limits.memory_limit_mb and memory_rlimit else None
    file_size = file_size_mb * 1024 * 1024 if file_size_mb else None
    cpu = limits.cpu_seconds
    oom_score = str(OOM_SCORE_ADJ).encode()
    prctl = _prctl()
    on_main_thread = threading.current_thread() is threading.main_thread()
    parent = os.getpid()

    def preexec() -> None:
        if prctl is not None:
            # orphans of the session (a fork bomb's, a daemon's) become the shell's children rather than init's: they
            # stay in the session's process tree, and bash reaps them at once, so their slots under the process limit
            # come free without depending on how promptly this machine's pid 1 reaps
            prctl(_PR_SET_CHILD_SUBREAPER, 1)
            if on_main_thread:
                # die with the Python process even when it is SIGKILLed and never gets to close() us; only for
                # children of the main thread, since the signal fires when the forking *thread* ends
                prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != parent:
                    os._exit(1)
        for pid_file in pid_files:
            try:
                fd = os.open(pid_file, os.O_WRONLY)
                try:
                    os.write(fd, b"0")  # "0" means the writing process itself
                finally:
                    os.close(fd)
            except OSError:
                pass  # the cgroup went away: run without it rather than not at all
        try:
            fd = os.open(OOM_SCORE_ADJ_FILE, os.O_WRONLY)
            try:
                os.write(fd, oom_score)
            finally:
                os.close(fd)
        except OSError:
            pass  # no /proc: the cgroup's memory limit still holds the env
        if memory:
            _set(resource.RLIMIT_AS, memory)
        if file_size:
            _set(resource.RLIMIT_FSIZE, file_size)
        if cpu:
            _set(resource.RLIMIT_CPU, cpu)
        if nproc:
            _set(resource.RLIMIT_NPROC, nproc)

    return preexec


def exec_prefix(
    bash: str, limits: Limits, nproc: int | None, cgroup_procs: list[str], *, memory_rlimit: bool = True,
    file_size_mb: int | None = None,
) -> list[str]:
    """A command line prefix that does what ``make_preexec`` does to a sandbox, in a shell that then ``exec``s it.

    For the sandbox only: a ``preexec_fn`` makes Python ``fork`` its whole address space and run Python in the child
    (4 ms in a bare interpreter, 20 ms and more in a trainer holding a model), where without one it uses ``vfork``.
    The shell joins the cgroups before it sets the limits and before the sandbox starts, so everything the sandbox
    runs is inside them; a limit that cannot be set ends it (the session then fails to start). What the prefix
    leaves to others: death with the parent is bwrap's ``--die-with-parent`` (and the shell's input pipe, which ends
    with the parent), and the sandbox's shell is the reaper of its orphans (PID 1 of its namespace).
    """
    lines = [f"{{ builtin echo 0 >{shlex.quote(path)}; }} 2>/dev/null" for path in cgroup_procs]
    lines.append(f"{{ builtin echo {OOM_SCORE_ADJ} >{OOM_SCORE_ADJ_FILE}; }} 2>/dev/null")
    # charged to the user on the host (the driver's): no POSIX message queue for the sandbox, and its queued signals
    # bounded (the kernel counts them per user at every level of user namespace, each level against its own limit)
    lines.append(f"builtin ulimit -q 0 -i {SANDBOX_PENDING_SIGNALS} || builtin exit 126")
    # bash counts -v and -f in KiB (outside POSIX mode, which this environment does not ask for)
    values = [
        ("v", resource.RLIMIT_AS, limits.memory_limit_mb << 20 if limits.memory_limit_mb and memory_rlimit else None,
         1024),
        ("f", resource.RLIMIT_FSIZE, file_size_mb << 20 if file_size_mb else None, 1024),
        ("t", resource.RLIMIT_CPU, limits.cpu_seconds, 1),
        ("u", resource.RLIMIT_NPROC, nproc, 1),
    ]
    for flag, which, value, unit in values:
        if not value:
            continue
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        lines.append(f"builtin ulimit -{flag} {max(value // unit, 1)} || builtin exit 126")
    lines.append('builtin exec "$@"')
    return [bash, "--noprofile", "--norc", "-c", "\n".join(lines), "mlgym-sandbox"]


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """Linux's ``prctl`` from the C library, or None where there is none."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def user_process_count() -> int:
    """How many processes (tasks) the current real user runs now (0 when it cannot be told)."""
    uid = os.getuid()
    count = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                continue
    return count


class Cgroup:
    """A cgroup of our own (v1 or v2): processes join it between fork and exec and stay in it with their children.

    ``joinable=False``: the env's folder on the unified hierarchy (``cgroups.Envelope``), whose processes are in its
    subfolders (a v2 process is in one cgroup only): they join those, and ``members`` counts them too."""

    def __init__(self, path: Path, joinable: bool = True):
        self.path = path
        self.joinable = joinable

    @property
    def procs_file(self) -> str:
        """The file a process writes its pid to in order to join."""
        return str(self.path / "cgroup.procs")

    def members(self) -> set[int]:
        """The pids in the cgroup now (and in its subfolders, for the unified hierarchy's env folder)."""
        folders = [self.path] if self.joinable else [self.path, *_subfolders(self.path)]
        found: set[int] = set()
        for folder in folders:
            try:
                found |= {int(line) for line in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                continue
        return found

    def remove(self) -> None:
        """Delete the (empty) cgroup."""
        _rmdir(self.path)


def _make_cgroup(parent: Path, configure: Callable[[Path], None]) -> Path | None:
    """A new cgroup under ``parent``, set up by ``configure``; None when this process may not make or set it."""
    _sweep_empty(parent)
    path = parent / f"mlgym-registry-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError:
        return None
    try:
        configure(path)
    except OSError:
        _rmdir(path)
        return None
    return path


class PidsCgroup(Cgroup):
    """A ``pids`` cgroup capping how many tasks a session may have at once."""

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        """A new cgroup limited to ``max_pids`` tasks, or None when this process may not make one."""
        for parent in _candidate_parents():
            path = _make_cgroup(parent, lambda p: (p / "pids.max").write_text(str(max_pids)))
            if path is not None:
                return cls(path)
        return None

    def current(self) -> int:
        """How many tasks the cgroup counts now (exited ones still count until their parent or init reaps them)."""
        try:
            return int((self.path / "pids.current").read_text())
        except (OSError, ValueError):
            return 0


    def wait_reaped(self, keep: int, within: float = 5.0) -> bool:
        """Wait until at most ``keep`` tasks are counted, i.e. killed processes were reaped; True when they were."""
        deadline = time.monotonic() + within
        while self.current() > keep:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


    def hit_limit_count(self) -> int:
        """How many forks the limit has refused so far."""
        try:
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0



class MemoryCgroup(Cgroup):
    """A memory cgroup (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``): one limit for a whole env."""

    def __init__(self, path: Path, v2: bool, joinable: bool = True):
        super().__init__(path, joinable)
        self.v2 = v2

    @classmethod
    def create(cls, limit_mb: int) -> MemoryCgroup | None:
        """A new cgroup whose processes may use ``limit_mb`` MiB together, or None when none may be made here."""
        for parent, v2 in _memory_parents():
            path = _make_cgroup(parent, lambda p, v2=v2: _set_memory_limit(p, limit_mb << 20, v2))
            if path is not None:
                return cls(path, v2)
        return None

    def oom_kills(self) -> int:
        """How many processes the kernel killed so far for going over the limit."""
        try:
            text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0



def _set_memory_limit(path: Path, limit: int, v2: bool) -> None:
    if not v2:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        return
    (path / "memory.max").write_text(str(limit))
    if (path / "memory.swap.max").exists():
        (path / "memory.swap.max").write_text("0")


def _memory_parents() -> list[tuple[Path, bool]]:
    """Where a v1 memory cgroup can be made (on v2, ``cgroups.Envelope`` sets the limit on the env's folder)."""
    parents: list[tuple[Path, bool]] = []
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "cgroup.procs").exists():
        own = _own_cgroup("memory")
        parents += [(v1 / own.lstrip("/"), False)] if own else []
    return parents


def _sweep_empty(parent: Path) -> None:
    """Remove empty cgroups left by processes that were killed before they could clean up.

    Never kills what is in one: the pid in a name may belong to another PID namespace, where it means another
    process, so a cgroup that still has members may be a live env's. A sandbox dies with its owner anyway.
    """
    try:
        stale = [p for p in parent.glob("mlgym-registry-*-*") if not pid_alive(p.name.split("-")[2])]
    except OSError:
        return
    for path in stale:
        _rmdir(path)  # fails, as it should, while the cgroup has members


def pid_alive(text: str) -> bool:
    """True when the process with pid ``text`` exists."""
    try:
        os.kill(int(text), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def _candidate_parents() -> list[Path]:
    """Where a v1 pids cgroup can be made (on v2, ``cgroups.Envelope`` sets the limit on the env's folder)."""
    parents = []
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists():
        own = _own_cgroup("pids")
        parents += [v1 / own.lstrip("/")] if own else []
        parents.append(v1)
    return parents


def _subfolders(path: Path) -> list[Path]:
    try:
        return [entry for entry in path.iterdir() if entry.is_dir()]
    except OSError:
        return []


def _own_cgroup(controller: str) -> str | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller and controller in controllers.split(",")) or (not controller and controllers == ""):
            return path
    return None


@functools.lru_cache(maxsize=1)
def network_isolation_prefix() -> tuple[str, ...] | None:
    """``("unshare", "-n")`` when this process may start programs without network, else None (checked once)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    try:
        done = subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (unshare, "-n") if done.returncode == 0 else None


NO_NETWORK_ISOLATION = (
    "the local backend cannot cut the network off for its shell sessions on this machine ('unshare -n' is missing or "
    "not permitted), so commands keep network access. Run as a user allowed to create network namespaces (e.g. root, "
    "or with unprivileged user namespaces enabled), or pass network=True to accept this and silence this warning."
)


@functools.lru_cache(maxsize=1)
def warn_no_network_isolation() -> None:
    """Warn, once per process, that commands keep network access."""
    warnings.warn(NO_NETWORK_ISOLATION, RuntimeWarning, stacklevel=3)
