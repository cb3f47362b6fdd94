"""Evaluating the agent's work the way MLGym's task classes do, but with evaluation files the agent cannot change.

MLGym runs ``python <workspace>/evaluate.py ...`` in the agent's own shell and relies on file permissions to keep the
evaluator intact. Here processes may run as root, where permissions protect nothing, so the evaluation runs in a
scratch copy of the workspace (hard links where possible) into which the pristine evaluation and protected files are
put back, in a separate process (not the agent's shell, whose functions and aliases the agent controls). Paths of the
scratch copy in the evaluator's output are shown as the workspace's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import procs
from .output import CappedBuffer, normalise

SUPPORTED = ("PythonSubmissionTasks", "CSVSubmissionTasks", "ModelSubmissionTasks")


class SubmissionNotFoundError(Exception):
    """The task's submission artefact is not in the workspace."""


class EvaluationFormatError(Exception):
    """The evaluator's output holds no metrics JSON; ``args[0]`` is MLGym's observation text for it."""


class EvaluationUnsupported(Exception):
    """This backend cannot evaluate the task's kind of submission."""


def format_error(output: str) -> EvaluationFormatError:
    """MLGym's evaluation-format error (its text is an observation agents see)."""
    return EvaluationFormatError(
        f"Failed to decode metrics from evaluation script. Output:\n---\n{output}\n---\n"
        "Please make sure the evaluation script prints the metrics in json format."
    )


Wrap = Callable[[list[str], Path], list[str]]
"""Turns a command into one that runs sandboxed with a folder shown as the workspace (identity when unsandboxed)."""


