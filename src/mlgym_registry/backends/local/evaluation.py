"""Evaluating the agent's work the way MLGym's task classes do, but with evaluation files the agent cannot change.

MLGym runs ``python <workspace>/evaluate.py ...`` in the agent's own shell and relies on file permissions to keep the
evaluator intact. Here processes may run as root, where permissions protect nothing, so the evaluation runs in a
separate process (not the agent's shell, whose functions and aliases the agent controls) over a view that is built,
never inherited: the task's own pristine files plus only the submission the task declares
(``submissions.declared_submission``), taken from a scratch copy of the workspace. The agent's other files (a folder
named like a dataset, a helper module, an edited copy of the test set) are not in it. Paths of the scratch copy in
the evaluator's output are shown as the workspace's own.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...held_out import RowSplit
from ...submissions import SubmissionRejected, SubmissionSchemaError
from ..protocol import AGENT_ERROR, INFRA_ERROR, INVALID_SUBMISSION, non_finite
from . import eval_clock, procs, trees
from .harness_code import harness_command
from .kernel_counts import above_sandbox_fds
from .output import CappedBuffer, normalise
from .quota import DiskQuota
from .submission_check import SubmissionSchema, check_submission

SUPPORTED = ("PythonSubmissionTasks", "CSVSubmissionTasks", "ModelSubmissionTasks")


class EvaluationFailure(Exception):
    """An evaluation that produced no score; ``status`` says whose failure it was (``protocol.EVALUATION_STATUSES``)."""

    status = INVALID_SUBMISSION


class SubmissionNotFoundError(EvaluationFailure):
    """The task's submission artefact is not in the workspace."""


class EvaluationFormatError(EvaluationFailure):
    """The evaluator's output holds no metrics JSON; ``args[0]`` is MLGym's observation text for it."""

    def __init__(self, text: str, status: str = INVALID_SUBMISSION):
        super().__init__(text)
        self.status = status


def submission_failure(exc: SubmissionRejected | SubmissionSchemaError) -> EvaluationFailure:
    """The failure of an evaluation whose submission check raised ``exc``: a broken rule is the agent's
    (``invalid_submission``, the message naming the rule), a check that cannot run is the task's (``infra_error``)."""
    if isinstance(exc, SubmissionRejected):
        return EvaluationFormatError(str(exc), INVALID_SUBMISSION)
    failure = EvaluationFailure(f"the task's submission check cannot run: {exc}")
    failure.status = INFRA_ERROR
    return failure


class EvaluationUnsupported(EvaluationFailure):
    """This backend cannot evaluate the task's kind of submission."""

    status = INFRA_ERROR


class EvaluationTimeout(EvaluationFailure, TimeoutError):
    """The evaluation ran out of time (its processes were killed)."""

    def __init__(self, text: str, status: str = AGENT_ERROR):
        super().__init__(text)
        self.status = status


class InvalidMetrics(EvaluationFailure):
    """The evaluator printed metrics that are not finite numbers (``metrics``): nothing can be scored."""

    def __init__(self, metrics: Any):
        super().__init__(
            f"The evaluation produced metrics that are not finite numbers: {metrics}. A score must be a finite "
            "number, so this submission is invalid."
        )
        self.metrics = metrics


class MetricsPastBest(InvalidMetrics):
    """The evaluator printed a metric past the best value the task declares for it (``best_scores``): the submission
    broke its arithmetic, and nothing is scored."""

    def __init__(self, metrics: Any, message: str):
        EvaluationFailure.__init__(self, message)
        self.metrics = metrics


class WorkspaceTooLarge(EvaluationFailure):
    """The workspace is over the bounds of the copy an evaluation makes of it (bytes of data, files, folder depth,
    the env's disk quota): the submission cannot be evaluated, and the message tells the agent what to do."""

    status = INVALID_SUBMISSION


class WorkspaceUnreadable(EvaluationFailure):
    """Reading or copying the workspace failed: the agent's doing (its files), unless the host was at fault, which
    ``Evaluator`` judges from the host side (``status``)."""

    def __init__(self, text: str, status: str = INVALID_SUBMISSION):
        super().__init__(text)
        self.status = status


DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def format_error(output: str, status: str = INVALID_SUBMISSION) -> EvaluationFormatError:
    """MLGym's evaluation-format error (its text is an observation agents see)."""
    return EvaluationFormatError(
        f"Failed to decode metrics from evaluation script. Output:\n---\n{output}\n---\n"
        "Please make sure the evaluation script prints the metrics in json format.",
        status,
    )


AGENT_CODE_FAILED = ("Evaluation failed: your code raised an exception while the evaluator ran it, so nothing was "
                     "scored.")
