"""Children made ahead of a fork, as a reset takes a shell started ahead: what makes a fork cost what a reset does.

A spare is a ``LocalBackend`` built for the parent's task and options (its folders and cgroups made), whose overlay
holder already waits in its own user and mount namespaces (``layers.OverlayView`` with ``lowers=None``) and whose
agent's sandbox already runs in them (bwrap, then bash, started and idle). Nothing of any episode is in it: a fork
that takes it gives it the parent's state (``forking._adopt``), mounts the layers, which the waiting sandbox then
sees on its workspace (mount propagation from the holder's namespaces, never the other way), and sets its shell up.

Each spare becomes exactly one child, and is never shared: it has its own folder, cgroups, holder, sandbox and
shell, as any env does, and no agent's sandbox can see another's processes. A parent keeps as many spares as its
last fork made children (``MAX_SPARES`` at most), built by one thread of this process's while the agent steps; the
parent's ``close`` (and its finalizer) closes them, waiting for one being built.

Spares are only made where a sandbox started before the layers exist cannot see them: when the folder the layers
are made in (the envs' ``workspace_dir``) is inside none of the folders the sandbox shows (a later sandbox hides
the layers' folders themselves).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import layers
from . import sandbox as sandbox_mod

if TYPE_CHECKING:
    from ...specs import TaskSpec

LocalBackend = Any
"""``backend.LocalBackend``, which this module works on: named, not imported, since backend.py imports this
module (a circle otherwise)."""

MAX_SPARES = 8
"""The most children a parent keeps made ahead (its last fork's ``n``, up to this)."""


class Spares:
    """The children made ahead for one parent (its class, its task ``spec`` and ``options``)."""

    def __init__(self, backend_class: type[LocalBackend], spec: TaskSpec, options: dict[str, Any]):
        self.backend_class, self.spec, self.options = backend_class, spec, dict(options)
        self._ready: list[LocalBackend] = []
        self._building = 0
        self._closed = False
        self._changed = threading.Condition()

    def keep(self, n: int) -> None:
        """Have ``n`` spares (at most ``MAX_SPARES``) made or being made; the missing ones are built in the
        background."""
        with self._changed:
            if self._closed:
                return
            missing = min(n, MAX_SPARES) - len(self._ready) - self._building
            self._building += max(missing, 0)
        for _ in range(missing):
            _builder().submit(self._build_one)

    def take(self, n: int) -> list[LocalBackend]:
        """Up to ``n`` spares that are ready (their holder and shell alive), no longer this pool's."""
        taken: list[LocalBackend] = []
        with self._changed:
            while self._ready and len(taken) < n:
                spare = self._ready.pop(0)
                if _intact(spare):
                    taken.append(spare)
                else:
                    spare.close()
        return taken

    def wait(self, timeout: float | None = None) -> int:
        """Wait until no spare is being built (for at most ``timeout`` seconds); how many are ready."""
        with self._changed:
            self._changed.wait_for(lambda: self._building == 0, timeout)
            return len(self._ready)

    def close(self, timeout: float = 60.0) -> None:
        """Close every spare, after those being built are (for at most ``timeout`` seconds). Idempotent."""
        with self._changed:
            self._closed = True
            ready, self._ready = self._ready, []
        for spare in ready:
            spare.close()
        with self._changed:
            self._changed.wait_for(lambda: self._building == 0, timeout)

    def _build_one(self) -> None:
        spare = None
        try:
            spare = build(self.backend_class, self.spec, self.options)
        except Exception:  # noqa: BLE001 - a fork without a spare makes its child itself
            spare = None
        with self._changed:
            self._building -= 1
            keep = spare is not None and not self._closed
            if keep:
                self._ready.append(spare)  # type: ignore[arg-type]
            self._changed.notify_all()
        if spare is not None and not keep:
            spare.close()


def build(backend_class: type[LocalBackend], spec: TaskSpec, options: dict[str, Any]) -> LocalBackend | None:
    """A spare (module docstring) of the parent's ``backend_class``: None where one cannot be made ahead (no sandbox,
    or the layers' folder is inside one the sandbox shows)."""
    child = backend_class(spec, **options)
    try:
        res, confinement = child._res, child._confinement
        mountpoint = res.root / "workspace"
        shown = [bind.source for bind in confinement.sandbox_spec(mountpoint, writable=True).binds]
        if not child.sandboxed or sandbox_mod.under(str(res.root.parent), shown):
            child.close()
            return None
        for name in ("upper", "work"):
            (res.root / name).mkdir()
        res.view = layers.OverlayView(None, res.root / "upper", res.root / "work", mountpoint)
        res.view.wait_waiting()
        confinement.enter = res.view.enter()
        confinement.shown_workspace = mountpoint
        res.session = child._new_session(res.cgroup, res.memory)  # started; nothing runs in it until its set-up
    except BaseException:
        child.close()
        raise
    return child


def _intact(spare: LocalBackend) -> bool:
    view, session = spare._res.view, spare._res.session
    return view is not None and view.alive and view.waiting and session is not None and session.alive


class _Builder:
    """One thread of this process that builds spares in turn. It lives as long as the process, so that the
    sandboxes it starts may die with their parent (``--die-with-parent`` fires when the thread that started a
    process ends: ``sandbox.command``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="mlgr-fork-spares", daemon=True)
        self.thread.lives_with_process = True  # type: ignore[attr-defined]
        self.thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            with contextlib.suppress(Exception):
                job()


_the_builder: _Builder | None = None
_builder_lock = threading.Lock()


def _builder() -> _Builder:
    global _the_builder
    with _builder_lock:
        if _the_builder is None or _the_builder.pid != os.getpid():  # none yet, or this is a forked process
            _the_builder = _Builder()
        return _the_builder
