"""Copy-on-write workspaces for forked envs: frozen layers shared read-only, and an overlay view per env.

A fork freezes the parent's writable files as a *layer* (a folder renamed aside, never written again) and gives the
parent and each child an overlayfs view: the frozen layers below, a fresh writable folder of its own on top. Nothing
is copied, so a fork of a 200 MB workspace costs what a fork of an empty one does.

The overlay is mounted by a small *holder* process of the driver's (``unshare -Urm``: its own user and mount
namespaces, where an unprivileged user may mount overlayfs, Linux 5.11 and later). The driver reads the view through
``/proc/<holder>/root`` (``OverlayView.path``), and the agent's sandbox is started inside the holder's namespaces
(``OverlayView.enter``, ``nsenter``), where it binds the view as it would bind a plain folder. The holder reads its
stdin, a pipe from the driver: when the driver ends, or ``stop`` closes it, the holder ends and the mount with it.

A layer lives while any env uses it: each user holds a shared ``flock`` on the layer's lock file; the last to let go
(an exclusive lock succeeds) removes it, and ``sweep_layers`` removes those whose users all died. A process forked
from the driver holds a copy of every lock until it executes a program or ends, so that a letting go at that moment
would wrongly find the layer held: a forked child drops its copies at once (``os.register_at_fork``), and a letting go
that finds the layer held looks again a few times in the next seconds (``_Reaper``), for the children that run no
Python between their fork and their program (``vfork``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .evaluation import force_rmtree

LAYER_PREFIX = "mlgr-layer-"
"""The name every frozen layer's folder starts with (beside the envs' folders, never matched by their prefix)."""
LOCK_FILE = "users.lock"
TREE = "tree"
UNSAFE_IN_OPTIONS = frozenset(",:\\\n")
"""Characters overlayfs's mount options cannot carry in a path: such a folder gets the copying fallback."""


class OverlayUnavailable(RuntimeError):
    """This host cannot give a forked env a copy-on-write view (the caller copies the workspace instead)."""


@dataclass(eq=False)
class Layer:
    """A frozen layer, ``folder/tree``, held by this env through a shared lock on ``folder/users.lock``."""

    folder: Path
    fd: int | None = field(default=None, repr=False)

    @property
    def tree(self) -> Path:
        """The frozen files."""
        return self.folder / TREE

    @classmethod
    def freeze(cls, source: Path, parent: Path) -> Layer:
        """Make ``source`` (a folder nobody writes any more) a layer, by renaming it into a new folder of ``parent``
        (the same filesystem: no byte is copied); held by the caller."""
        folder = Path(tempfile.mkdtemp(prefix=LAYER_PREFIX, dir=parent))
        layer = cls(folder)
        layer._hold()
        os.rename(source, layer.tree)
        return layer

    def share(self) -> Layer:
        """Another hold on this layer (for a child that uses it too)."""
        other = Layer(self.folder)
        other._hold()
        return other

    @classmethod
    def take(cls, folder: Path) -> Layer:
        """A hold on the layer at ``folder`` (made by another process); ``FileNotFoundError`` when it is gone."""
        if not folder.is_dir():
            raise FileNotFoundError(folder)
        layer = cls(folder)
        layer._hold()
        if not layer.tree.is_dir():  # removed while this waited for its lock
            layer.release()
            raise FileNotFoundError(folder)
        return layer

    def _hold(self) -> None:
        self.fd = _lock(self.folder, fcntl.LOCK_SH)
        _HOLDING.add(self)

    def release(self) -> None:
        """Let go of this hold; remove the layer when no other env holds it. Idempotent."""
        if self.fd is None:
            return
        _HOLDING.discard(self)
        os.close(self.fd)
        self.fd = None
        if not _remove_if_unused(self.folder):
            _REAPER.look_again(self.folder)


_HOLDING: weakref.WeakSet[Layer] = weakref.WeakSet()
"""This process's holds on layers (each an open lock)."""


def _drop_copied_holds() -> None:
    """In a child just forked from this process: close the copies of the parent's locks (the parent still holds
    them), so that the parent's letting go is not taken for another user's hold while the child lives."""
    for layer in list(_HOLDING):
        with contextlib.suppress(OSError):
            os.close(layer.fd)  # type: ignore[arg-type]
        layer.fd = None
    _HOLDING.clear()
    global _REAPER
    _REAPER = _Reaper()  # the parent's, whose thread did not come along, looks after the parent's layers


