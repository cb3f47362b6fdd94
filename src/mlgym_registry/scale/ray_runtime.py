"""Connecting to Ray: an existing cluster at an address, or a local runtime this process starts, owns and stops.

Ray is an optional extra (``pip install 'mlgym-registry[ray]'``); ``import_ray`` names it when Ray is missing.

A local runtime started by ``ray_session()`` is made safe for a shared machine:

- every Ray process binds to loopback only (Ray's own switch for that is ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
  which makes the node's address 127.0.0.1; without it Ray listens on every interface);
- its temporary files (sockets, logs, session folders) go under one folder the session creates and removes;
- its workers run at normal priority (``WORKER_PRIORITY_ENVIRONMENT``), not at Ray's niceness 15;
- usage reports are off, and Ray's token authentication uses a random token held in the environment of the
  session's processes, never written to ``~/.ray``;
- ``ray.shutdown()`` at the end stops every process it started.

An address that does not answer fails within ``CONNECT_TIMEOUT`` seconds with ``RayConnectionError``, naming the
address and how to start a head node, instead of Ray's own much longer wait.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import MLGymRegistryError

RAY_EXTRA = "pip install 'mlgym-registry[ray]'"
"""How to install Ray for this package."""

STARTUP_ATTEMPTS = 3
"""How often a local runtime is started before its failure to start is final."""
STARTUP_TIMEOUT_TEXT = "timed out during startup"
"""What Ray says when a node's raylet did not register within its fixed wait (30 s)."""
CONNECT_TIMEOUT = 10.0
"""Seconds to wait for a cluster address to accept a connection before giving up."""

HEAD_NODE_HINT = "start a head node there with `ray start --head --port 6379` (or pass --ray alone for a local runtime)"


class RayUnavailable(MLGymRegistryError, ImportError):
    """Ray is not installed."""


class RayConnectionError(MLGymRegistryError, ConnectionError):
    """A Ray address that cannot be reached, or a cluster that cannot run what was asked."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or ``RayUnavailable`` naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable(f"Ray is not installed ({exc}); install it with: {RAY_EXTRA}") from None
    return ray


def check_ray(address: str | None) -> None:
    """What a command checks before it makes any folder or imports what the envs need (seconds, under load tens of
    seconds): Ray is installed (``RayUnavailable`` otherwise) and, for an ``address``, something answers there
    (``RayConnectionError`` otherwise)."""
    import_ray()
    if address:
        check_reachable(address)


LOOPBACK_ENVIRONMENT = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Makes Ray use 127.0.0.1 as this node's address (and bind there) instead of the machine's outward address."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


WORKER_PRIORITY_ENVIRONMENT = {"RAY_worker_niceness": "0"}
"""Ray starts its workers at niceness 15, below everything else on the machine. The actors of a local runtime play
the episodes (their shells and evaluations inherit the niceness), and on a busy machine they starve: a 2-episode
blotto run on 2 cores beside 3 busy processes took 207 s at niceness 15 and 24 s at 0 (9 s on an idle machine)."""


def local_runtime_environment(token: str) -> dict[str, str]:
    """The environment variables that make a local runtime loopback-only, token-protected and silent, with its
    workers at normal priority."""
    return {**LOOPBACK_ENVIRONMENT, **WORKER_PRIORITY_ENVIRONMENT, "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


@dataclass
class RaySession:
    """A connection to Ray, as ``ray_session`` yields it."""

    address: str | None
    """The address connected to; ``None`` for a runtime this session started."""
    owns_runtime: bool
    """Whether this session started the runtime (and stops it on exit)."""
    temp_dir: Path | None = None
    """The folder holding a started runtime's files (removed on exit)."""

    def largest_node_cpus(self) -> float:
        """CPUs of the biggest alive node: no single actor can ask for more."""
        ray = import_ray()
        return max((float(node["Resources"].get("CPU", 0.0)) for node in ray.nodes() if node.get("Alive")),
                   default=0.0)


