"""Each env's CPU envelope: cgroups that give the env one fair share of the machine's CPUs, hold its limits on the
unified hierarchy, and count the CPU its evaluations use and the time they waited for one (``eval_clock``).

One env is one scheduling entity, however many processes it runs: its cgroup weighs as much as one ordinary process
per CPU of the machine (v1 ``cpu.shares`` 1024, v2 ``cpu.weight`` 100, times the CPU count), so a thousand busy
loops of one env take no more CPU from another env than one busy process per core would, and envs contending for the
CPUs get equal shares. No hard quota is set by default (``Limits.cpu_cores`` sets one): an env alone on the machine
may use every core. Inside it, the agent's processes and the evaluation's are sibling cgroups, the evaluation's with
64 times the weight, so that what the agent left running cannot slow its own evaluation down either::

    <env>/            the env's weight (and quota, if any); on v2 also its pids.max and memory.max
    <env>/agent/      the agent's shell and everything it starts      (weight 1/64 of the evaluation's)
    <env>/spare/      the next episode's shell, started ahead         (the same)
    <env>/eval/       the evaluation's processes                      (the CPU they use and wait for is counted)

The folders are made in every hierarchy that has a part of this: v1 ``cpu`` (weights), v1 ``cpuacct`` when mounted
apart (CPU used), and the unified (v2) hierarchy, with or without its ``cpu`` controller: it counts the time a
cgroup's processes waited for a CPU (``cpu.pressure``) and can kill a whole cgroup at once (``cgroup.kill``). A v2
process is in one cgroup only, so there the env's process and memory limits are set on ``<env>/`` too (v1 keeps its
own pids and memory cgroups, ``limits.py``). Processes join their leaves before they run the sandbox
(``limits.exec_prefix``), the weighing one last, so everything they start is inside and counted; the sandbox shows no
``/sys/fs/cgroup`` and has a cgroup namespace of its own, so nothing can leave.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from ...machine import usable_cores
from .limits import pid_alive

AGENT, SPARE, EVAL = "agent", "spare", "eval"
PARTS = (AGENT, SPARE, EVAL)
CPUS = usable_cores()
ENV_SHARES = 1024 * CPUS
"""v1 ``cpu.shares`` of an env: what one ordinary (nice 0) process per CPU weighs beside it."""
ENV_WEIGHT = min(100 * CPUS, 10_000)
"""v2 ``cpu.weight`` of an env: the same (v2 allows at most 10000)."""
V1_SHARES = {AGENT: 16, SPARE: 16, EVAL: 1024}
V2_WEIGHTS = {AGENT: 1, SPARE: 1, EVAL: 64}
PERIOD_US = 100_000
"""The CFS period of a quota (``Limits.cpu_cores``)."""
PREFIX = "mlgym-registry-"


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy: v1 with its ``controllers``, or the unified one (``v2``)."""

    mount: Path
    controllers: frozenset[str]
    v2: bool

    def own_folder(self) -> Path | None:
        """The folder of this process's own cgroup in the hierarchy (None when it is not listed)."""
        for line in _read("/proc/self/cgroup").splitlines():
            _, names, path = line.split(":", 2)
            listed = frozenset(names.split(",")) - {""}
            if (self.v2 and not names) or (not self.v2 and listed & self.controllers):
                return self.mount / path.lstrip("/")
        return None


@functools.cache
def hierarchies() -> tuple[Hierarchy, ...]:
    """The cgroup hierarchies mounted here, as ``/proc/self/mounts`` lists them (read once)."""
    found = []
    for line in _read("/proc/self/mounts").splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("cgroup", "cgroup2"):
            continue
        mount = Path(fields[1].replace("\\040", " "))
        if fields[2] == "cgroup2":
            found.append(Hierarchy(mount, frozenset(), True))
        else:
            options = frozenset(fields[3].split(","))
            found.append(Hierarchy(mount, options & {"cpu", "cpuacct", "memory", "pids", "freezer"}, False))
    return tuple(found)


@dataclass
class Usage:
    """An evaluation's CPU so far (cumulative: the clock compares readings), in seconds."""

    cpu: float
    """CPU time its processes used (exited ones included where a cgroup counts it)."""
    pressure: float | None
    """Wall-clock time in which a runnable process of its cgroup waited for a CPU (v2 ``cpu.pressure`` ``some``);
    None where there is no such count."""
    waits: dict[int, float]
    """Run-queue wait of each of its live threads (``/proc/<tid>/schedstat``): they overlap, and exited threads'
    are lost."""