@dataclass
class Evaluator:
    """Runs one task's evaluation against a snapshot of the agent's workspace.

    The snapshot is taken twice: the *agent view* (the agent's files, with the pristine evaluation and protected
    files put back) for the process that runs the agent's code, and the *evaluation view* (the same plus the secret
    files) for the pristine evaluator, which ``harness.py`` runs so that the agent's modules are proxies to the
    other process. ``wrap`` sandboxes both; ``workspace_path`` is where they see their view (the agent's path too).
    """

    entrypoint: str
    workspace: Path  # the host folder of the agent's workspace
    evaluation_paths: list[str]
    pristine: dict[str, Path]  # workspace-relative path -> pristine copy (or the task's own data folder)
    scratch_root: Path
    python: str
    env: dict[str, str]
    timeout: float
    wrap: Wrap | None = None
    workspace_path: str | None = None  # where the agent sees its workspace (default: the host folder)
    secrets: frozenset[str] = frozenset()  # keys of ``pristine`` the agent must never see
    preexec: Callable[[], None] | None = None
    max_output_bytes: int = 400_000
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def shown_workspace(self) -> str:
        """The workspace's path as the agent and its observations name it."""
        return self.workspace_path or str(self.workspace)

    def evaluate(self, freeze: Callable[[], AbstractContextManager[None]] | None = None) -> tuple[Any, str]:
        """``(metrics, submission_path)``, or one of this module's exceptions (or ``TimeoutError``).

        ``freeze`` keeps the agent's processes still while the workspace is copied.
        """
        if self.entrypoint not in SUPPORTED:
            raise EvaluationUnsupported(
                f"the local backend cannot evaluate {self.entrypoint} tasks (it supports "
                f"{', '.join(SUPPORTED)}); run this task with the 'mlgym' backend (MLGym in a container) instead."
            )
        submission = self._find_submission()
        scratch = Path(tempfile.mkdtemp(prefix="eval-", dir=self.scratch_root))
        try:
            agent_view, eval_view = scratch / "agent", scratch / "eval"
            with freeze() if freeze is not None else contextlib.nullcontext():
                _snapshot(self.workspace, agent_view, skip=set(self.pristine))
            for relative, source in self.pristine.items():
                if relative not in self.secrets:
                    _restore(source, agent_view / relative)
            for relative in self.secrets:  # also where a pristine folder put back above holds one
                _remove(agent_view / relative)
            _link_tree(agent_view, eval_view)
            for relative, source in self.pristine.items():
                _restore(source, eval_view / relative)
            script = self.evaluation_paths[0] if self.evaluation_paths else "evaluate.py"
            argv = [script]
            relative_submission = Path(submission).relative_to(self.shown_workspace)
            if self.entrypoint == "CSVSubmissionTasks":
                argv += ["--submission_file", str(relative_submission)]
            elif self.entrypoint == "ModelSubmissionTasks":
                argv += ["--config_fname", str(relative_submission)]
            output = self._run(argv, agent_view, eval_view)
        finally:
            _force_rmtree(scratch)
        return self._parse(output), submission

    def _find_submission(self) -> str:
        shown = self.shown_workspace
        if self.entrypoint == "PythonSubmissionTasks":
            return f"{shown}/target.py"
        if self.entrypoint == "CSVSubmissionTasks":
            if "submission.csv" in os.listdir(self.workspace):
                return f"{shown}/submission.csv"
            raise SubmissionNotFoundError("no submission.csv in the workspace")
        for folder, dirs, files in sorted(os.walk(self.workspace)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".yaml"):
                    return str(Path(shown) / Path(folder, name).relative_to(self.workspace))
        raise SubmissionNotFoundError("no *.yaml configuration in the workspace")

    def _parse(self, output: str) -> Any:
        if self.entrypoint == "ModelSubmissionTasks":
            line = next((ln for ln in output.split("\n") if ln.strip().startswith("{")), None)
            if line is None:
                raise format_error(output)
            text = line
        else:
            text = output
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise format_error(output) from None

    def _trusted_modules(self) -> list[str]:
        """The top-level modules the pristine files define (``x.py``, or ``pkg/`` for a package): the evaluator
        imports these files, never the agent's of the same name."""
        paths = set()
        for relative, source in self.pristine.items():
            first, _, rest = relative.partition("/")
            if not rest and first.endswith(".py"):
                paths.add(first)
            elif not rest and Path(source).is_dir() and (Path(source) / "__init__.py").is_file():
                paths.add(first + "/")
        return sorted(paths)

    def _run(self, argv: list[str], agent_view: Path, eval_view: Path) -> str:
        """Run the evaluator (and, for tasks that import the agent's code, that code's process); its output."""
        wrap = self.wrap or (lambda command, _view: command)
        sandboxed = self.workspace_path is not None  # each view is then shown at the agent's workspace path

        def inside(view: Path) -> str:
            return self.workspace_path if sandboxed else str(view)  # type: ignore[return-value]

        harness = harness_path(sandboxed=sandboxed)
        env = {**self.env, **self.extra_env, "PYTHONDONTWRITEBYTECODE": "1"}
        isolate = self.entrypoint != "ModelSubmissionTasks"  # model tasks load the agent's network code in-process
        runner = None
        fds: tuple[int, ...] = ()
        if isolate:
            request_read, request_write = os.pipe()
            answer_read, answer_write = os.pipe()
            runner = subprocess.Popen(
                wrap([self.python, "-I", harness, "serve", "--workspace", inside(agent_view)], agent_view),
                stdin=request_read, stdout=answer_write, stderr=subprocess.DEVNULL, cwd=str(agent_view), env=env,
                start_new_session=True, preexec_fn=self.preexec,
            )
            os.close(request_read)
            os.close(answer_write)
            fds = (request_write, answer_read)
        command = [self.python, "-I", harness, "evaluate", "--workspace", inside(eval_view),
                   "--trusted", ",".join(self._trusted_modules()) or ",",
                   "--fds", ",".join(map(str, fds)) or ",", "--",
                   f"{inside(eval_view)}/{argv[0]}", *argv[1:]]
        try:
            proc = subprocess.Popen(
                wrap(command, eval_view), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, cwd=str(eval_view), env=env, start_new_session=True,
                preexec_fn=self.preexec, pass_fds=fds,
            )
        finally:
            for fd in fds:
                os.close(fd)
        try:
            output = self._collect(proc)
        finally:
            for process in (proc, runner):
                if process is not None:
                    _end(process)
        if not sandboxed:
            output = output.replace(str(eval_view), self.shown_workspace)
        return output

    def _collect(self, proc: subprocess.Popen) -> str:
        buffer = CappedBuffer(self.max_output_bytes)
        fd = proc.stdout.fileno()  # type: ignore[union-attr]
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the evaluation did not finish within {_seconds(self.timeout)} seconds")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                buffer.add(data)
        proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        return normalise(buffer.contents())