@contextlib.contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[RaySession]:
    """Use Ray for the duration of the ``with`` block.

    - Ray already initialised in this process: used as it is, and left running.
    - ``address`` given (``host:port``, ``ray://host:port`` or ``auto``): connect to that cluster, and disconnect
      at the end (the cluster keeps running). An address that does not answer raises ``RayConnectionError``.
    - no ``address``: start a local runtime (see the module's notes), stopped and removed at the end.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield RaySession(address=address, owns_runtime=False)
        return
    if address:
        host = check_reachable(address)
        # a cluster on loopback (a head node started on this machine for tests or a single-machine run): this
        # driver must use loopback too, or Ray swaps 127.0.0.1 for the machine's outward address and never connects
        loopback = host in LOOPBACK_HOSTS or host.startswith("127.")
        with _environment(LOOPBACK_ENVIRONMENT if loopback else {}):
            try:
                ray.init(address=address, configure_logging=False, log_to_driver=False)
            except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError or its own errors
                raise RayConnectionError(f"cannot connect to the Ray cluster at {address!r}: {exc}; "
                                         f"{HEAD_NODE_HINT}") from None
            try:
                yield RaySession(address=address, owns_runtime=False)
            finally:
                ray.shutdown()
        return
    temp_dir = Path(tempfile.mkdtemp(prefix="mlgym-ray-", dir=_short_temp_root()))
    with _environment(local_runtime_environment(secrets.token_hex(32))):
        try:
            _start_local_runtime(ray, num_cpus=num_cpus, include_dashboard=False, _temp_dir=str(temp_dir),
                                 configure_logging=False, log_to_driver=False)
            yield RaySession(address=None, owns_runtime=True, temp_dir=temp_dir)
        finally:
            ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


def _start_local_runtime(ray: ModuleType, **init: Any) -> None:
    """``ray.init(**init)``, started again (``STARTUP_ATTEMPTS`` in all) when its raylet did not register in time:
    Ray waits a fixed 30 s for it (not a setting in Ray 2.x), which a loaded machine can exceed."""
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        try:
            ray.init(**init)
            return
        except Exception as exc:
            if STARTUP_TIMEOUT_TEXT not in str(exc) or attempt == STARTUP_ATTEMPTS:
                raise
            ray.shutdown()


def _short_temp_root() -> str:
    """The temporary folder, or /tmp when its path is long: Ray's socket paths under it must fit in 107 bytes."""
    root = tempfile.gettempdir()
    return root if len(root) <= 40 else "/tmp"


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT) -> str:
    """Raise ``RayConnectionError`` unless ``address``'s host accepts a TCP connection within ``timeout`` seconds;
    return the host.

    ``auto`` is left to Ray (it reads the address of a cluster started on this machine, and fails at once without
    one).
    """
    if address == "auto":
        return ""
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, sep, port_text = host_port.rpartition(":")
    if not sep or not port_text.isdigit():
        raise RayConnectionError(f"Ray address {address!r} is not host:port, ray://host:port or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port_text)), timeout=timeout):
            pass
    except OSError as exc:
        raise RayConnectionError(f"no Ray cluster answers at {address!r} ({exc.strerror or exc}); {HEAD_NODE_HINT}") \
            from None
    return host.strip("[]")


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block (the processes Ray starts inherit them), then restore them."""
    saved: dict[str, Any] = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    constants = None
    if "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in values:
        try:
            from ray._private import ray_constants as constants

            # read by Ray when it is imported: this process may have imported Ray before the variable was set
            saved_cluster, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, False
        except (ImportError, AttributeError):
            constants = None
    reload_auth = any(key.startswith("RAY_AUTH") for key in values)
    if reload_auth:
        _reload_auth_settings()
    try:
        yield
    finally:
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = saved_cluster
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if reload_auth:
            _reload_auth_settings()


def _reload_auth_settings() -> None:
    """Make this process's Ray read ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN`` again (it caches them on import)."""
    with contextlib.suppress(ImportError, AttributeError):
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