"""The opening of the observation for an evaluation whose agent module raised (``agent_code_error``)."""
_AGENT_ERROR_MARK = "AgentCodeError: "


def agent_code_error(output: str, status: str) -> EvaluationFormatError:
    """The evaluation error when the agent's own code raised (a crashed strategy): its traceback, only its own
    frames (the harness's and the evaluator's are left out), and advice that fits; the evaluator's output when the
    harness's report of the agent's error is not in it."""
    _, mark, tail = output.rpartition(_AGENT_ERROR_MARK)
    shown = tail.strip() if mark else output.strip()
    where = "Your code's traceback" if mark else "The evaluator's output"
    return EvaluationFormatError(
        f"{AGENT_CODE_FAILED}\n{where}:\n---\n{shown}\n---\nFix your code where the traceback points (its last "
        "line says what was raised) and validate again.",
        status,
    )


@dataclass
class Started:
    """An evaluation's processes, started before its workspace views are filled: the evaluator (and, for tasks that
    call the agent's code, the process that runs it), each waiting for its go on a pipe. ``end`` kills whatever of
    them runs, closes their pipes and deletes their folder; it is safe to call more than once."""

    scratch: Path
    agent_view: Path
    eval_view: Path
    shown_eval_view: str = ""
    proc: subprocess.Popen | None = None
    runner: subprocess.Popen | None = None
    go: int | None = None  # the evaluator's go pipe (write end)
    runner_go: int | None = None  # the agent's process's
    status_read: int | None = None

    def waiting(self) -> bool:
        """Whether every process is still there, waiting for its go."""
        return (self.go is not None and self.proc is not None and self.proc.poll() is None
                and (self.runner is None or self.runner.poll() is None))

    def go_on(self, argv: list[str], trusted: list[str], trace: bool = False) -> None:
        """Tell the processes to run: the evaluator gets the command line of its script, the trusted modules and
        whether to report the paths it opens (``harness.InputTrace``)."""
        message = (json.dumps({"argv": argv, "trusted": trusted, "trace": trace}) + "\n").encode()
        for fd, data in ((self.runner_go, b"go\n"), (self.go, message)):
            if fd is not None:
                try:
                    os.write(fd, data)
                except OSError:
                    pass  # it died while waiting: the evaluation then reads no output and reports it

    def stop(self) -> None:
        """Kill both processes and everything they started."""
        self._close_go()
        for process in (self.proc, self.runner):
            if process is not None:
                _end(process)

    def read_status(self) -> dict | None:
        """How the script ended, as the harness reported it (after ``stop``)."""
        fd, self.status_read = self.status_read, None
        return _read_status(fd) if fd is not None else None

    def end(self) -> None:
        """Kill everything, close every pipe, delete the views."""
        self.stop()
        if self.status_read is not None:
            os.close(self.status_read)
            self.status_read = None
        _force_rmtree(self.scratch)

    def _close_go(self) -> None:
        for name in ("go", "runner_go"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)


Wrap = Callable[[list[str], Path], list[str]]
"""Turns a command into one that runs sandboxed with a folder shown as the workspace (identity when unsandboxed)."""


