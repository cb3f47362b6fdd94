"""Worker processes that start warm: forked from a server that has already imported torch, TorchRL and this package.

TorchRL starts its worker processes with ``spawn``: each is a fresh interpreter that imports torch, TorchRL,
transformers and the env's chain (several seconds of CPU each), and tears all of that down again when it exits (one
to three seconds more). On a machine with few cores, building and shutting down N envs then costs N times one.

With ``warm_workers()`` the workers start from multiprocessing's ``forkserver`` instead, whose server imported those
modules once (``PRELOAD_MODULE``): each worker is a fork of it, ready in a fraction of a second, sharing the server's
memory until it writes to it, and it ends with ``os._exit`` once its envs are closed, without the teardown. A worker
still builds its own env from the task's spec (``parallel.EnvFactory``): the server imports modules and registers
nothing, so what a worker registers (its plugins, through the same entry points) is what a spawned worker would.

Nothing here imports torch, so ``start_worker_server()`` can start the server's imports before this process does
its own, and the two run side by side.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

START_METHOD_VARIABLE = "MLGYM_REGISTRY_WORKER_START"
"""The environment variable that chooses how ``warm_workers()`` starts workers: ``forkserver`` (the default) or
``spawn`` (TorchRL's own default, every worker a fresh interpreter)."""

START_METHODS = ("forkserver", "spawn")
"""The start methods ``warm_workers()`` accepts."""

PRELOAD_MODULE = "mlgym_registry._worker_preload"
"""The module the fork server imports before it forks its first worker (it imports the rest)."""


def worker_start_method() -> str:
    """How workers start: ``MLGYM_REGISTRY_WORKER_START`` when set, else ``forkserver`` where the platform has one."""
    from .validation import InvalidOptionError

    method = os.environ.get(START_METHOD_VARIABLE, "").strip() or "forkserver"
    if method not in START_METHODS:
        raise InvalidOptionError(f"{START_METHOD_VARIABLE}={method!r} is not one of {', '.join(START_METHODS)}")
    if method not in multiprocessing.get_all_start_methods():
        return "spawn"
    return method


def start_worker_server() -> bool:
    """Start the fork server in the background, with ``PRELOAD_MODULE`` to import, unless it already runs.

    Returns at once: the server imports while this process goes on, and the first worker waits for it. Returns
    False (and starts nothing) when workers are to be spawned. A server started earlier (by this function or by
    other code) is reused as it is: multiprocessing keeps one per process.
    """
    if worker_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver

    _short_socket_folder()
    forkserver.set_forkserver_preload([PRELOAD_MODULE])
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


@contextmanager
def warm_workers() -> Iterator[str]:
    """Make multiprocessing's default start method the warm one (``forkserver``) within the block, and yield it.

    TorchRL's multi-process ``Collector`` and ``AsyncEnvPool(backend="multiprocessing")`` start their workers with
    the default start method (``spawn``, which TorchRL sets when it is imported): build them inside the block. The
    processes keep the start method they were built with after the block. The default is process-wide, so other
    threads starting processes during the block get it too. Give the workers' env factories through
    ``WithParentEnviron``: a worker forked from the server has the environment the server started with.
    """
    method = worker_start_method()
    previous = multiprocessing.get_start_method(allow_none=True)
    if method == "forkserver":
        start_worker_server()
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
