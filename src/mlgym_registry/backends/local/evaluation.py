"""Evaluating the agent's work the way MLGym's task classes do, but with evaluation files the agent cannot change.

MLGym runs ``python <workspace>/evaluate.py ...`` in the agent's own shell and relies on file permissions to keep the
evaluator intact. Here processes may run as root, where permissions protect nothing, so the evaluation runs in a
scratch copy of the workspace (hard links where possible) into which the pristine evaluation and protected files are
put back, in a separate process (not the agent's shell, whose functions and aliases the agent controls). Paths of the
scratch copy in the evaluator's output are shown as the workspace's own.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
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


@dataclass
class Evaluator:
    """Runs one task's evaluation against a workspace."""

    entrypoint: str
    workspace: Path
    evaluation_paths: list[str]
    pristine: dict[str, Path]  # workspace-relative path -> pristine copy (or the task's own data folder)
    scratch_root: Path
    python: str
    env: dict[str, str]
    timeout: float
    prefix: Sequence[str] = ()
    preexec: Callable[[], None] | None = None
    max_output_bytes: int = 400_000
    extra_env: dict[str, str] = field(default_factory=dict)

    def evaluate(self) -> tuple[Any, str]:
        """``(metrics, submission_path)``, or one of this module's exceptions (or ``TimeoutError``)."""
        if self.entrypoint not in SUPPORTED:
            raise EvaluationUnsupported(
                f"the local backend cannot evaluate {self.entrypoint} tasks (it supports "
                f"{', '.join(SUPPORTED)}); run this task with the 'mlgym' backend (MLGym in a container) instead."
            )
        submission = self._find_submission()
        scratch = Path(tempfile.mkdtemp(prefix="eval-", dir=self.scratch_root))
        try:
            copy = scratch / self.workspace.name
            _link_tree(self.workspace, copy)
            for relative, source in self.pristine.items():
                _restore(source, copy / relative)
            script = copy / (self.evaluation_paths[0] if self.evaluation_paths else "evaluate.py")
            argv = [self.python, str(script)]
            if self.entrypoint == "CSVSubmissionTasks":
                argv += ["--submission_file", str(copy / Path(submission).relative_to(self.workspace))]
            elif self.entrypoint == "ModelSubmissionTasks":
                argv += ["--config_fname", str(copy / Path(submission).relative_to(self.workspace))]
            # no stale or planted byte code, no user site-packages: the evaluator imports what the copy holds
            guard = {"PYTHONPYCACHEPREFIX": str(scratch / "pycache"), "PYTHONNOUSERSITE": "1"}
            output = self._run(argv, copy, guard).replace(str(copy), str(self.workspace))
        finally:
            _force_rmtree(scratch)
        return self._parse(output), submission

    def _find_submission(self) -> str:
        if self.entrypoint == "PythonSubmissionTasks":
            return f"{self.workspace}/target.py"
        if self.entrypoint == "CSVSubmissionTasks":
            if "submission.csv" in os.listdir(self.workspace):
                return f"{self.workspace}/submission.csv"
            raise SubmissionNotFoundError("no submission.csv in the workspace")
        for folder, dirs, files in sorted(os.walk(self.workspace)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".yaml"):
                    return str(Path(folder) / name)
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

    def _run(self, argv: list[str], cwd: Path, env: dict[str, str]) -> str:
        proc = subprocess.Popen(
            [*self.prefix, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=str(cwd),
            env={**self.env, **self.extra_env, **env},
            start_new_session=True,
            preexec_fn=self.preexec,
        )
        buffer = CappedBuffer(self.max_output_bytes)
        fd = proc.stdout.fileno()  # type: ignore[union-attr]
        deadline = time.monotonic() + self.timeout
        try:
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
        finally:
            leftovers = procs.session_processes(proc.pid) | ({proc.pid} if proc.poll() is None else set())
            procs.kill_all(leftovers)
            proc.stdout.close()  # type: ignore[union-attr]
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return normalise(buffer.contents())


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
    if target.is_dir() and not target.is_symlink():
        _force_rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        _link_tree(source, target)
    else:
        shutil.copy2(source, target)


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
