"""Stops an env's processes once its files take more than its disk quota, while they run.

The quota (``quota.py``) is checked when an evaluation copies the workspace, but a command, or a process the agent
left running in the background, can write between evaluations: at disk speed, for as long as the command's timeout.
One thread per driver process looks at every env of the process twice a second (``DiskQuota.check``: a ``statvfs``
call, and a walk of the workspace only when it may have gone over), and the driver looks at its env after each
command (``enforce``). Either stops the processes of an env that is over its quota: every process of its session,
the shell included (a loop of the command runs in the shell itself), so the command ends and the next one gets a new
shell. The observation says why (``NOTE_OVER_QUOTA``). The files stay: the agent deletes what it does not need, and
evaluations fail until then.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

from .quota import DiskQuota

POLL_SECONDS = 0.5

NOTE_OVER_QUOTA = (
    "NOTE: this environment's files took more than its disk quota of {mb} MB, so its running processes and its "
    "shell were stopped. Delete what the workspace does not need (checkpoints, caches, copies of data): every "
    "evaluation fails while the files and the copy an evaluation makes of them take more than the quota."
)

_lock = threading.RLock()  # re-entrant: a weak reference's callback may run while it is held
_watched: dict[int, tuple[int, weakref.ref[DiskQuota], Callable[[], None]]] = {}
"""id of each quota -> (the pid that watches it, a weak reference to it, how to stop its env's processes)."""
_thread: tuple[int, threading.Thread] | None = None  # (the pid that started it, the thread)


def watch(quota: DiskQuota, stop: Callable[[], None]) -> None:
    """Look after ``quota`` until it is garbage or ``unwatch``-ed: ``stop()`` (which must not hold ``quota``) stops
    the env's processes when it is over."""
    global _thread
    key = id(quota)
    with _lock:
        _watched[key] = (os.getpid(), weakref.ref(quota, lambda _ref, key=key: unwatch_key(key)), stop)
        if _thread is None or _thread[0] != os.getpid() or not _thread[1].is_alive():
            thread = threading.Thread(target=_run, name="mlgym-registry-disk-guard", daemon=True)
            _thread = (os.getpid(), thread)
            thread.start()


def enforce(quota: DiskQuota, stop: Callable[[], None], *, periodic: bool = True) -> bool:
    """Stop the env's processes (``stop()``) if ``quota.check(periodic)`` finds it over its quota; whether it did.
    The guard's thread calls it twice a second, the driver after each command (``periodic=False``: a ``statvfs``
    call unless the disk's free space fell), so that a command that took the env over is followed by the stop before
    the next command starts, which a late guard would otherwise kill, losing the agent's action. One at a time per
    env (``quota.enforcing``): when the driver's call returns, a stop the guard had begun is over too."""
    with quota.enforcing:
        if not quota.check(periodic=periodic):
            return False
        quota.exceeded_seen = True  # before the stop: the driver's observation of it says why
        stop()
        quota.stopped()
        return True


def unwatch(quota: DiskQuota) -> None:
    """Stop looking after ``quota`` (its env closed)."""
    unwatch_key(id(quota))


def unwatch_key(key: int) -> None:
    """``unwatch`` by the quota's id (for the weak reference's callback)."""
    with _lock:
        _watched.pop(key, None)


def _forget_after_fork() -> None:
    """In a forked child: the parent's envs are not its own, and the lock may have been held by a thread that the
    child does not have."""
    global _lock, _thread
    _lock = threading.RLock()
    _watched.clear()
    _thread = None


os.register_at_fork(after_in_child=_forget_after_fork)


def _run() -> None:
    event = threading.Event()
    while not event.wait(POLL_SECONDS):
        with _lock:
            entries = list(_watched.values())
        for owner, ref, stop in entries:
            quota = ref()
            if quota is None or owner != os.getpid():
                continue  # gone, or (should a fork have kept it) an env of the parent's: never this one's to stop
            try:
                enforce(quota, stop)
            except Exception:  # noqa: BLE001 - one env's trouble must not end the guard of every other
                continue
            finally:
                del quota