class _Reaper:
    """Looks again, a few times in the next seconds, at layers that a letting go found held: the holder may have been
    a copy of a lock in a process forked a moment before, gone once that process executes its program."""

    DELAYS = (0.05, 0.2, 1.0, 3.0, 10.0)
    """Seconds after a letting go at which the layer is looked at again (after the last, ``sweep_layers`` remains)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Path]] = []
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def look_again(self, folder: Path) -> None:
        """Try to remove ``folder`` again at each of ``DELAYS`` until it is unused."""
        with self._changed:
            self._due.append((time.monotonic() + self.DELAYS[0], 0, folder))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mlgym-registry-layer-reaper", daemon=True)
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due:
                    self._changed.wait()
                self._due.sort(key=lambda entry: entry[0])
                when, attempt, folder = self._due[0]
                wait = when - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                self._due.pop(0)
            if not _remove_if_unused(folder) and attempt + 1 < len(self.DELAYS):
                with self._changed:
                    self._due.append((time.monotonic() + self.DELAYS[attempt + 1], attempt + 1, folder))


_REAPER = _Reaper()
os.register_at_fork(after_in_child=_drop_copied_holds)


def _lock(folder: Path, how: int) -> int:
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, how)
    except OSError:
        os.close(fd)
        raise
    return fd


def _remove_if_unused(folder: Path) -> bool:
    """Remove ``folder`` when no env holds it (an exclusive lock is free); True when it is gone."""
    try:
        fd = _lock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # held by another env
    try:
        return force_rmtree(folder)
    finally:
        os.close(fd)


SWEEP_PERIOD = 30.0
"""Seconds between two sweeps of one folder's abandoned layers by this process (a sweep lists the whole folder)."""
_swept: dict[str, float] = {}


def sweep_layers(parent: Path) -> None:
    """Remove the layers in ``parent`` that no living env holds (their users were killed before they let go); at
    most once every ``SWEEP_PERIOD`` seconds per folder."""
    now = time.monotonic()
    if now - _swept.get(str(parent), -SWEEP_PERIOD) < SWEEP_PERIOD:
        return
    _swept[str(parent)] = now
    with contextlib.suppress(OSError):
        for folder in parent.glob(f"{LAYER_PREFIX}*"):
            with contextlib.suppress(Exception):
                _remove_if_unused(folder)


HOLDER_SCRIPT = (
    # "-": mount later. The mount point is first made a shared mount of its own, so that a sandbox started now in
    # these namespaces (whose root bwrap makes a slave of them) sees the overlay mounted on it later
    'if [ "$1" = - ]; then mount --bind "$2" "$2" && mount --make-shared "$2" || exit 1; echo waiting; '
    'read -r options || exit 0; else options=$1; fi; '
    'mount -t overlay overlay -o "nosuid,nodev,$options" "$2" || exit 1; echo ready; '
    'while read -r _; do :; done'  # ends at EOF: the driver closed the pipe, or died
)


WAITING_HOLDER = (
    # a holder made ahead (``lowers=None``): Python, started and waiting before the fork, so that the fork's mount is
    # a system call of a running process rather than a ``mount`` program started then (milliseconds)
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "point = sys.argv[1].encode()\n"
    "def mount(source, target, kind, flags, data):\n"
    "    if libc.mount(source, target, kind, flags, data) != 0:\n"
    "        sys.stderr.write(os.strerror(ctypes.get_errno()) + '\\n')\n"
    "        sys.exit(1)\n"
    "mount(point, point, None, 4096, None)\n"  # MS_BIND
    "mount(None, point, None, 1 << 20, None)\n"  # MS_SHARED
    "print('waiting', flush=True)\n"
    "options = sys.stdin.readline().strip()\n"
    "if not options:\n"
    "    sys.exit(0)\n"
    "mount(b'overlay', point, b'overlay', 2 | 4, options.encode())\n"  # MS_NOSUID | MS_NODEV
    "print('ready', flush=True)\n"
    "while sys.stdin.readline():\n"
    "    pass\n"
)