@dataclass
class Evaluator:
    """Runs one task's evaluation against a snapshot of the agent's workspace.

    Two views are made: the *agent view* (a copy of the agent's files, with the pristine evaluation and protected
    files put back) for the process that runs the agent's code, and the *evaluation view* for the pristine
    evaluator, which ``harness.py`` runs so that the agent's modules are proxies to the other process. The
    evaluation view is built from the task alone (``task_files``, then ``pristine``, secrets included) plus the
    declared submission (``submission_files``) taken from the agent view: nothing else of the agent's is in it.
    ``wrap`` sandboxes both; ``workspace_path`` is where they see their view (the agent's path too).
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
    task_files: dict[str, Path] = field(default_factory=dict)
    """Workspace-relative path -> the task's own copy of each starter file: the evaluation view holds these, less
    the submission, so that a file the evaluator reads (a helper module, a test set) is the task's, whatever the
    agent made of its copy."""
    submission_files: tuple[str, ...] = ()
    """The workspace paths the evaluator takes from the agent (``submissions.declared_submission``); the submission
    an evaluation finds (a model task's configuration) is added to them."""
    preexec: Callable[[], None] | None = None
    max_output_bytes: int = 400_000
    max_snapshot_bytes: int | None = None  # file data the copy of the workspace may hold (None: unbounded)
    max_snapshot_files: int | None = trees.DEFAULT_MAX_FILES  # files, folders and links it may hold
    _deadline: float | None = field(default=None, init=False, repr=False)  # when the running evaluation times out
    _clock: eval_clock.EvaluationClock | None = field(default=None, init=False, repr=False)  # and its own clock
    extra_env: dict[str, str] = field(default_factory=dict)  # for the evaluator's process only (its seed)
    agent_seed: int | None = None  # seeds ``random`` and numpy where the agent's code runs
    cpu_usage: eval_clock.Sampler | None = None
    """The CPU the evaluation's processes used and waited for so far (``cgroups.Envelope.usage``): its time limit
    then counts only the time it could run (``eval_clock``). None: wall time alone."""
    limit_events: Callable[[], int] | None = None
    """Counts the env's memory and process-limit events so far: one during the evaluation makes a failure the
    agent's (its processes used up what the evaluator needed), never the infrastructure's."""
    last_modules: list[str] = field(default_factory=list)
    """The system modules the last finished evaluation imported (the harness reports them): what to preload."""
    row_split: RowSplit | None = None
    """The episode's split of the answers' rows (``held_out``): an evaluation of one part scores only its rows,
    the answers and the submission filtered alike in its view. None: every evaluation scores every row."""
    metric_check: Callable[[Any], str | None] | None = None
    """Why the printed metrics cannot be a score though finite (``best_scores.past_best_message``), or None."""
    trace_inputs: bool = False
    """Whether the evaluator's process reports what it trusted (``last_trace``): for the checks that an evaluation
    reads only the task's files and the declared submission, and runs nothing of the submission's."""
    last_trace: dict[str, list[str]] = field(default_factory=dict)
    """With ``trace_inputs``: what the last evaluation's evaluator trusted (``harness.InputTrace``): ``opened``,
    the absolute paths it opened or listed, its view named ``shown_workspace``; ``evaluated``, source text it compiled
    that was no file's; ``spawned``, the commands it started; ``unpickled``, the classes it unpickled."""
    agent_modules: frozenset[str] = frozenset()
    """Top-level module names the task gives the agent (its starter code): a failed import of one of them is the
    agent's doing (it removed the module), of any other name a missing package."""
    agent_code_in_process: bool = False
    """The evaluator imports the agent's modules itself (a task that declares ``agent_code_in_evaluator``, run with
    ``trust_agent_code``): no agent process, and nothing the evaluation prints can be trusted."""
    disk_quota: DiskQuota | None = None
    """The env's disk quota: the copy stops at it (the agent's failure), and it tells whose a full disk is."""
    submission_schema: SubmissionSchema | None = None
    """The task's submission schema: the submission in the evaluation's view is checked against it before the
    evaluator runs (``submission_check``); None: no check."""
    agent_side: frozenset[str] = frozenset()
    """Pristine files (keys of ``pristine``) that run on the agent's side (``task_checks.AGENT_SIDE_FILES``): put
    back in both views like the others, but never trusted by the evaluator, whose imports of them are proxies to the
    agent's process (the RL tasks' policy, which loads the agent's network there)."""

    @property
    def shown_workspace(self) -> str:
        """The workspace's path as the agent and its observations name it."""
        return self.workspace_path or str(self.workspace)

    def evaluate(
        self, freeze: Callable[[], AbstractContextManager[None]] | None = None, started: Started | None = None,
        part: str = "submit",
    ) -> tuple[Any, str]:
        """``(metrics, submission_path)``, or an ``EvaluationFailure`` whose ``status`` says whose failure it was.

        ``freeze`` keeps the agent's processes still while the workspace is copied. ``started``: processes this
        evaluator's ``start`` made ahead of time, which this evaluation uses (and ends) if they still wait; without
        them (or when they died), it starts its own. ``part``: ``validate`` or ``submit``, the rows it scores when
        the task's answers are split (``row_split``).
        """
        events = self.limit_events() if self.limit_events is not None else 0
        try:
            metrics, submission = self._evaluate(freeze, started, part)
        except EvaluationFailure as exc:
            if exc.status == INFRA_ERROR and self._limits_hit(events):
                exc.status = AGENT_ERROR
            raise
        except TimeoutError as exc:
            raise EvaluationTimeout(str(exc), self._agent_failure()) from None
        except Exception as exc:  # noqa: BLE001 - an unexpected failure of ours, unless the agent's processes caused it
            failure = EvaluationFailure(f"{type(exc).__name__}: {exc}")
            if self._limits_hit(events):
                failure.status = AGENT_ERROR
            elif isinstance(exc, OSError) and exc.errno in DISK_FULL:
                failure.status = self._disk_full_status()  # e.g. starting the evaluation in a full disk
            else:
                failure.status = INFRA_ERROR
            raise failure from exc
        if non_finite(metrics):
            raise InvalidMetrics(metrics)
        problem = self.metric_check(metrics) if self.metric_check is not None else None
        if problem:
            raise MetricsPastBest(metrics, problem)
        return metrics, submission

    def _limits_hit(self, before: int) -> bool:
        return self.limit_events is not None and self.limit_events() != before

    def _agent_failure(self) -> str:
        """The status of a failure of the evaluation script: the agent's code's when it ran agent code (python and
        model tasks), an invalid submission when it only read the agent's file."""
        return INVALID_SUBMISSION if self.entrypoint == "CSVSubmissionTasks" else AGENT_ERROR

    def _evaluate(
        self, freeze: Callable[[], AbstractContextManager[None]] | None, started: Started | None, part: str
    ) -> tuple[Any, str]:
        if self.entrypoint not in SUPPORTED:
            if started is not None:
                started.end()
            raise EvaluationUnsupported(
                f"the local backend cannot evaluate {self.entrypoint} tasks (it supports "
                f"{', '.join(SUPPORTED)}); run this task with the 'mlgym' backend (MLGym in a container) instead."
            )
        self._deadline = time.monotonic() + self.timeout  # the time limit covers copying the workspace too
        self._clock = eval_clock.EvaluationClock(self._deadline - self.timeout, self.timeout, self.cpu_usage)
        if started is None or not started.waiting():
            if started is not None:
                started.end()
            started = self.start()  # before the copy: the sandboxes and interpreters start while it is made
        try:
            try:
                with freeze() if freeze is not None else contextlib.nullcontext():
                    self._copy_workspace(started.agent_view)
                self._fill_agent_view(started.agent_view)
                submission = self._find_submission(started.agent_view)
                # it reads the agent's file as copied, modes and links kept: one the agent locked, or reached through
                # a link, is the agent's failure too
                try:
                    check_submission(self.submission_schema, started.agent_view, self.pristine)
                except (SubmissionRejected, SubmissionSchemaError) as exc:
                    raise submission_failure(exc) from None
                # a model task's configuration is found anew each time; a Python task's target.py is only the name
                # MLGym gives every Python submission, no file the evaluator takes from the agent
                found = Path(submission).relative_to(self.shown_workspace)
                self._build_evaluation_view(started, found if self.entrypoint == "ModelSubmissionTasks" else None)
                self._keep_rows(started.eval_view, part)
            except OSError as exc:  # reading the agent's files, or writing their copy
                raise self._unreadable(exc) from exc
            script = self.evaluation_paths[0] if self.evaluation_paths else "evaluate.py"
            argv = [script]
            relative_submission = Path(submission).relative_to(self.shown_workspace)
            if self.entrypoint == "CSVSubmissionTasks":
                argv += ["--submission_file", str(relative_submission)]
            elif self.entrypoint == "ModelSubmissionTasks":
                argv += ["--config_fname", str(relative_submission)]
            output, errors, ended = self._run(started, argv)
        finally:
            started.end()
        self.last_modules = [m for m in (ended or {}).get("modules", []) if isinstance(m, str) and m.isidentifier()]
        self.last_trace = self._shown_trace(started, (ended or {}).get("trace"))
        return self._parse(output, errors, ended), submission

    def _copy_workspace(self, agent_view: Path) -> None:
        """Copy the agent's files (less the task's paths, put back after) into ``agent_view``, within the copy's
        bounds and the env's disk quota."""
        budget = trees.CopyBudget(self.max_snapshot_bytes, self.max_snapshot_files, self._deadline)
        if self.disk_quota is None:
            _snapshot(self.workspace, agent_view, skip=set(self.pristine), budget=budget, into_empty=True)
            return
        with self.disk_quota.lock:  # the disk guard walks the workspace at other times only
            try:
                budget.max_disk = self.disk_quota.copy_allowance(self._deadline)
            except trees.TooLarge as exc:
                raise _too_large(exc) from None
            except trees.CopyTimeout:
                raise TimeoutError("the evaluation ran out of time while measuring the workspace") from None
            budget.quota_mb = self.disk_quota.limit_mb
            _snapshot(self.workspace, agent_view, skip=set(self.pristine), budget=budget, into_empty=True)

    def _keep_rows(self, eval_view: Path, part: str) -> None:
        """Leave only ``part``'s rows in the answers and the submission of the evaluation's view (after the
        submission was checked whole against every answer row), each written as a new file: the submission there is
        a hard link to the agent's view."""
        if self.row_split is None:
            return
        for relative in (self.row_split.answers, self.row_split.submission):
            path = eval_view / relative
            data = self.row_split.filtered(path.read_bytes(), part)
            path.unlink()
            path.write_bytes(data)

    def _shown_trace(self, started: Started, trace: Any) -> dict[str, list[str]]:
        """The harness's trace, each kind a list of strings, the evaluation view's folder named as the workspace."""
        if not isinstance(trace, dict):
            return {}
        view = str(started.eval_view) if self.workspace_path is None else ""
        return {str(kind): [item.replace(view, self.shown_workspace) if view else item
                            for item in values if isinstance(item, str)]
                for kind, values in trace.items() if isinstance(values, list)}

    def _fill_agent_view(self, agent_view: Path) -> None:
        """Put the pristine files back into the agent's view, less the secrets."""
        for relative, source in self.pristine.items():
            if relative not in self.secrets:
                _restore(source, agent_view / relative)
        for relative in self.secrets:  # also where a pristine folder put back above holds one
            _remove(agent_view / relative)

    def submitted(self, found: Path | str | None = None) -> list[str]:
        """The workspace paths this evaluation takes from the agent: the declared ones and ``found`` (the submission
        the evaluation found), less the task's pristine files, which the agent never provides."""
        paths = [*self.submission_files, *([str(found)] if found is not None else [])]
        return [p for p in dict.fromkeys(paths) if not _covered(p, self.pristine)]

    def _build_evaluation_view(self, started: Started, found: Path | None) -> None:
        """The evaluation's view, built rather than copied: the task's starter files, the submission from the agent's
        view over them (nothing else of the agent's), then the pristine files and secrets over everything."""
        agent_view, eval_view = started.agent_view, started.eval_view
        submitted = self.submitted(found)
        for relative, source in self.task_files.items():
            if relative not in submitted and not _covered(relative, self.pristine):
                _restore(source, eval_view / relative)
        for relative in submitted:
            source = agent_view / relative
            if os.path.exists(source) and not _through_link(agent_view, relative):
                _remove(eval_view / relative)
                (eval_view / relative).parent.mkdir(parents=True, exist_ok=True)
                _link_item(source, eval_view / relative)
        for relative, source in self.pristine.items():
            _restore(source, eval_view / relative)

    def _find_submission(self, copy: Path) -> str:
        """The submission's path as the agent names it, looked for in ``copy`` (the agent's view: the workspace as
        copied, the task's files put back), never in the live folder, which the agent may have changed or locked
        since."""
        shown = self.shown_workspace
        if self.entrypoint == "PythonSubmissionTasks":
            return f"{shown}/target.py"
        if self.entrypoint == "CSVSubmissionTasks":
            if os.path.isfile(copy / "submission.csv"):
                return f"{shown}/submission.csv"
            raise SubmissionNotFoundError("no submission.csv in the workspace")
        for folder, dirs, files in sorted(os.walk(copy)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".yaml"):
                    return str(Path(shown) / Path(folder, name).relative_to(copy))
        raise SubmissionNotFoundError("no *.yaml configuration in the workspace")

    def _unreadable(self, exc: OSError) -> EvaluationFailure:
        """The failure for an error while reading the agent's files or writing their copy: the agent's (it locked its
        files, linked them in a loop, made names too long), unless the host was at fault, judged from the host side:
        a disk full while the env is within its quota, a failing disk, this process out of descriptors or memory."""
        where = f" ({_shown_path(exc, self.workspace, self.shown_workspace)})" if exc.filename else ""
        if exc.errno in DISK_FULL:
            if self._disk_full_status() != INFRA_ERROR:
                quota = self.disk_quota.limit_mb if self.disk_quota is not None else 0
                return WorkspaceTooLarge(
                    f"The workspace is too large to evaluate: the disk is full and this environment's files take more "
                    f"than its disk quota of {quota} MB. An evaluation copies the workspace first; delete what it does "
                    "not need (checkpoints, caches, copies of data) and try again.")
            return WorkspaceUnreadable(f"the host's disk is full while this environment is within its disk quota: "
                                       f"{exc.strerror}{where}", INFRA_ERROR)
        if exc.errno in trees.HOST_ERRNOS:
            return WorkspaceUnreadable(f"copying the workspace failed on the host: {exc.strerror}{where}", INFRA_ERROR)
        return WorkspaceUnreadable(
            f"The workspace could not be read for the evaluation: {exc.strerror or exc}{where}. The evaluation reads "
            "every file of the workspace as it is; give your files and folders back their permissions (e.g. chmod "
            "-R u+rwX .), remove links that loop, and try again.")

    def _disk_full_status(self) -> str:
        """Whose failure a write that found the disk full was: the agent's when the env takes more than its disk
        quota (its files filled the disk), else the host's (someone else filled it, or it is smaller than the envs'
        quotas need). Without a quota, always the host's."""
        if self.disk_quota is not None and self.disk_quota.exceeded():
            return INVALID_SUBMISSION
        return INFRA_ERROR

    def _parse(self, output: str, errors: str, ended: dict | None) -> Any:
        """The metrics the evaluator printed on its standard output (``output``: what it wrote to standard error,
        ``errors``, a library's warning or progress bar, is never read as metrics); without them, a format error
        showing both, whose status comes from how the evaluation script ended (``ended``: the harness's report,
        None when it never reported)."""
        shown = f"{output}\n{errors}" if output and errors else output or errors
        if (ended or {}).get("status") == "agent_code" and not self.agent_code_in_process:
            raise agent_code_error(shown, self._failure_status(ended))
        if self.entrypoint == "ModelSubmissionTasks":
            line = next((ln for ln in output.split("\n") if ln.strip().startswith("{")), None)
            if line is None:
                raise format_error(shown, self._failure_status(ended))
            text = line
        else:
            text = output
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise format_error(shown, self._failure_status(ended)) from None

    def _failure_status(self, ended: dict | None) -> str:
        """Whose failure an evaluation that printed no metrics was."""
        if self.agent_code_in_process:
            return AGENT_ERROR  # the agent's code ran in the evaluator's own process: nothing it reports is trusted
        how = (ended or {}).get("status")
        if how is None:
            return INFRA_ERROR  # the harness never reported: the sandbox or the harness failed to run
        if how == "finished":
            # the pristine script exited cleanly without metrics: for a file it reads, that file is to blame
            return INVALID_SUBMISSION if self.entrypoint == "CSVSubmissionTasks" else INFRA_ERROR
        if how == "missing_module" and str(ended.get("name", "")) not in self.agent_modules:  # type: ignore[union-attr]
            return INFRA_ERROR
        return self._agent_failure()

    def _trusted_modules(self) -> list[str]:
        """The top-level modules the task's own files define (``x.py``, or ``pkg/`` for a package), less the
        submission and the agent-side files: the evaluator imports these files, never the agent's of the same name."""
        paths = set()
        submitted = set(self.submitted())
        own = {**{k: v for k, v in self.task_files.items() if k not in submitted}, **self.pristine}
        for relative, source in own.items():
            if relative in self.agent_side:
                continue
            first, _, rest = relative.partition("/")
            if not rest and first.endswith(".py"):
                paths.add(first)
            elif not rest and Path(source).is_dir() and (Path(source) / "__init__.py").is_file():
                paths.add(first + "/")
        return sorted(paths)

    def start(self, preload: list[str] | tuple[str, ...] = ()) -> Started:
        """Start this evaluation's processes ahead of its workspace: each in its sandbox, showing an empty view that
        the evaluation fills, waiting for its go (``harness.py --go-fd``). The evaluator's first imports the modules
        ``preload`` names, from the system folders only (the view is empty), as the previous evaluation did: an
        evaluation that imports numpy no longer waits for it. ``evaluate(started=...)`` uses them."""
        scratch = Path(tempfile.mkdtemp(prefix="eval-", dir=self.scratch_root))
        agent_view, eval_view = scratch / "agent", scratch / "eval"
        agent_view.mkdir()
        eval_view.mkdir()
        started = Started(scratch, agent_view, eval_view)
        try:
            self._launch(started, list(preload))
        except BaseException:
            started.end()
            raise
        return started

    def _launch(self, started: Started, preload: list[str]) -> None:
        wrap = self.wrap or (lambda command, _view: command)
        sandboxed = self.workspace_path is not None  # each view is then shown at the agent's workspace path

        def inside(view: Path) -> str:
            return self.workspace_path if sandboxed else str(view)  # type: ignore[return-value]

        started.shown_eval_view = inside(started.eval_view)
        harness = harness_path(sandboxed=sandboxed)
        agent_env = {**self.env, "PYTHONDONTWRITEBYTECODE": "1"}
        env = {**agent_env, **self.extra_env}  # the evaluator's own: what it holds never reaches the agent's code
        seed_option = ["--seed", str(self.agent_seed)] if self.agent_seed is not None else []
        isolate = not self.agent_code_in_process
        fds: tuple[int, ...] = ()
        if isolate:
            # the channel (see harness.Link): a sealed shared memory region, and a doorbell pipe into each process
            memory = above_sandbox_fds(channel_memory())
            agent_wake, ring_agent = os.pipe()
            evaluator_wake, ring_evaluator = os.pipe()
            evaluator_wake, ring_agent = above_sandbox_fds(evaluator_wake), above_sandbox_fds(ring_agent)
            runner_go, started.runner_go = os.pipe()
            runner_go = above_sandbox_fds(runner_go)
            runner_start, runner_code = harness_command(self.python, harness)
            try:
                started.runner = subprocess.Popen(
                    wrap([*runner_start, "serve", "--workspace", inside(started.agent_view),
                          "--memory-fd", str(memory), "--go-fd", str(runner_go), *seed_option], started.agent_view),
                    stdin=agent_wake, stdout=ring_evaluator, stderr=subprocess.DEVNULL, cwd=str(started.agent_view),
                    env=agent_env, start_new_session=True, preexec_fn=self.preexec,
                    pass_fds=(memory, runner_go, *runner_code),
                )
            except BaseException:
                for fd in (memory, evaluator_wake, ring_agent):
                    os.close(fd)
                raise
            finally:
                for fd in (agent_wake, ring_evaluator, runner_go, *runner_code):
                    os.close(fd)
            fds = (memory, evaluator_wake, ring_agent)
        # how the script ended comes back on a pipe of its own (the agent's code, in the other process, cannot
        # reach it); model tasks run the agent's code in the evaluator's process, so they get none
        status_write = None
        if isolate:
            started.status_read, status_write = os.pipe()
            status_write = above_sandbox_fds(status_write)
            with contextlib.suppress(OSError):  # room for a traced report, read only once the process has ended
                import fcntl

                fcntl.fcntl(status_write, fcntl.F_SETPIPE_SZ, 1 << 20)
        go, started.go = os.pipe()
        go = above_sandbox_fds(go)
        status_option = ["--status-fd", str(status_write)] if status_write is not None else []
        preload_option = ["--preload", ",".join(preload)] if preload else []
        evaluator_start, evaluator_code = harness_command(self.python, harness)
        command = [*evaluator_start, "evaluate", "--workspace", inside(started.eval_view),
                   "--fds", ",".join(map(str, fds)) or ",", "--go-fd", str(go), *status_option, *preload_option]
        passed = (*fds, go, *((status_write,) if status_write is not None else ()), *evaluator_code)
        try:
            started.proc = subprocess.Popen(
                wrap(command, started.eval_view), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=str(started.eval_view), env=env, start_new_session=True,
                preexec_fn=self.preexec, pass_fds=passed,
            )
        finally:
            for fd in passed:
                os.close(fd)

    def _run(self, started: Started, argv: list[str]) -> tuple[str, str, dict | None]:
        """Let the started processes go on ``argv`` (the script, relative to the workspace, and its arguments); the
        evaluator's standard output and error, and how the script ended as the harness reported it (None when it did
        not)."""
        started.go_on([f"{started.shown_eval_view}/{argv[0]}", *argv[1:]], self._trusted_modules(), self.trace_inputs)
        try:
            output, errors = self._collect(started.proc, started.runner)
        finally:
            started.stop()
        ended = started.read_status()
        if self.workspace_path is None:
            output, errors = (text.replace(str(started.eval_view), self.shown_workspace).replace(
                str(started.agent_view), self.shown_workspace) for text in (output, errors))  # the agent's own frames
        return output, errors, ended

    def _collect(self, proc: subprocess.Popen, runner: subprocess.Popen | None = None) -> tuple[str, str]:
        """The evaluator's standard output and error, each capped, once it has closed both and ended."""
        buffers = {pipe.fileno(): CappedBuffer(self.max_output_bytes)
                   for pipe in (proc.stdout, proc.stderr) if pipe is not None}
        fds = list(buffers)
        clock = self._clock or eval_clock.EvaluationClock(time.monotonic(), self.timeout, self.cpu_usage)
        clock.roots = frozenset(p.pid for p in (proc, runner) if p is not None)
        while fds and (left := clock.left()) > 0:
            ready, _, _ = select.select(fds, [], [], left)
            for fd in ready:
                data = os.read(fd, 1 << 16)
                if data:
                    buffers[fd].add(data)
                else:
                    fds.remove(fd)
        while (left := clock.left()) > 0:
            try:
                proc.wait(timeout=max(left, 0.1))
                output, errors = (normalise(buffer.contents()) for buffer in buffers.values())
                return output, errors
            except subprocess.TimeoutExpired:  # it closed its output but kept running
                pass
        if clock.starved():
            raise EvaluationTimeout(clock.starved_message(), INFRA_ERROR)
        raise TimeoutError(f"the evaluation did not finish within {_seconds(self.timeout)} seconds")


CHANNEL_BYTES = 4 << 20
"""The shared memory between the evaluator and the agent's process: a header and an area each way (a longer message
crosses in chunks)."""


def channel_memory(size: int = CHANNEL_BYTES) -> int:
    """A memfd of ``size`` bytes for the evaluator's channel, sealed so that neither process can shrink it (which
    would make the other's next access to it a fatal SIGBUS) nor grow it."""
    import fcntl

    fd = os.memfd_create("mlgym-registry-channel", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


MAX_STATUS_BYTES = 4 << 20
"""The most of the harness's report that is read (a traced evaluation lists the paths it opened)."""


def _read_status(fd: int) -> dict | None:
    """The harness's one-line report from the status pipe (its writer is closed: the process has ended)."""
    data = b""
    try:
        os.set_blocking(fd, False)
        while len(data) < MAX_STATUS_BYTES and (chunk := os.read(fd, 1 << 16)):
            data += chunk
    except OSError:
        pass
    finally:
        os.close(fd)
    try:
        report = json.loads(data.split(b"\n", 1)[0] or b"null")
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def harness_path(*, sandboxed: bool) -> str:
    """Where the evaluation harness is, as the evaluator's process sees it."""
    from .sandbox import HARNESS_MOUNT

    return f"{HARNESS_MOUNT}/harness.py" if sandboxed else str(HARNESS_DIR / "harness.py")


HARNESS_DIR = Path(__file__).parent / "harness"


def _end(proc: subprocess.Popen) -> None:
    """Kill a process and everything it started; close its pipes."""
    procs.end_session(proc.pid, lambda: proc.poll() is None)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _snapshot(
    source: Path, target: Path, skip: set[str], budget: trees.CopyBudget | None = None, *, into_empty: bool = False
) -> None:
    """Copy the workspace into ``target``, leaving out ``skip`` paths, without ever following a link of the agent's.

    The copy runs as the driver's user (often root) over a folder the agent controls: see ``trees.copy_tree`` (names
    opened relative to their folder with ``O_NOFOLLOW``, links resolved only inside the copy, holes kept as holes).
    It is bounded by ``budget``: over its bytes, files or depth the submission cannot be evaluated
    (``WorkspaceTooLarge``), past its deadline the evaluation has run out of time (``TimeoutError``).
    """
    budget = budget if budget is not None else trees.CopyBudget()
    try:
        trees.copy_tree(source, target, skip, budget, into_empty=into_empty)
    except trees.TooLarge as exc:
        raise _too_large(exc) from None
    except trees.CopyTimeout:
        raise TimeoutError("the evaluation ran out of time while copying the workspace") from None


def _too_large(exc: trees.TooLarge) -> WorkspaceTooLarge:
    return WorkspaceTooLarge(
        f"The workspace is too large to evaluate: {exc}. An evaluation copies the workspace first; delete what it "
        "does not need (checkpoints, caches, copies of data) and try again."
    )


def _shown_path(exc: OSError, workspace: Path, shown: str) -> str:
    """The path an error names, as the agent sees it (the workspace's host folder replaced by its own name)."""
    return str(exc.filename).replace(str(workspace), shown)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _link_tree(source: Path, target: Path) -> None:
    """Copy a tree using hard links where the file system allows them (``_link_file``)."""
    shutil.copytree(source, target, symlinks=True, copy_function=_link_file, dirs_exist_ok=True)


def _covered(relative: str, paths: dict[str, Path]) -> bool:
    """Whether the workspace path ``relative`` is one of ``paths``' keys or inside one of them."""
    return any(relative == key or relative.startswith(key.rstrip("/") + "/") for key in paths)


def _through_link(view: Path, relative: str) -> bool:
    """Whether a folder above ``relative`` in ``view`` is a link: the submission is taken only from its own place."""
    parts = Path(relative).parts[:-1]
    return any((view / Path(*parts[:depth])).is_symlink() for depth in range(1, len(parts) + 1))


def _link_item(source: Path, target: Path) -> None:
    """Put the agent's ``source`` (a file or folder of its view) at ``target`` with no link in it: a link is
    followed, and can only reach the agent's view, where the copy left links (``trees.copy_tree``); as a link in the
    evaluation's view it could reach the secrets put back there."""
    if source.is_dir():
        shutil.copytree(source, target, symlinks=False, copy_function=_link_file)
    elif source.exists():
        _link_file(str(source), str(target))


def _link_file(src: str, dst: str) -> None:
    """A hard link where the file system allows one (fast, no extra space), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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


def _force_rmtree(path: Path) -> bool:
    """``rm -rf``, also through folders made read-only and at any depth (``trees.remove_tree``); True when gone."""
    return trees.remove_tree(path)


force_rmtree = _force_rmtree