class Envelope:
    """The env's cgroups (see the module's description), in every hierarchy where they could be made."""

    def __init__(self, roots: dict[str, Path], weighted: bool, v2_limits: frozenset[str]):
        self.roots = roots
        """The env's folder per use: ``"cpu"`` (v1 weights), ``"cpuacct"`` (v1 CPU used), ``"unified"`` (v2)."""
        self.weighted = weighted
        """Whether the env has a CPU weight of its own (a ``cpu`` controller was there to set it)."""
        self.v2_limits = v2_limits
        """The limits set on the unified folder itself (``"pids"``, ``"memory"``) where v2 has those controllers."""
        self.roles = {AGENT: AGENT, SPARE: SPARE, EVAL: EVAL}
        """Which folder plays which part: ``swap`` trades the agent's and the spare one at a reset."""

    @classmethod
    def create(cls, cores: float | None = None, max_pids: int | None = None,
               memory_bytes: int | None = None) -> Envelope | None:
        """The env's cgroups, with a quota of ``cores`` CPUs when given; on the unified hierarchy also its
        ``max_pids`` and ``memory_bytes`` limits where v2 has those controllers. None when none could be made."""
        roots: dict[str, Path] = {}
        weighted = False
        v2_limits: frozenset[str] = frozenset()
        for hierarchy in hierarchies():
            parent = hierarchy.own_folder()
            if parent is None:
                continue
            if hierarchy.v2 and "unified" not in roots:
                delegated = set(_read(parent / "cgroup.subtree_control").split())
                limits = frozenset(n for n, v in (("pids", max_pids), ("memory", memory_bytes)) if v and n in delegated)
                root = _make_tree(parent, lambda path, part, d=delegated, lim=limits: _configure_v2(
                    path, part, "cpu" in d, cores, max_pids if "pids" in lim else None,
                    memory_bytes if "memory" in lim else None))
                if root is not None:
                    roots["unified"], v2_limits = root, limits
                    weighted = weighted or "cpu" in delegated
            elif not hierarchy.v2 and "cpu" in hierarchy.controllers and "cpu" not in roots:
                root = _make_tree(parent, lambda path, part: _configure_v1(path, part, cores))
                if root is not None:
                    roots["cpu"], weighted = root, True
                    if "cpuacct" in hierarchy.controllers:
                        roots["cpuacct"] = root
            elif not hierarchy.v2 and "cpuacct" in hierarchy.controllers and "cpuacct" not in roots:
                root = _make_tree(parent, lambda path, part: None)
                if root is not None:
                    roots["cpuacct"] = root
        return cls(roots, weighted, v2_limits) if roots else None

    def _distinct_roots(self) -> list[Path]:
        """The env's folders, the one that weighs its CPU last: a process joining them in this order is counted
        (CPU used, time stalled) from before the moment the env's weight may slow it down."""
        order = [self.roots[use] for use in ("unified", "cpuacct", "cpu") if use in self.roots]
        return list(dict.fromkeys(order[::-1]))[::-1]

    def folder_name(self, part: str) -> str:
        """The name of the folder that plays ``part`` now (``AGENT``, ``SPARE`` or ``EVAL``)."""
        return self.roles[part]

    def procs_files(self, part: str) -> list[str]:
        """The files a process writes to in order to join ``part``, one per hierarchy, in the order to join them."""
        return [str(root / self.roles[part] / "cgroup.procs") for root in self._distinct_roots()]

    def members_of(self, name: str) -> set[int]:
        """The processes in the folders called ``name`` (``folder_name``), in any hierarchy."""
        found: set[int] = set()
        for root in self._distinct_roots():
            found |= _numbers(root / name / "cgroup.procs")
        return found

    def members(self, part: str) -> set[int]:
        """The processes in ``part`` now."""
        return self.members_of(self.roles[part])

    def swap(self) -> None:
        """The spare folder (the warm shell's) becomes the agent's, and the agent's the spare one."""
        self.roles[AGENT], self.roles[SPARE] = self.roles[SPARE], self.roles[AGENT]

    def usage(self, part: str = EVAL) -> Usage:
        """The CPU ``part``'s processes used and waited for so far (cumulative: compare two readings)."""
        name = self.roles[part]
        unified = self.roots.get("unified")
        threads: set[int] = set()
        for root in self._distinct_roots():
            threads |= _numbers(root / name / ("cgroup.threads" if root == unified else "tasks"))
        cpu, waits = thread_times(threads)
        pressure = None
        if unified is not None:
            cpu = _stat_field(unified / name / "cpu.stat", "usage_usec") / 1e6
            some = _pressure_total(unified / name / "cpu.pressure", "some")
            pressure = some / 1e6 if some is not None else None
        elif "cpuacct" in self.roots:
            cpu = _number(self.roots["cpuacct"] / name / "cpuacct.usage") / 1e9
        return Usage(cpu, pressure, waits)

    def cpu_meter(self, name: str) -> CpuMeter | None:
        """What counts the CPU the processes of the folders called ``name`` (``folder_name``) use (``CpuMeter``);
        None without a unified hierarchy."""
        unified = self.roots.get("unified")
        if unified is None:
            return None
        meter = CpuMeter(unified / name)
        return meter if meter() is not None else None

    def kill(self, part: str, within: float = 2.0, *, everywhere: bool = False, until_gone: bool = True) -> bool:
        """Kill every process of ``part`` (all at once through v2's ``cgroup.kill`` where there is one, else one by
        one until none is left); True when none is left. ``everywhere``: look in every hierarchy even when the
        unified one says the part is empty (a process that could not join it may be in the others).

        ``until_gone=False`` returns as soon as every process listed has been sent SIGKILL and a fresh reading shows
        no new one, without waiting for the killed ones to exit: SIGKILL cannot be caught, and what is still dying
        cannot start anything. A reset takes this path, since waiting for the old shell's processes to leave the
        folder cost it milliseconds; removing the folders (``remove``) waits, as an empty folder is what it needs."""
        name = self.roles[part]
        unified = self.roots.get("unified")
        if unified is not None:
            if not everywhere and "populated 0" in _read(unified / name / "cgroup.events"):
                return True  # nothing in it (nor below it): the usual case, one read
            with contextlib.suppress(OSError):
                (unified / name / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + within
        signalled: set[int] = set()
        while True:
            members = self.members_of(name)
            if not members or (not until_gone and members <= signalled):
                return True
            if time.monotonic() > deadline:
                return False
            for pid in members:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            signalled |= members
            if until_gone:
                time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left in the env's cgroups and delete them."""
        for part in PARTS:
            self.kill(part, everywhere=True)
        for root in self._distinct_roots():
            _rmtree(root)

    def describe(self) -> str:
        """Where the env's cgroups are, for notes and errors."""
        return ", ".join(str(root) for root in self._distinct_roots())


class CpuMeter:
    """The CPU seconds the processes of one unified cgroup used so far (``cpu.stat`` ``usage_usec``: exited processes
    count), read for the clock of a command that runs on (``command_clock``): one raw read of about 11 us."""

    def __init__(self, folder: Path):
        self._stat = str(folder / "cpu.stat")

    def __call__(self) -> float | None:
        """The seconds now, or None when they cannot be read."""
        stat = _read_bytes(self._stat)  # it begins "usage_usec N\n"
        if not stat.startswith(b"usage_usec "):
            return None
        return int(stat[11:stat.index(b"\n")]) / 1e6


NO_CPU_ENVELOPE = (
    "no CPU cgroup could be made for this env (no cgroup hierarchy this process may write to): its processes compete "
    "for the CPUs one by one with every other process of the machine, so another env's busy processes can slow its "
    "evaluations down. The process limit falls back to RLIMIT_NPROC and the memory limit to a per-process address-"
    "space limit; evaluations are still timed in the time they could run (their threads' run-queue waits are not "
    "counted against them). Run as root or in a delegated cgroup subtree for a per-env CPU share."
)


NO_CPU_WEIGHT = (
    "this env's cgroups have no CPU weight (no cpu controller is delegated to this process): its processes compete "
    "for the CPUs one by one with every other process of the machine. Evaluations are still timed in the time they "
    "could run."
)


@functools.cache
def warn_no_envelope() -> None:
    """Warn, once per process, that envs get no CPU cgroups here."""
    warnings.warn(NO_CPU_ENVELOPE, RuntimeWarning, stacklevel=3)


def thread_times(threads: set[int] | None = None) -> tuple[float, dict[int, float]]:
    """The CPU time of ``threads`` (thread ids; None: the calling thread) in all and the run-queue wait of each, in
    seconds, from ``/proc/<tid>/schedstat``."""
    each = each_thread_times(threads)
    return sum(cpu for cpu, _ in each.values()), {tid: wait for tid, (_, wait) in each.items()}


def each_thread_times(threads: set[int] | None = None) -> dict[int, tuple[float, float]]:
    """The CPU time and the run-queue wait of each of ``threads`` that still runs (thread ids; None: the calling
    thread, as -1), in seconds, from ``/proc/<tid>/schedstat``."""
    each: dict[int, tuple[float, float]] = {}
    for tid in threads if threads is not None else [-1]:
        fields = (_read_bytes(f"/proc/{tid}/schedstat") if tid >= 0 else _own_schedstat()).split()
        if len(fields) >= 2:
            each[tid] = (int(fields[0]) / 1e9, int(fields[1]) / 1e9)
    return each


def process_threads(pids: set[int]) -> set[int]:
    """Every thread of ``pids``."""
    threads: set[int] = set()
    for pid in pids:
        try:
            threads |= {int(t) for t in os.listdir(f"/proc/{pid}/task")}
        except (OSError, ValueError):
            continue
    return threads


def _configure_v1(path: Path, part: str | None, cores: float | None) -> None:
    (path / "cpu.shares").write_text(str(V1_SHARES[part] if part else ENV_SHARES))
    if part is None and cores:
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(max(1000, int(cores * PERIOD_US))))


