"""``mlgym-registry`` command lines for tests, run as a user runs them but started from a warm process.

A command that plays an episode spends most of a short run importing torch, tensordict, TorchRL and transformers
(4-5 s of CPU a fresh interpreter, about 30 of them a suite). ``CommandServer`` keeps one ``cli_server.py`` per test
process, which imports them once; each command is then a process forked from it that runs ``mlgym_registry.cli`` as
``__main__`` with the test's working folder, environment and umask, and its own standard streams and exit status.

A command whose environment changes what an interpreter reads as it starts (``PYTHONPATH``, say, for a test's fake
site folder) runs in a fresh interpreter instead, as does one that comes while the server is busy with another.
"""

from __future__ import annotations

import json
import locale
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

STARTUP_VARIABLES = ("PYTHON", "LD_", "OMP_", "MKL_", "OPENBLAS_", "MALLOC_")
"""Prefixes of the variables an interpreter or the libraries it loads read as they start: a command whose environment
sets them otherwise than the server's ran with gets a fresh interpreter."""

COMMAND_CEILING = 600.0
"""Seconds a command may take before it counts as hung (not a timing: see tests/conftest.py's SUBPROCESS_CEILING)."""


class CommandServer:
    """Runs ``mlgym-registry`` command lines through ``cli_server.py``, started on the first one and kept until
    ``close``; the commands' output goes to files in ``folder`` and is read back."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.server: subprocess.Popen | None = None
        self.server_env: dict[str, str] = {}
        self.count = 0
        self.busy = threading.Lock()

    def run(self, words: list[str], cwd: Path | str | None = None, env: dict[str, str] | None = None,
            timeout: float = COMMAND_CEILING) -> tuple[int, str, str]:
        """``(exit status, stdout, stderr)`` of ``mlgym-registry WORDS`` run in ``cwd`` (this process's working
        folder by default) with ``env`` (this process's environment by default) and this process's umask."""
        env = dict(os.environ if env is None else env)
        self.count += 1
        stdout, stderr = (self.folder / f"{self.count}.{name}" for name in ("out", "err"))
        umask = os.umask(0)
        os.umask(umask)
        self._send({"argv": list(words), "cwd": str(cwd or os.getcwd()), "env": env, "umask": umask,
                    "stdout": str(stdout), "stderr": str(stderr)})
        pid = self._receive(COMMAND_CEILING)["pid"]
        try:
            try:
                code = self._receive(timeout)["exit"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._receive(COMMAND_CEILING)
                raise
            return code, text(stdout), text(stderr)
        finally:
            for path in (stdout, stderr):
                path.unlink(missing_ok=True)

    def runs_as_fresh(self, env: dict[str, str] | None) -> bool:
        """Whether a command with ``env`` must start a fresh interpreter: it sets a variable an interpreter reads as
        it starts otherwise than the server's environment did."""
        running = self.server is not None and self.server.poll() is None
        server_env = self.server_env if running else os.environ  # a server started now gets this one
        env = os.environ if env is None else env
        names = {name for name in (*env, *server_env) if name.startswith(STARTUP_VARIABLES)}
        return any(env.get(name) != server_env.get(name) for name in names)

    def _send(self, request: dict) -> None:
        if self.server is None or self.server.poll() is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.server_env = dict(os.environ)
            with (self.folder / "server.log").open("ab") as log:
                self.server = subprocess.Popen(
                    [sys.executable, str(Path(__file__).with_name("cli_server.py"))], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, bufsize=0,
                )
        data = memoryview(json.dumps(request).encode() + b"\n")
        while data:  # a raw pipe may take part of it at a time
            data = data[self.server.stdin.write(data):]

    def _receive(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("mlgym-registry", timeout)
        line = self.server.stdout.readline()
        if not line:
            log = (self.folder / "server.log").read_text(errors="replace")
            raise RuntimeError(f"the command server ended (exit status {self.server.wait()}):\n{log}")
        return json.loads(line)

    def stop(self) -> None:
        """End the server (it ends at the end of its input); the next command starts another."""
        if self.server is not None:
            self.server.stdin.close()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server.stdout.close()
            self.server = None

    def close(self) -> None:
        """End the server and remove the output folder."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def text(path: Path) -> str:
    """A command's output file as ``subprocess.run(..., text=True)`` gives it: decoded with the locale's encoding,
    newlines translated."""
    data = path.read_bytes().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


_SHARED: CommandServer | None = None
_FOLDER: Path | None = None


def configure(folder: Path) -> None:
    """Where this process's command server is to keep the commands' output (the session's temporary folder)."""
    global _FOLDER
    _FOLDER = folder


def shared() -> CommandServer:
    """This test process's command server, made on first use (its server starts with the first command)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = CommandServer(_FOLDER or Path(tempfile.mkdtemp(prefix="mlgym-registry-cli-")))
    return _SHARED


def close_shared() -> None:
    """End this process's command server, if it started one."""
    global _SHARED
    if _SHARED is not None:
        _SHARED.close()
        _SHARED = None


def run_cli(args: tuple[str, ...], env: dict[str, str] | None, timeout: float) -> subprocess.CompletedProcess:
    """``python -m mlgym_registry.cli ARGS`` as ``subprocess.run(..., capture_output=True, text=True)`` runs it
    (``TimeoutExpired`` after killing it past ``timeout``), forked from this process's command server where it may
    be (see the module's docstring), else in a fresh interpreter."""
    command = [sys.executable, "-m", "mlgym_registry.cli", *args]
    server = shared()
    if env is None and server.runs_as_fresh(None) and server.busy.acquire(blocking=False):
        try:  # a startup variable of this process changed since the server started: the next server starts with it
            server.stop()
        finally:
            server.busy.release()
    if not server.runs_as_fresh(env) and server.busy.acquire(blocking=False):
        try:
            code, stdout, stderr = server.run(list(args), env=env, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise subprocess.TimeoutExpired(command, timeout) from exc
        finally:
            server.busy.release()
        return subprocess.CompletedProcess(command, code, stdout, stderr)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
