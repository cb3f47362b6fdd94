"""Worker processes that start warm: forked from a server that has already imported torch, TorchRL and this package.

TorchRL starts its worker processes with ``spawn``: each is a fresh interpreter that imports torch, TorchRL,
transformers and the env's chain (several seconds of CPU each), and tears all of that down again when it exits (one
to three seconds more). On a machine with few cores, building and shutting down N envs then costs N times one.

With ``warm_workers()`` the workers start from multiprocessing's ``forkserver`` instead, whose server imported those
modules once (``PRELOAD_MODULE``): each worker is a fork of it, ready in a fraction of a second, sharing the server's
memory until it writes to it, and it ends with ``os._exit`` once its envs are closed, without the teardown. A worker
still builds its own env from the task's spec (``interop.torchrl.env_factory.EnvFactory``): the server imports modules
and registers nothing, so what a worker registers (its plugins, through the same entry points) is what a spawned worker
would.

Nothing here imports torch, so ``start_worker_server()`` can start the server's imports before this process does
its own, and the two run side by side.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

START_METHOD_VARIABLE = "MLGYM_REGISTRY_WORKER_START"
"""The environment variable that chooses how ``warm_workers()`` starts workers: ``forkserver`` (the default) or
``spawn`` (TorchRL's own default, every worker a fresh interpreter)."""

START_METHODS = ("forkserver", "spawn")
"""The start methods ``warm_workers()`` accepts."""

PRELOAD_MODULE = "mlgym_registry.scale._worker_preload"
"""The module the fork server imports before it forks its first worker (it imports the rest)."""


def worker_start_method() -> str:
    """How workers start: ``MLGYM_REGISTRY_WORKER_START`` when set, else ``forkserver`` where the platform has one."""
    from ..options import InvalidOptionError

    method = os.environ.get(START_METHOD_VARIABLE, "").strip() or "forkserver"
    if method not in START_METHODS:
        raise InvalidOptionError(f"{START_METHOD_VARIABLE}={method!r} is not one of {', '.join(START_METHODS)}")
    if method not in multiprocessing.get_all_start_methods():
        return "spawn"
    return method


def start_worker_server(also_import: Sequence[str] = ()) -> bool:
    """Start the fork server in the background, with ``PRELOAD_MODULE`` to import, unless it already runs.

    ``also_import``: more modules the server imports first (the modules of the policy every worker will build, say),
    so that the workers share them instead of each importing its own copy (the OpenAI client's modules cost 27 MiB a
    worker); one that raises ``ImportError`` is skipped (the worker then imports it itself, and reports the error).

    Returns at once: the server imports while this process goes on, and the first worker waits for it. Returns
    False (and starts nothing) when workers are to be spawned. A server started earlier (by this function or by
    other code) is reused as it is: multiprocessing keeps one per process.
    """
    if worker_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver

    _short_socket_folder()
    # the extra modules first: PRELOAD_MODULE freezes the server's heap once its own imports are done
    forkserver.set_forkserver_preload([*also_import, PRELOAD_MODULE])
    forkserver.ensure_running()
    return True


SOCKET_PATH_ROOM = 70
"""The longest temporary folder path under which multiprocessing's sockets still fit (a socket path has at most 107
bytes; multiprocessing adds about 35)."""


def _short_socket_folder() -> None:
    """Make multiprocessing put its sockets (the fork server's) under ``/tmp`` when ``TMPDIR`` is too long for them.

    Python before 3.13 makes them under ``TMPDIR`` whatever its length, and the fork server then fails to start with
    "AF_UNIX path too long". It does what ``multiprocessing.util.get_temp_dir`` would, in a short folder, before that
    function runs; it changes nothing when a folder was made already or ``TMPDIR`` is short.
    """
    import shutil
    import tempfile
    from multiprocessing import process, util

    config = process.current_process()._config
    if config.get("tempdir") is not None or len(tempfile.gettempdir()) <= SOCKET_PATH_ROOM:
        return
    if not os.path.isdir("/tmp") or not os.access("/tmp", os.W_OK):
        return
    folder = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
    config["tempdir"] = folder


def warm_context() -> Any:
    """The multiprocessing context whose processes start warm (``worker_start_method()``), its fork server started
    (in the background) where it has one: for a pool this package builds itself (``ProcessPoolExecutor(...,
    mp_context=warm_context())``), where ``warm_workers()`` is for TorchRL's classes, which read the default."""
    start_worker_server()
    return multiprocessing.get_context(worker_start_method())


@contextmanager
def warm_workers() -> Iterator[str]:
    """Make multiprocessing's default start method the warm one (``forkserver``) within the block, and yield it.

    TorchRL's multi-process ``Collector`` and ``AsyncEnvPool(backend="multiprocessing")`` start their workers with
    the default start method (``spawn``, which TorchRL sets when it is imported): build them inside the block. The
    processes keep the start method they were built with after the block. ``ParallelEnv`` reads it later, when its
    first reset starts its workers: give it ``mp_start_method=`` the method this yields. The default is
    process-wide, so other threads starting processes during the block get it too. Give the workers' env factories
    through ``WithParentEnviron``: a worker forked from the server has the environment the server started with.
    """
    method = warm_context().get_start_method()
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(method, force=True)
    try:
        yield method
    finally:
        multiprocessing.set_start_method(previous, force=True)


class WithParentEnviron:
    """An env factory that, called in a worker, first makes the worker's environment variables those of the process
    that built it, then calls ``factory``.

    A worker forked from the fork server has the environment the server started with; this gives it the one a
    spawned worker would have had (``OPENAI_API_KEY`` set after the server started, say). Called in the process
    that built it, it only calls ``factory``. Modules the server imported keep what they read from the environment
    at import time.
    """

    def __init__(self, factory: Callable[[], Any]):
        self.factory = factory
        self.environ = dict(os.environ)

    def __call__(self) -> Any:
        if multiprocessing.parent_process() is not None and dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        return self.factory()

    def __repr__(self) -> str:
        return f"WithParentEnviron({self.factory!r})"


Report = Callable[..., None]
"""``report(*event)``: what a job running in a ``WorkerPool`` worker sends the pool's owner while it runs."""

STOP_GRACE = 15.0
"""Seconds ``WorkerPool.close`` gives interrupted workers to record what they were doing before they are killed."""


class WorkerPool:
    """``size`` worker processes started once, warm (as ``warm_workers`` starts them), each running
    ``target(job, report)`` for one job after another until the pool is closed.

    The owner gives a job to an idle worker (``give``) and reads what the workers send (``receive``): ``(slot,
    "event", event)`` for each ``report(*event)`` a job makes, then ``(slot, "done", returned)`` or ``(slot, "error",
    text)`` when it ends. A worker that dies is found by ``dead()`` and replaced by ``restart``. ``target`` must be
    picklable (a module-level function): workers are forked from the fork server or spawned.

    Each worker sends on a pipe of its own, and ``report`` returns once the message is in the pipe: nothing a worker
    sent is ever dropped (a worker that sends faster than the owner reads waits), and a worker killed in the middle
    of a message breaks its own pipe only, never the others' (a queue shared by all would stay locked).
    """

    def __init__(self, size: int, target: Callable[[Any, Report], Any]):
        self.context = warm_context()
        self.target = target
        self.inboxes: list[Any] = []
        self.outboxes: list[Any] = []
        self.processes: list[Any] = []
        self._next = 0
        for slot in range(size):
            self.inboxes.append(None)
            self.outboxes.append(None)
            self.processes.append(None)
            self.restart(slot)

    @property
    def pids(self) -> list[int | None]:
        """Each slot's worker process id."""
        return [process.pid for process in self.processes]

    def restart(self, slot: int) -> None:
        """Start the worker of ``slot`` (again: a new process with a new inbox and a new pipe)."""
        if self.outboxes[slot] is not None:
            self.outboxes[slot].close()
        inbox = self.context.Queue()
        outbox, sender = self.context.Pipe(duplex=False)
        serve = WithParentEnviron(functools.partial(_serve, slot, inbox, sender, self.target))
        process = self.context.Process(target=serve, name=f"mlgym-registry-worker-{slot}", daemon=True)
        process.start()
        sender.close()  # the worker holds the only writing end: its pipe ends when it does
        self.inboxes[slot], self.outboxes[slot], self.processes[slot] = inbox, outbox, process

    def give(self, slot: int, job: Any) -> None:
        """Hand ``job`` to the (idle) worker of ``slot``."""
        self.inboxes[slot].put(job)

    def receive(self, timeout: float) -> tuple[int, str, Any] | None:
        """The next message of any worker, or None when none came within ``timeout`` seconds. Workers with
        messages waiting are read in turn, so that none waits behind the others."""
        from multiprocessing.connection import wait

        deadline = time.monotonic() + timeout
        while True:
            open_ = [outbox for outbox in self.outboxes if outbox is not None]
            if not open_:
                time.sleep(max(0.0, min(timeout, deadline - time.monotonic())))
                return None
            ready = wait(open_, max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            slots = sorted(self.outboxes.index(outbox) for outbox in ready)
            slot = next((slot for slot in slots if slot >= self._next), slots[0])
            self._next = slot + 1
            try:
                return self.outboxes[slot].recv()
            except Exception:  # noqa: BLE001 - the worker ended (or died mid-message): nothing more comes
                self.outboxes[slot].close()
                self.outboxes[slot] = None

    def drain(self, slot: int, timeout: float = 1.0) -> list[tuple[int, str, Any]]:
        """What the worker of ``slot``, which has ended, sent and was not read yet (waiting at most ``timeout``
        seconds for each message: a process the worker started may hold its pipe open)."""
        outbox, messages = self.outboxes[slot], []
        while outbox is not None and outbox.poll(timeout):
            try:
                messages.append(outbox.recv())
            except Exception:  # noqa: BLE001 - the end of the pipe, or a message cut short by the worker's death
                break
        if outbox is not None:
            outbox.close()
            self.outboxes[slot] = None
        return messages

    def dead(self) -> list[tuple[int, int | None]]:
        """``(slot, exit code)`` of each worker that has ended."""
        return [(slot, process.exitcode) for slot, process in enumerate(self.processes) if not process.is_alive()]

    def close(self, interrupt: bool = False, grace: float = STOP_GRACE) -> None:
        """End the workers: each finishes its job first, or, with ``interrupt``, is interrupted (SIGINT, as Ctrl-C
        does: its job records that it was cut short) and given ``grace`` seconds before it is killed."""
        for inbox, process in zip(self.inboxes, self.processes, strict=True):
            if process.is_alive():
                if interrupt:
                    with contextlib.suppress(OSError):
                        os.kill(process.pid, signal.SIGINT)
                else:
                    inbox.put(None)
        deadline = time.monotonic() + grace
        try:
            while any(process.is_alive() for process in self.processes) and time.monotonic() < deadline:
                self.receive(0.1)  # a worker waiting for its message to be read would not exit
        except KeyboardInterrupt:  # a second Ctrl-C (or SIGTERM) while waiting: do not wait any longer
            pass
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()
        for inbox in self.inboxes:
            inbox.cancel_join_thread()
            inbox.close()
        for slot, outbox in enumerate(self.outboxes):
            if outbox is not None:
                outbox.close()
                self.outboxes[slot] = None


def _serve(slot: int, inbox: Any, outbox: Any, target: Callable[[Any, Report], Any]) -> None:
    """A pool worker: run each job of ``inbox`` until it holds None, sending what it reports on ``outbox``; end
    quietly on SIGINT or SIGTERM."""
    _interrupt_once()
    try:
        while (job := inbox.get()) is not None:
            def report(*event: Any) -> None:
                outbox.send((slot, "event", event))

            try:
                outcome = (slot, "done", target(job, report))
            except Exception as exc:  # the owner decides what a failed job means; the worker takes the next one
                outcome = (slot, "error", f"{type(exc).__name__}: {exc}")
            outbox.send(outcome)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


def _interrupt_once() -> None:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` once; later ones are ignored, so that the job's clean-up (its
    files record that it was cut short) is not itself cut short when both a terminal and the pool's owner signal."""

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    default_hook = sys.unraisablehook

    def interrupted_in_a_finalizer(unraisable: Any) -> None:
        # a signal landing while a finalizer (an env's ``__del__``) runs raises there, where Python can only print
        # it and go on: arm the handler again and deliver the signal anew, once the finalizer is over, to the job
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            while True:
                try:
                    signal.signal(signal.SIGINT, stop)
                    signal.signal(signal.SIGTERM, stop)
                    threading.Timer(0.01, signal.raise_signal, (signal.SIGINT,)).start()
                    return
                except KeyboardInterrupt:
                    # on a busy machine the timer can fire before its start() returns, still inside this hook,
                    # where the interrupt would be lost again: arm the handlers and the timer anew
                    continue
        default_hook(unraisable)

    sys.unraisablehook = interrupted_in_a_finalizer
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