def _configure_v2(path: Path, part: str | None, weights: bool, cores: float | None, max_pids: int | None,
                  memory_bytes: int | None) -> None:
    if part is not None:
        if weights:
            (path / "cpu.weight").write_text(str(V2_WEIGHTS[part]))
        return
    if max_pids:
        (path / "pids.max").write_text(str(max_pids))
    if memory_bytes:
        (path / "memory.max").write_text(str(memory_bytes))
        if (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
    if weights:
        (path / "cpu.weight").write_text(str(ENV_WEIGHT))
        if cores:
            (path / "cpu.max").write_text(f"{max(1000, int(cores * PERIOD_US))} {PERIOD_US}")
        (path / "cgroup.subtree_control").write_text("+cpu")


def _make_tree(parent: Path, configure) -> Path | None:
    """The env's folder under ``parent`` with its three parts, set up by ``configure(path, part or None)``; None
    when this process may not make or set them."""
    _sweep_empty(parent)
    root = parent / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        root.mkdir()
    except OSError:
        return None
    try:
        configure(root, None)
        for part in PARTS:
            (root / part).mkdir()
            configure(root / part, part)
    except OSError:
        _rmtree(root)
        return None
    return root


def _sweep_empty(parent: Path) -> None:
    """Remove the empty env cgroups of processes that died before they could (the others may be a live env's of
    another PID namespace: never touched)."""
    try:
        stale = [p for p in parent.glob(f"{PREFIX}*-*") if not pid_alive(p.name[len(PREFIX):].split("-")[0])]
    except OSError:
        return
    for root in stale:
        _rmtree(root)


def _pressure_total(path: Path, kind: str) -> int | None:
    """The ``total`` of a pressure file's ``kind`` line (``some`` or ``full``, microseconds); None when there is
    none (no PSI on this kernel)."""
    for line in _read(path).splitlines():
        if line.startswith(kind + " "):
            for field in line.split():
                if field.startswith("total="):
                    return int(field[6:])
    return None


def _stat_field(path: Path, key: str) -> int:
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _number(path: Path) -> int:
    text = _read(path).strip()
    return int(text) if text.isdigit() else 0


def _numbers(path: Path) -> set[int]:
    return {int(word) for word in _read(path).split() if word.isdigit()}


def _read(path: str | Path) -> str:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""


class _ThreadFile:
    """A file descriptor that one thread keeps open, closed when the thread ends (its ``threading.local`` goes)."""

    def __init__(self, path: str):
        self.thread = threading.get_native_id()
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self) -> None:
        os.close(self.fd)


_this_thread = threading.local()


def _own_schedstat() -> bytes:
    """The calling thread's ``/proc/thread-self/schedstat``, opened once per thread and read with ``pread`` (2 us,
    where opening it each time cost 12 us of a 0.45 ms step: every command's clock reads it); empty when it cannot
    be read."""
    file = getattr(_this_thread, "schedstat", None)
    try:
        if file is None or file.thread != threading.get_native_id():  # a forked child's thread holds its parent's
            file = _this_thread.schedstat = _ThreadFile("/proc/thread-self/schedstat")
        return os.pread(file.fd, 256, 0)
    except OSError:
        return b""


def _read_bytes(path: str) -> bytes:
    """The start of a small kernel file, raw; empty when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _rmtree(path: Path) -> None:
    """Delete a cgroup folder and the (empty) cgroups below it, deepest first; what has members stays."""
    for folder, _, _ in sorted(os.walk(path), key=lambda entry: -entry[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
