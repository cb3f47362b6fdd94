"""One persistent bash process talked to over pipes, with an end-of-command marker instead of sleeps.

Each command is sent as ``{ <command> } </dev/null`` followed by a ``printf`` of a marker that carries the command's
exit status; output (stderr merged) is read with ``select`` until the marker arrives. The command's stdin is
``/dev/null`` so that a program reading stdin cannot swallow the marker. On a timeout every process of the session
except the shell is killed and the shell is given a moment to print the marker; if it does not (a builtin loop, a
half-read here-document), the caller restarts the session.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .command_clock import CommandClock, Meter
from .output import CappedBuffer, normalise

INTERRUPT_GRACE = 3.0
"""Seconds the shell gets to print the marker after the command's processes were killed."""

MARKER_TAIL = re.compile(rb"(-?\d*):DONE///\n")
"""What follows a command's token in its end-of-command marker: the exit status."""


@dataclass
class Result:
    """What one command produced."""

    output: str
    returncode: int | None
    timed_out: str | None = None  # None, "total" or "no_output"
    shell_died: bool = False
    marker_lost: bool = False  # timed out and the shell never came back: the caller must restart it
    starved_note: str = ""  # timed out at the backstop, its clock short: the machine's load (command_clock)


class ShellSession:
    """A ``bash`` process in its own session and process group, reading commands from a pipe."""

    def __init__(
        self,
        cwd: Path,
        env: dict[str, str],
        *,
        bash: str,
        prefix: Sequence[str] = (),
        preexec: Callable[[], None] | None = None,
        max_output_bytes: int = 400_000,
        extra_kill: Callable[[], set[int]] | None = None,
        sandboxed: bool = False,
        meter: Meter | None = None,
    ):
        """Start the shell. ``sandboxed``: ``prefix`` starts a sandbox whose first process is the shell, so the shell
        is a descendant of the process started here (never that process itself), and every process of the session is
        a descendant too (the sandbox's PID namespace makes the shell the reaper of orphans). ``meter``: the CPU the
        session's processes used, for the clock that counts a command's time limits in the time it could run
        (``command_clock``; None: the CPU of its live processes is counted instead)."""
        self._new_token()
        self._meter = meter
        self._sandboxed = sandboxed
        self.max_output_bytes = max_output_bytes
        self._extra_kill = extra_kill
        self.proc = subprocess.Popen(
            [*prefix, bash, "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=str(cwd),
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
            close_fds=True,
        )
        self.pid = self.proc.pid
        # found when first needed: a sandbox takes milliseconds to start its shell, and a command can be written to
        # the pipe meanwhile (bash reads it once it runs), so a reset need not wait and poll for it
        self._shell: tuple[int, set[int]] | None = None if prefix else (self.pid, set())
        self._fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self._in = self.proc.stdin.fileno()  # type: ignore[union-attr]
        os.set_blocking(self._fd, False)
        os.set_blocking(self._in, False)

    # -- state -----------------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Whether the shell is still running."""
        return self.proc.poll() is None

    @property
    def shell_pid(self) -> int:
        """The shell's pid (as this process sees it)."""
        return self._located()[0]

    @property
    def _wrappers(self) -> set[int]:
        """The processes between the one started here and the shell (the sandbox's own)."""
        return self._located()[1]

    def _located(self) -> tuple[int, set[int]]:
        if self._shell is None:
            self._shell = self._find_shell()
        return self._shell

    def processes(self) -> set[int]:
        """Every process of the session except the shell itself (and the sandbox around it)."""
        # sandboxed, every process is a descendant: walking the tree beats scanning every process of the machine
        found = procs.descendants(self.pid) if self._sandboxed else procs.session_processes(self.pid)
        if self._extra_kill is not None:
            found |= self._extra_kill()
        return found - self._wrappers - {self.pid, self.shell_pid}

    def _find_shell(self, within: float = 10.0) -> tuple[int, set[int]]:
        """The shell's pid when a wrapper (the sandbox) started it, and the wrapper's own processes on the way."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = self._look_for_shell()
            if found is not None:
                return found
            time.sleep(0.001)
        return self.pid, set()

    def _look_for_shell(self) -> tuple[int, set[int]] | None:
        """``_find_shell``'s answer if the shell runs now, else None."""
        if not self._sandboxed and procs.command_name(self.pid) == "bash":
            return self.pid, set()  # the wrapper replaced itself with the shell (``unshare -n``)
        chain = procs.first_descendant_named(self.pid, "bash")
        return (chain[-1], set(chain[:-1]) | {self.pid}) if chain else None

    def _shell_if_running(self) -> int | None:
        """The shell's pid if it runs now (found without waiting for it), else None."""
        if self._shell is None:
            self._shell = self._look_for_shell()
        return self._shell[0] if self._shell is not None else None

    def _new_token(self) -> None:
        """A fresh end-of-command marker: one that an earlier command saw is worth nothing to forge the next."""
        self.token = uuid.uuid4().hex
        self._start = f"///MLGR-{self.token}:".encode()

    def _marker(self, recent: bytes) -> re.Match[bytes] | None:
        """The end-of-command marker with this command's token in ``recent`` (its group 1 is the exit status), or
        None. The token is found as bytes and only the fixed tail is a regex: compiling a pattern per command cost
        more than the search itself."""
        at = recent.find(self._start)
        while at != -1:
            match = MARKER_TAIL.match(recent, at + len(self._start))
            if match:
                return match
            at = recent.find(self._start, at + 1)
        return None

    # -- commands --------------------------------------------------------------------------------------------------
    def run(
        self,
        command: str,
        timeout: float,
        no_output_timeout: float | None = None,
        after: str = "",
        *,
        raw: bool = False,
    ) -> Result:
        """Run ``command`` in the shell and return its normalised output. ``after`` runs after it, before the marker.
        ``raw``: the output as the command wrote it (decoded with ``surrogateescape``, not normalised; empty when it
        did not fit in ``max_output_bytes``), for the driver's own commands."""
        self._new_token()
        script = (
            # the assignment keeps the group valid when the command is only comments (bash would exit on the syntax
            # error); unlike ":" or "true" it cannot be redefined as a function by the agent
            "{ __mlgr_rc=0\n" + command + "\n\n} </dev/null\n__mlgr_rc=$?\n" + (after + "\n" if after else "")
            + f"printf '\\n%s%s:DONE///\\n' {shlex.quote(self._start.decode())} \"$__mlgr_rc\"\n"
        )
        pending = script.encode("utf-8", errors="surrogateescape")
        return self._read(pending, timeout, no_output_timeout if no_output_timeout is not None else timeout, raw)

    def _read(self, pending: bytes, timeout: float, no_output_timeout: float, raw: bool = False) -> Result:
        """Feed ``pending`` to the shell and collect its output until the marker.

        Writing and reading are interleaved so that a long command whose first part prints a lot cannot deadlock
        with both pipes full. The limits are kept on the command's clock (``command_clock``).
        """
        buffer = CappedBuffer(self.max_output_bytes)
        recent = b""
        # the shell if it runs yet (one that starts later is the command's), and at a deadline every process of the
        # session: those started since the command began are the command's
        clock = CommandClock(self._meter, self._shell_if_running, lambda: self.processes() | {self.shell_pid})
        quiet_since, quiet_stall = clock.began, 0.0  # the no-output limit counts from the last output
        while True:
            now = time.monotonic()  # one reading for both limits: with equal limits the total one is up first
            left = clock.left(timeout, now=now)
            quiet_left = clock.left(no_output_timeout, quiet_since, quiet_stall, now=now)
            if left <= 0 or quiet_left <= 0:
                # this process may be the one that ran late: what the command printed in time is read first
                data = self._ready_output()
                if data:
                    buffer.add(data)
                    recent = (recent + data)[-512:]
                    match = self._marker(recent)
                    if match:
                        return Result(self._text(buffer, raw), _to_int(match.group(1)))
                    if left > 0:  # it was not quiet: the reader was late
                        quiet_since, quiet_stall = time.monotonic(), clock.stall
                        continue
                kind, limit = ("total", timeout) if left <= 0 else ("no_output", no_output_timeout)
                result = self._interrupt(buffer, recent, kind)
                result.starved_note = clock.starved_note(limit) if clock.starved else ""
                return result
            writers = [self._in] if pending else []
            ready, writable, _ = select.select([self._fd], writers, [], min(left, quiet_left, clock.due_in()))
            clock.read_if_due()
            if writable:
                try:
                    pending = pending[os.write(self._in, pending[: 1 << 16]) :]
                except BlockingIOError:
                    pass
                except OSError:  # the shell is gone
                    return Result(self._text(buffer), self._exit_status(), shell_died=True)
            if not ready:
                continue
            data = self._read_available()
            if data is None:
                continue
            if not data:  # EOF: the shell is gone
                return Result(self._text(buffer), self._exit_status(), shell_died=True)
            buffer.add(data)
            quiet_since, quiet_stall = time.monotonic(), clock.stall
            recent = (recent + data)[-512:]
            match = self._marker(recent)
            if match:
                return Result(self._text(buffer, raw), _to_int(match.group(1)))

    def _ready_output(self, limit: int = 1 << 20) -> bytes:
        """What the shell has written and this process not yet read, up to about ``limit`` bytes (a command still
        printing would never let it end); empty at EOF too: the caller's next read finds it."""
        chunks: list[bytes] = []
        size = 0
        while size < limit and select.select([self._fd], [], [], 0)[0]:
            data = self._read_available()
            if not data:
                break
            chunks.append(data)
            size += len(data)
        return b"".join(chunks)

    def _read_available(self) -> bytes | None:
        try:
            return os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def _interrupt(self, buffer: CappedBuffer, recent: bytes, kind: str) -> Result:
        """Kill the running command's processes and give the shell a moment to print the marker.

        Programs the rest of the command line starts during that moment are killed as well; shell builtins still run.
        """
        self.kill_processes()
        deadline = time.monotonic() + INTERRUPT_GRACE
        while time.monotonic() < deadline:
            # the rest of the command line keeps running in the shell: stop whatever it starts next too
            procs.kill_all(self.processes())
            ready, _, _ = select.select([self._fd], [], [], min(max(deadline - time.monotonic(), 0), 0.05))
            if not ready:
                continue
            data = self._read_available()
            if data is None:
                continue
            if not data:
                return Result(self._text(buffer), self._exit_status(), timed_out=kind, shell_died=True)
            buffer.add(data)
            recent = (recent + data)[-512:]
            match = self._marker(recent)
            if match:
                return Result(self._text(buffer), _to_int(match.group(1)), timed_out=kind)
        return Result(self._text(buffer), None, timed_out=kind, marker_lost=True)

    def kill_processes(self, within: float = 2.0) -> bool:
        """Kill every process of the session but the shell; True when none is left.

        They are stopped first, until no new one appears, and only then killed: a stopped process cannot fork, so a
        fork bomb cannot replace its members as fast as they are killed, however loaded the machine is.
        """
        deadline = time.monotonic() + within
        stopped: set[int] = set()
        while time.monotonic() < deadline:
            running = {pid for pid in self.processes() - stopped if procs.alive(pid)}
            if not running:
                break
            procs.signal_all(running, signal.SIGSTOP)
            stopped |= running
        procs.kill_all(stopped)  # even when stopping used up the time: a stopped process must not be left behind
        while True:
            victims = self.processes()
            if not victims:
                return True
            if time.monotonic() > deadline:
                return False
            procs.kill_all(victims)
            time.sleep(0.005)

    def pause(self, within: float = 2.0) -> set[int]:
        """Stop (SIGSTOP) every process of the session, the shell included, until no new one appears; their pids.

        While the workspace is copied for an evaluation nothing of the agent's may change it: a file swapped for a
        link between a check and a copy would make the copy read a file of the host.
        """
        deadline = time.monotonic() + within
        stopped: set[int] = set()
        while time.monotonic() < deadline:
            running = {pid for pid in self.processes() | {self.shell_pid} if pid not in stopped and procs.alive(pid)}
            if not running:
                break
            procs.signal_all(running, signal.SIGSTOP)
            stopped |= running
        return stopped

    @staticmethod
    def resume(pids: set[int]) -> None:
        """Continue what ``pause`` stopped."""
        procs.signal_all(pids, signal.SIGCONT)

    def discard_pending(self) -> int:
        """Drop output waiting in the pipe (written after the last command ended); returns how many bytes."""
        dropped = 0
        while data := self._ready_output():
            dropped += len(data)
        return dropped

    def _text(self, buffer: CappedBuffer, raw: bool = False) -> str:
        data = buffer.contents()
        cut = data.rfind(b"\n" + self._start)
        if cut < 0:
            cut = data.rfind(self._start)
        if cut >= 0:
            data = data[:cut]
        if raw:
            return "" if buffer.dropped else data.decode("utf-8", "surrogateescape")
        return normalise(data)

    def _exit_status(self) -> int | None:
        try:
            return self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return None

    # -- shutdown --------------------------------------------------------------------------------------------------
    def kill(self) -> None:
        """End the shell and everything it started; idempotent."""
        victims = self.processes()
        try:
            os.killpg(self.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        procs.kill_all(victims | {self.pid})
        for _ in range(3):
            rest = self.processes()
            if not rest:
                break
            procs.kill_all(rest)
            time.sleep(0.01)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _to_int(text: bytes) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