def harness_path(*, sandboxed: bool) -> str:
    """Where the evaluation harness is, as the evaluator's process sees it."""
    from .sandbox import HARNESS_MOUNT

    return f"{HARNESS_MOUNT}/harness.py" if sandboxed else str(HARNESS_DIR / "harness.py")


HARNESS_DIR = Path(__file__).parent / "harness"


def _end(proc: subprocess.Popen) -> None:
    """Kill a process and everything it started; close its pipe."""
    leftovers = procs.session_processes(proc.pid) | ({proc.pid} if proc.poll() is None else set())
    procs.kill_all(leftovers)
    if proc.stdout is not None:
        proc.stdout.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _snapshot(source: Path, target: Path, skip: set[str]) -> None:
    """Copy the workspace into ``target``, leaving out ``skip`` paths, without ever following a link of the agent's.

    The copy runs as the driver's user (often root) over a folder the agent controls, so every name is opened
    relative to its folder's descriptor with ``O_NOFOLLOW``: a file or folder swapped for a link between listing and
    opening fails to open and is left out, instead of making the copy read a file of the host. Links are kept as
    links, then resolved inside the copy (``_resolve_links``), which the agent cannot touch.
    """
    fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _copy_folder(fd, target, "", skip)
    finally:
        os.close(fd)
    _resolve_links(target)


_NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _copy_folder(folder_fd: int, target: Path, prefix: str, skip: set[str]) -> None:
    target.mkdir()
    for name in os.listdir(folder_fd):
        if prefix + name in skip:
            continue
        try:
            info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(name, dir_fd=folder_fd), target / name)
            elif stat.S_ISDIR(info.st_mode):
                fd = os.open(name, _NO_FOLLOW | os.O_DIRECTORY, dir_fd=folder_fd)
                try:
                    _copy_folder(fd, target / name, f"{prefix}{name}/", skip)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(info.st_mode):
                _copy_file(folder_fd, name, target / name)
        except OSError:
            continue  # gone, swapped for a link, or not a plain file or folder: not part of the snapshot


def _copy_file(folder_fd: int, name: str, target: Path) -> None:
    fd = os.open(name, _NO_FOLLOW, dir_fd=folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return  # a fifo or device swapped in: reading it could block or mean anything
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as reader, open(target, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
        os.chmod(target, stat.S_IMODE(info.st_mode))
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(fd)


def _resolve_links(root: Path) -> None:
    """Replace the copy's symbolic links by copies of what they point to inside the copy, and drop the rest.

    A link is the agent's; resolved in the evaluation's view it could reach a file the agent may not read (a secret
    answer put back only there) or a file of the host. Only targets inside the copy itself count.
    """
    base = root.resolve()
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            link = Path(folder, name)
            if not link.is_symlink():
                continue
            resolved = link.resolve()
            link.unlink()
            if not resolved.is_relative_to(base) or not resolved.exists():
                continue
            if resolved.is_dir():
                shutil.copytree(resolved, link, symlinks=True)  # links inside are resolved as the walk reaches them
            else:
                shutil.copy2(resolved, link)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _link_tree(source: Path, target: Path) -> None:
    """Copy a tree using hard links where the file system allows them (fast, no extra space)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, symlinks=True, copy_function=link)


def _restore(source: Path, target: Path) -> None:
    """Put a pristine file or folder at ``target``, replacing (never writing through) what is there."""
    _remove(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        _link_tree(source, target)
    else:
        shutil.copy2(source, target)


def _remove(path: Path) -> None:
    """Delete a file, link or folder if it is there."""
    if path.is_dir() and not path.is_symlink():
        _force_rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _force_rmtree(path: Path) -> None:
    """``rm -rf``, also through folders made read-only."""

    def retry(function: Callable[..., Any], name: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(name), 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
            function(name)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=retry)  # noqa: B028 (onexc is 3.12+)


force_rmtree = _force_rmtree
