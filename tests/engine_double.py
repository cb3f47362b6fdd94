"""A test double of a container engine as MLGym uses it: a ``docker``/``podman`` command line and a Docker Engine API.

MLGym (``mlgym/environment/utils.py``, ``env.py``) reaches its engine two ways, for docker and podman alike:

- the command line: ``<engine> run -i --rm --network host [--gpus ...] [-v ...] --name NAME IMAGE /bin/bash -l``
  (a long-lived shell on stdin/stdout), ``<engine> cp HOST_PATH ID:PATH`` and ``<engine> exec -u root ID CMD...``;
- the Engine API through docker-py's ``docker.from_env()`` (``DOCKER_HOST``, default ``/var/run/docker.sock``):
  ``GET /version``, ``GET /images/json?filters={"reference": [...]}``, ``GET /containers/<id>/json``, exec create /
  start / inspect (``exec_run``) and ``DELETE /containers/<id>`` (``remove(force=True)``).

``EngineDouble`` provides both: an executable ``docker`` or ``podman`` script written into a folder for PATH, and a
small HTTP server on a unix socket (``DOCKER_HOST=unix://...``). A "container" is a ``bash`` on this machine whose
agent home is ``<state>/home/agent`` (the stand-in MLGym reads ``MLGYM_STANDIN_AGENT_HOME``); ``chown`` is a no-op
(there is no ``agent`` user here). Every command line and API request is recorded (``cli_calls``, ``api_calls``).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import signal
import socketserver
import subprocess
import sys
import threading
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

ENGINE_SCRIPT = r'''#!__PYTHON__
import json, os, shutil, signal, subprocess, sys, uuid
from pathlib import Path

state = Path(os.environ["ENGINE_DOUBLE_STATE"])
args = sys.argv[1:]
with open(state / "cli.log", "a") as log:
    log.write(json.dumps(args) + "\n")
containers = state / "containers"


def find(ref):
    for path in containers.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        if ref in (data["Id"], data["Name"]):
            return path, data
    sys.exit(f"Error: no container with name or ID {ref!r} found")


def run_command(command):
    if command[:1] == ["chown"]:
        return 0  # no agent user on this machine
    return subprocess.run(command, env={**os.environ, "PATH": os.environ["ENGINE_DOUBLE_PATH"]}).returncode


if not args or (state / "dead").exists():
    print("Cannot connect to the container daemon", file=sys.stderr)
    sys.exit(125)
if args[0] == "info":
    print("engine double")
elif args[0] == "run":
    rest = args[1:]
    name = rest[rest.index("--name") + 1]
    image = rest[rest.index("--name") + 2]
    if image not in json.loads((state / "images.json").read_text()):
        print(f"Error: {image}: image not known", file=sys.stderr)
        sys.exit(125)
    record = containers / f"{name}.json"
    pending = containers / f".{name}.pending"
    pending.write_text(json.dumps({"Id": uuid.uuid4().hex, "Name": name, "Image": image, "argv": args,
                                   "pid": os.getpid()}))
    os.replace(pending, record)  # the API never reads half a record
    env = {"PATH": os.environ["ENGINE_DOUBLE_PATH"], "HOME": os.environ["MLGYM_STANDIN_AGENT_HOME"],
           "LANG": "C.UTF-8"}
    shell = subprocess.Popen(["bash", "--noprofile", "--norc"], env=env)
    signal.signal(signal.SIGTERM, lambda *_: shell.kill())  # DELETE /containers/<id> ends the shell too
    try:
        code = shell.wait()
    finally:
        if "--rm" in rest:
            record.unlink(missing_ok=True)
    sys.exit(code)
elif args[0] == "cp":
    source, target = args[1], args[2]
    ref, path = target.split(":", 1)
    find(ref)
    destination = Path(path)
    if destination.is_dir():
        destination = destination / Path(source).name
    if Path(source).is_dir():
        shutil.copytree(source, destination)
    else:
        shutil.copy(source, destination)
elif args[0] == "exec":
    rest = args[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in ("-u", "--user") else rest[1:]
    find(rest[0])
    sys.exit(run_command(rest[1:]))
else:
    sys.exit(f"engine double: unsupported command {args!r}")
'''


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class EngineDouble:
    """A fake ``docker``/``podman`` (command line + Engine API on a unix socket). See the module docstring.

    Args:
        root: a fresh folder for the double's state, socket and executable.
        engine: ``"docker"`` or ``"podman"``: the executable's name and what ``GET /version`` says it is.
        images: the images the engine holds.
    """

    def __init__(self, root: Path, engine: str = "docker", images: tuple[str, ...] = ("aigym/mlgym-agent:latest",)):
        self.root = Path(root)
        self.engine = engine
        self.api_engine = engine
        self.bin_dir = self.root / "bin"
        self.state = self.root / "state"
        self.agent_home = self.state / "home" / "agent"
        self.image_bin = self.state / "image-bin"
        for folder in (self.bin_dir, self.state / "containers", self.agent_home, self.image_bin):
            folder.mkdir(parents=True, exist_ok=True)
        for name in ("python", "python3"):
            wrapper = self.image_bin / name
            wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
            wrapper.chmod(0o755)
        self.images = list(images)
        self.socket_path = self.root / "engine.sock"
        self.api_calls: list[tuple[str, str]] = []
        self.execs: dict[str, dict[str, Any]] = {}
        self._server: _Server | None = None
        script = self.bin_dir / engine
        script.write_text(ENGINE_SCRIPT.replace("__PYTHON__", sys.executable))
        script.chmod(0o755)

    # -- set-up ----------------------------------------------------------------------------------------------------
    @property
    def container_path(self) -> str:
        """PATH in a container: this interpreter as ``python`` (the image's Python with MLGym's packages), never the
        rest of its venv's ``bin``, whose console scripts (verifiers' ``validate``, ``eval``...) would shadow the
        commands MLGym adds to the container's PATH."""
        return f"{self.image_bin}:/usr/local/bin:/usr/bin:/bin"

    @property
    def images(self) -> list[str]:
        return json.loads((self.state / "images.json").read_text())

    @images.setter
    def images(self, names: list[str]) -> None:
        (self.state / "images.json").write_text(json.dumps(list(names)))

    def set_dead(self, dead: bool = True) -> None:
        """Make the command line fail like an engine whose service is down."""
        marker = self.state / "dead"
        marker.touch() if dead else marker.unlink(missing_ok=True)

    def environment(self, *, api: bool = True) -> dict[str, str]:
        """Variables for ``monkeypatch.setenv``: PATH with only the engine, DOCKER_HOST (when ``api``), the state."""
        variables = {
            "PATH": str(self.bin_dir),
            "ENGINE_DOUBLE_STATE": str(self.state),
            "ENGINE_DOUBLE_PATH": self.container_path,
            "MLGYM_STANDIN_AGENT_HOME": str(self.agent_home),
            "DOCKER_HOST": f"unix://{self.socket_path}" if api else f"unix://{self.root / 'no-such.sock'}",
        }
        return variables

    def start(self) -> EngineDouble:
        """Serve the Engine API on ``socket_path`` (in a thread) until ``stop()``."""
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                double._handle(self, "GET")

            def do_POST(self) -> None:
                double._handle(self, "POST")

            def do_DELETE(self) -> None:
                double._handle(self, "DELETE")

        self._server = _Server(str(self.socket_path), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop the API and every container shell still running."""
        for record in self.containers():
            self._kill(record)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- what happened ---------------------------------------------------------------------------------------------
    @property
    def cli_calls(self) -> list[list[str]]:
        log = self.state / "cli.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def containers(self) -> list[dict[str, Any]]:
        """The running containers (records of ``run``, removed when it ends)."""
        found = []
        for path in sorted((self.state / "containers").glob("*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except FileNotFoundError:
                pass  # its shell just ended
        return found

    # -- the Engine API --------------------------------------------------------------------------------------------
    def _find(self, ref: str) -> dict[str, Any] | None:
        return next((c for c in self.containers() if ref in (c["Id"], c["Name"])), None)

    def _kill(self, record: dict[str, Any]) -> None:
        try:
            os.kill(record["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
        (self.state / "containers" / f"{record['Name']}.json").unlink(missing_ok=True)

    def _handle(self, request: http.server.BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(request.path)
        path = re.sub(r"^/v[0-9.]+", "", url.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length) or b"null") if length else None
        self.api_calls.append((method, path))
        status, answer = self._route(method, path, query, body)
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/octet-stream" if isinstance(answer, bytes)
                            else "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if data:
            request.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if (method, path) == ("GET", "/version"):
            name = "Podman Engine" if self.api_engine == "podman" else "Engine"
            return 200, {"Version": "0.0-double", "ApiVersion": "1.41", "Components": [{"Name": name}]}
        if (method, path) == ("GET", "/images/json"):
            filters = json.loads(query.get("filters", ["{}"])[0])
            wanted = filters.get("reference", [])
            wanted = [wanted] if isinstance(wanted, str) else list(wanted)
            found = [i for i in self.images if not wanted or i in wanted]
            return 200, [{"Id": f"sha256:{i}", "RepoTags": [i], "Created": 0, "Os": "linux",
                          "Architecture": "amd64"} for i in found]
        if parts[0] == "containers" and len(parts) >= 2:
            record = self._find(parts[1])
            if record is None:
                return 404, {"message": f"No such container: {parts[1]}"}
            if method == "GET" and parts[2:] == ["json"]:
                return 200, {"Id": record["Id"], "Name": "/" + record["Name"], "State": {"Status": "running"},
                             "Config": {"Image": record["Image"]}}
            if method == "POST" and parts[2:] == ["exec"]:
                exec_id = uuid.uuid4().hex
                self.execs[exec_id] = {"container": record["Id"], "Cmd": body["Cmd"], "User": body.get("User", "")}
                return 201, {"Id": exec_id}
            if method == "DELETE" and len(parts) == 2:
                self._kill(record)
                return 204, b""
        if parts[0] == "exec" and len(parts) == 3 and parts[1] in self.execs:
            job = self.execs[parts[1]]
            if method == "POST" and parts[2] == "start":
                command = job["Cmd"] if isinstance(job["Cmd"], list) else shlex.split(job["Cmd"])
                if command[:1] == ["chown"]:
                    job["ExitCode"], output = 0, b""
                else:
                    result = subprocess.run(command, capture_output=True, env=self._shell_env())
                    job["ExitCode"], output = result.returncode, result.stdout + result.stderr
                return 200, output
            if method == "GET" and parts[2] == "json":
                return 200, {"ExitCode": job.get("ExitCode"), "Running": False}
        return 404, {"message": f"engine double: {method} {path} is not implemented"}

    def _shell_env(self) -> dict[str, str]:
        return {"PATH": self.container_path, "HOME": str(self.agent_home)}