class OverlayView:
    """An overlay of ``lowers`` (topmost first) under ``upper``, mounted at ``mountpoint`` in a holder's namespaces.

    ``lowers=None`` starts the holder now and mounts later (``mount``): a child made ahead of a fork
    (``spares.py``) has its namespaces, and a sandbox in them, before the layers it will stand on exist; its holder
    is this interpreter (``WAITING_HOLDER``), which mounts with a system call when told."""

    def __init__(self, lowers: Sequence[Path] | None, upper: Path, work: Path, mountpoint: Path):
        self.lowers, self.upper, self.work, self.mountpoint = list(lowers or []), upper, work, mountpoint
        self._check_paths((upper, work, mountpoint))
        unshare = shutil.which("unshare")
        if unshare is None or shutil.which("nsenter") is None:
            raise OverlayUnavailable("util-linux's unshare and nsenter are needed for a copy-on-write fork")
        program = (["/bin/sh", "-c", HOLDER_SCRIPT, "holder", self._options(), str(mountpoint)] if lowers is not None
                   else [sys.executable, "-I", "-S", "-c", WAITING_HOLDER, str(mountpoint)])
        self.holder = subprocess.Popen(
            [unshare, "--user", "--map-root-user", "--mount", "--propagation", "private", "--", *program],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            close_fds=True,
        )
        self.ready = False
        self.waiting = lowers is None
        """True while the holder waits for ``mount``'s layers."""

    def _options(self) -> str:
        self._check_paths(self.lowers)
        return (f"lowerdir={':'.join(str(p) for p in self.lowers)},upperdir={self.upper},workdir={self.work},"
                "userxattr")

    @staticmethod
    def _check_paths(paths: Sequence[Path]) -> None:
        for path in paths:
            if UNSAFE_IN_OPTIONS & set(str(path)):
                raise OverlayUnavailable(f"the path {str(path)!r} holds a character overlayfs options cannot carry")

    def wait_waiting(self) -> None:
        """Wait until a holder started with ``lowers=None`` is in its namespaces, its mount point shared, so that a
        sandbox may start in them; ``OverlayUnavailable`` when it could not."""
        line = self.holder.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != b"waiting":
            self._fail()

    def mount(self, lowers: Sequence[Path]) -> None:
        """Mount the overlay of ``lowers`` (topmost first) that the holder waits for (``wait_ready`` waits until it
        is mounted)."""
        if not self.waiting:
            raise RuntimeError("this OverlayView was mounted already")
        self.lowers, self.waiting = list(lowers), False
        try:
            self.holder.stdin.write(self._options().encode() + b"\n")  # type: ignore[union-attr]
            self.holder.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            self._fail()

    def _fail(self) -> None:
        why = self.holder.stderr.read().decode(errors="replace").strip()  # type: ignore[union-attr]
        self.stop()
        raise OverlayUnavailable(f"overlayfs could not be mounted in a user namespace here: {why or 'no reason'}")

    def wait_ready(self) -> None:
        """Wait until the holder has mounted the view (started in ``__init__``, so that several mount at once);
        ``OverlayUnavailable`` when it could not."""
        if self.ready:
            return
        line = self.holder.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != b"ready":
            self._fail()
        self.ready = True

    @property
    def path(self) -> Path:
        """The merged view, as the driver reads and writes it."""
        return Path(f"/proc/{self.holder.pid}/root{self.mountpoint}")

    def enter(self) -> list[str]:
        """The prefix that runs a command (the sandbox's ``bwrap``) in the holder's namespaces, where the view is."""
        return ["nsenter", "-t", str(self.holder.pid), "--user", "--mount", "--preserve-credentials", "--"]

    @property
    def alive(self) -> bool:
        """Whether the holder (and so the view) is still there."""
        return self.holder.poll() is None

    def stop(self) -> None:
        """End the holder: the view is unmounted once no process is left in its namespaces. Idempotent."""
        for stream in (self.holder.stdin, self.holder.stdout, self.holder.stderr):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        try:
            self.holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()


@functools.cache
def overlay_supported(parent: str) -> str | None:
    """None when a copy-on-write view works in ``parent`` on this host, else why not (checked once per folder)."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix="mlgr-probe-", dir=parent))
    except OSError as exc:
        return f"no folder could be made in {parent}: {exc}"
    try:
        for name in ("lower", "upper", "work", "merged"):
            (scratch / name).mkdir()
        (scratch / "lower" / "probe").write_text("x")
        view = OverlayView([scratch / "lower"], scratch / "upper", scratch / "work", scratch / "merged")
        try:
            view.wait_ready()
            (view.path / "probe").write_text("y")
            ok = (scratch / "lower" / "probe").read_text() == "x" and (scratch / "upper" / "probe").exists()
        finally:
            view.stop()
        return None if ok else "the overlay did not keep its lower layer unchanged"
    except (OSError, OverlayUnavailable) as exc:
        return str(exc)
    finally:
        force_rmtree(scratch)
