"""The container engine MLGym runs its tasks in (docker or podman): its command line, and the Docker Engine API that
MLGym reaches through docker-py, checked before a container starts."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

from ...errors import BackendUnavailable

CONTAINER_TYPES = ("docker", "podman")
DEFAULT_IMAGE = "aigym/mlgym-agent:latest"
"""MLGym's default image (``EnvironmentArguments.image_name``); MLGym never pulls it itself."""
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
"""Where docker-py (``docker.from_env()``, which MLGym calls) looks for the Engine API when ``DOCKER_HOST`` is unset."""


def check_container_engine(container_type: str, timeout: float = 20) -> None:
    """Raise ``BackendUnavailable`` unless ``container_type`` (docker or podman) is on PATH and answers ``info``.

    MLGym runs ``<engine> run``, ``<engine> cp`` and ``<engine> exec`` through this command line."""
    if container_type not in CONTAINER_TYPES:
        raise BackendUnavailable(f"container_type={container_type!r}: MLGym runs in {' or '.join(CONTAINER_TYPES)}")
    executable = shutil.which(container_type)
    other = next(t for t in CONTAINER_TYPES if t != container_type)
    if executable is None:
        raise BackendUnavailable(
            f"No container engine answers: `{container_type}` is not on PATH. MLGym runs its tasks in containers; "
            f"install {container_type} (or pass container_type={other!r} if {other} is installed) and get "
            f"MLGym's image (`{container_type} pull {DEFAULT_IMAGE}`)."
        )
    try:
        result = subprocess.run(
            [executable, "info"], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(
            f"No container engine answers: `{container_type} info` failed ({exc}). Start the {container_type} "
            f"service (or pass container_type={other!r})."
        ) from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise BackendUnavailable(
            f"No container engine answers: `{container_type} info` exited with {result.returncode}"
            f"{': ' + detail[-1] if detail else ''}. Start the {container_type} service or fix its permissions "
            f"(or pass container_type={other!r})."
        )


def podman_socket() -> Path:
    """Where podman's rootless API socket is when ``podman.socket`` runs (MLGym's README points DOCKER_HOST at it)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return Path(runtime) / "podman" / "podman.sock"


def docker_host() -> str:
    """The Engine API address docker-py's ``docker.from_env()`` uses: ``DOCKER_HOST``, else the default socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def engine_api_get(host: str, path: str, timeout: float = 10) -> tuple[int, Any] | None:
    """``GET path`` on the Docker Engine API at ``host`` (``unix://`` or ``tcp://``): ``(status, JSON body)``.

    None when ``host`` cannot be probed without docker-py (TLS, ``ssh://``, ``npipe://``). Raises ``OSError`` when
    nothing answers."""
    url = urllib.parse.urlsplit(host)
    if url.scheme in ("unix", "http+unix"):
        connection: http.client.HTTPConnection = _UnixConnection(url.path, timeout)
    elif url.scheme in ("tcp", "http") and not os.environ.get("DOCKER_TLS_VERIFY"):
        connection = http.client.HTTPConnection(url.hostname or "localhost", url.port or 2375, timeout=timeout)
    else:
        return None
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    except http.client.HTTPException as exc:
        raise OSError(f"not an Engine API: {exc}") from exc
    finally:
        connection.close()
    try:
        return response.status, json.loads(body or b"null")
    except ValueError as exc:
        raise OSError(f"not an Engine API: {path} answered {body[:80]!r}") from exc


def _api_fix(container_type: str) -> str:
    if container_type == "podman":
        return (
            "Start podman's API socket and point DOCKER_HOST at it: `systemctl --user start podman.socket` then "
            f"`export DOCKER_HOST=unix://{podman_socket()}` (macOS: `podman machine start`, then DOCKER_HOST as "
            "MLGym's README shows)."
        )
    return "Start the docker daemon (`sudo systemctl start docker`), or export DOCKER_HOST=<its API address>."


def check_engine_api(container_type: str, image_name: str, timeout: float = 10) -> None:
    """Raise ``BackendUnavailable`` unless the Docker Engine API MLGym uses answers, belongs to ``container_type``
    and holds ``image_name``.

    MLGym reaches the engine through docker-py's ``docker.from_env()`` for podman as well as docker (``DOCKER_HOST``,
    default ``unix:///var/run/docker.sock``): it lists images to find its image, then finds its container and runs
    ``exec`` and ``remove`` through that API. The command-line check alone would pass on a host where none of that
    works, and ``reset()`` would fail with MLGym's plain ``RuntimeError``."""
    host = docker_host()
    where = f"DOCKER_HOST={host}" if os.environ.get("DOCKER_HOST") else f"{host} (DOCKER_HOST is unset)"
    hint = ""
    if container_type == "podman" and not os.environ.get("DOCKER_HOST") and podman_socket().exists():
        hint = f" podman's socket is at {podman_socket()}: `export DOCKER_HOST=unix://{podman_socket()}`."
    try:
        answer = engine_api_get(host, "/version", timeout)
    except OSError as exc:
        raise BackendUnavailable(
            f"No Docker Engine API answers at {where}: {exc}. MLGym talks to {container_type} through that API "
            f"(docker-py's docker.from_env(), for podman too) as well as through its command line.{hint} "
            f"{_api_fix(container_type)}"
        ) from exc
    if answer is None:
        return  # an address only docker-py itself can reach; MLGym will say if it does not answer
    status, version = answer
    if status != 200 or not isinstance(version, dict):
        raise BackendUnavailable(
            f"The Docker Engine API at {where} answered GET /version with HTTP {status}. {_api_fix(container_type)}"
        )
    components = " ".join(str(c.get("Name", "")) for c in version.get("Components") or [] if isinstance(c, dict))
    api_engine = "podman" if "podman" in f"{components} {version.get('Platform', '')}".lower() else "docker"
    if api_engine != container_type:
        raise BackendUnavailable(
            f"The Docker Engine API at {where} is {api_engine}'s, but container_type={container_type!r}: MLGym would "
            f"look for its image and container in {api_engine} and start them with {container_type}. "
            f"Pass container_type={api_engine!r}, or point DOCKER_HOST at {container_type}'s API. "
            f"{_api_fix(container_type)}"
        )
    query = urllib.parse.urlencode({"filters": json.dumps({"reference": [image_name]})})
    try:
        status, images = engine_api_get(host, f"/images/json?{query}", timeout) or (200, [None])
    except OSError as exc:
        raise BackendUnavailable(f"The Docker Engine API at {where} failed to list images: {exc}") from exc
    if status != 200 or not images:
        raise BackendUnavailable(
            f"The container image {image_name!r} is not in {container_type}'s image store (MLGym never pulls it). "
            f"Get it with `{container_type} pull {image_name}`"
            + (
                f", or build it in the MLGym checkout: `{container_type} build -f dockerfiles/mlgym.dockerfile "
                f"-t {image_name} .`"
                if image_name == DEFAULT_IMAGE
                else f" (MLGym's own image is {DEFAULT_IMAGE})"
            )
            + "."
        )
