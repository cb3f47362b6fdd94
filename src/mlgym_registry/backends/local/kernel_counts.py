"""What keeps the kernel's per-user counts out of the agent's reach: the seccomp filter every sandbox runs under.

Some kernel objects are counted per *user* on the host, whatever namespace makes them, and the agent's processes
are the driver's user there: inotify instances (``fs.inotify.max_user_instances``, 128 by default), fanotify groups
and the key quota (``kernel.keys.maxkeys``). An agent holding them all makes the trainer's ``inotify_init`` fail
(``EMFILE``) and a neighbour env's tools with it. A count a namespace could lower for the sandbox alone needs
privileges the driver does not have, so the sandbox refuses the calls that make these objects: ``inotify_init``,
``inotify_init1`` and ``fanotify_init`` fail with ``EMFILE`` (what a program meets when the count is used up, so
tools such as ``tail -f`` fall back to polling), ``add_key``, ``request_key`` and ``keyctl`` with ``EPERM`` (as under
Docker's default profile).

The same filter keeps every process at the scheduling it started with: ``nice``, ``setpriority`` and the
``sched_set*`` calls fail with ``EPERM`` (``nice cmd`` still runs ``cmd``). A process that lowered its own priority
(``nice 19``, ``SCHED_IDLE``) would wait for the CPU behind every other env's work, and an evaluation's clock
(``eval_clock``) counts such waiting as the machine's: the agent's code could buy itself an ``infra_error`` on a busy
machine. An env's CPU share is its cgroup's in any case.

User namespaces are refused by bwrap itself (``--disable-userns``), POSIX message queues by ``RLIMIT_MSGQUEUE`` 0,
and queued signals are bounded by ``RLIMIT_SIGPENDING`` (``limits.exec_prefix``).

The filter is a classic BPF program for each architecture bwrap runs on here (x86-64 with its x32 numbers, i386,
aarch64); bwrap loads it from a descriptor (``--seccomp``) after its own setup.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import hashlib
import os
import platform
import shutil
import stat
import struct
import tempfile
import threading

SECCOMP_FD = 9
"""The descriptor the sandbox's start-up shell opens the filter on for bwrap (``--seccomp 9``)."""


def above_sandbox_fds(fd: int) -> int:
    """``fd``, moved above the descriptor the sandbox's start-up shell opens its seccomp filter on
    (``SECCOMP_FD``) when it is not already: a descriptor handed to a sandboxed process under that number
    would be replaced by the filter (the evaluator then found no channel: an ``infra_error`` that depended on how many
    descriptors the process held, as when an audit's second env evaluated)."""
    import fcntl

    if fd > SECCOMP_FD:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, SECCOMP_FD + 1)
    os.close(fd)
    return moved


_EMFILE = ("inotify_init", "inotify_init1", "fanotify_init")
_EPERM = ("add_key", "request_key", "keyctl", "nice", "setpriority", "sched_setparam", "sched_setscheduler",
          "sched_setattr")
DENIED = {**{name: errno.EMFILE for name in _EMFILE}, **{name: errno.EPERM for name in _EPERM}}
"""The system calls the sandbox refuses, and the error each fails with."""

# audit architecture -> (system call numbers, mask applied to the number first)
_X32_BIT = 0x40000000
_ARCHES: dict[int, tuple[dict[str, int], int]] = {
    0xC000003E: ({"inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300, "add_key": 248,
                  "request_key": 249, "keyctl": 250, "setpriority": 141, "sched_setparam": 142,
                  "sched_setscheduler": 144, "sched_setattr": 314}, 0xFFFFFFFF & ~_X32_BIT),  # x86-64 and x32
    0x40000003: ({"inotify_init": 291, "inotify_init1": 332, "fanotify_init": 338, "add_key": 286,
                  "request_key": 287, "keyctl": 288, "nice": 34, "setpriority": 97, "sched_setparam": 154,
                  "sched_setscheduler": 156, "sched_setattr": 351}, 0xFFFFFFFF),  # i386
    0xC00000B7: ({"inotify_init1": 26, "fanotify_init": 262, "add_key": 217, "request_key": 218, "keyctl": 219,
                  "setpriority": 140, "sched_setparam": 118, "sched_setscheduler": 119, "sched_setattr": 274},
                 0xFFFFFFFF),  # aarch64 (no inotify_init, no nice)
}

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter: for each known architecture, the denied calls' numbers; anything else is allowed."""
    out = []
    for arch, (numbers, mask) in _ARCHES.items():
        body = [_op(_LD_ABS, 0), _op(_AND, mask)]
        for name, number in numbers.items():
            body += [_op(_JEQ, number, 0, 1), _op(_RET, _ERRNO | DENIED[name])]
        body.append(_op(_RET, _ALLOW))
        out += [_op(_LD_ABS, 4), _op(_JEQ, arch, 0, len(body)), *body]
    out.append(_op(_RET, _ALLOW))
    return b"".join(out)


def filter_path() -> str:
    """A file holding ``program()``, named by its digest, in a folder of this user's own that every process of theirs
    shares (``_folder``): nothing is left per process, however it ends (a pool's worker is terminated, a
    multiprocessing child leaves by ``os._exit``, where exit handlers never run). Written again if something removed
    it meanwhile, as a cleaner of old files in ``/tmp`` may."""
    path = os.path.join(_folder(), _filter_name())
    if not os.path.exists(path):
        folder = os.path.dirname(path)
        if not _own_private_folder(folder):
            _folder.cache_clear()  # someone else's now: this process falls back to a folder of its own
            folder = _folder()
        path = os.path.join(folder, _filter_name())
        partial = f"{path}.{os.getpid()}.{threading.get_ident()}"
        with open(partial, "wb") as file:
            file.write(program())
        os.replace(partial, path)  # whole or not at all, for a sandbox starting meanwhile on another thread
    return path


@functools.cache
def _filter_name() -> str:
    """The filter's file name: a changed filter (another release) never reads an older one's file."""
    return f"{platform.machine() or 'any'}-{hashlib.sha256(program()).hexdigest()[:16]}.bpf"


@functools.cache
def _folder() -> str:
    """``mlgr-seccomp-<uid>`` in the temporary folder when it is this user's alone (made here, mode 0700, or found
    so), else, as when another user made it first, a new folder of this process's own, removed at its exit."""
    shared = os.path.join(tempfile.gettempdir(), f"mlgr-seccomp-{os.getuid()}")
    if _own_private_folder(shared):
        return shared
    folder = tempfile.mkdtemp(prefix="mlgr-seccomp-")
    atexit.register(_remove, folder, os.getpid())
    return folder


def _own_private_folder(folder: str) -> bool:
    """Whether ``folder`` is a folder (no link) this user owns that no one else may enter, made so first when it
    does not exist."""
    with contextlib.suppress(OSError):
        os.mkdir(folder, 0o700)
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def _remove(folder: str, owner: int) -> None:
    """Remove ``folder`` at exit, in the process that made it only (a forked child inherits the exit handler and the
    cached path, and its parent may still start sandboxes with it)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)
