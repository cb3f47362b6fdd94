"""``LocalBackend``: MLGym's environment contract on this machine, without containers.

The order of operations in ``step`` and every observation text an agent can rely on follow MLGym's ``MLGymEnv``
(see ``backends/protocol.py``). The rest lives in the sibling modules: the shell session (``session.py``), what an
action is (``actions.py``), the observation texts (``observations.py``), the workspace's files (``workspace.py``),
what the env's processes see and may do (``confinement.py``, ``sandbox.py``, ``limits.py``), what it must release
(``resources.py``), evaluation (``evaluation.py``) and the checks at ``make`` (``task_checks.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import held_out, seeding
from ...errors import BackendUnavailable
from ...preparation import hub_datasets as hub_datasets_mod
from ...specs import TaskSpec
from ...tool_language import AUTOSUBMIT_EXITS
from ..protocol import EVALUATION_OK, EVALUATION_STATUS_KEY, INFRA_ERROR, ToolSet, new_info
from . import actions, disk_guard, forking, layers, observations, procs, task_checks, toolset
from . import limits as limits_mod
from . import quota as quota_mod
from . import sandbox as sandbox_mod
from .confinement import Confinement, quote
from .evaluation import EvaluationFailure, Evaluator, Started
from .observations import CommandTimeout, Outcome
from .options import LOCAL_OPTION_RULES
from .output import cap
from .resources import ROOT_PREFIX, Folders, Resources, hold_owner_lock, sweep_orphans
from .session import Result, ShellSession
from .workspace import WorkspaceFiles

SHORT_TIMEOUT = 25.0
LONG_TIMEOUT = 3600
DEFAULT_MEMORY_MB = 4096
DEFAULT_FILE_MB = 4096
SNAPSHOT_FILE_MULTIPLE = 4
"""``max_snapshot_mb`` defaults to this many times ``max_file_mb``: four files of the largest size a command may
write (16 GB by default), far more than a workspace needs, but not the whole disk."""


@dataclass
class LocalTask:
    """What ``backend.task`` is after ``reset()``: ``args`` is the task's spec with MLGym's set-up filled in."""

    args: TaskSpec


class LocalBackend:
    """An MLGym-compatible environment in a temporary workspace on this machine.

    One persistent ``bash`` per episode (stderr merged), MLGym's tool language, step counting, special actions,
    output normalisation and validate/submit evaluation. Everything the agent runs, and the agent's code that an
    evaluation runs, is in a bubblewrap sandbox (``sandbox.py``): own namespaces, the host read-only and mostly
    hidden, the workspace at ``/home/agent/workspace`` as the only writable place. Scores come from the pristine
    evaluator with the agent's code in another process (``evaluation.py``). Per-command timeouts kill the command's
    whole process tree; output, memory, process and file-size limits; nothing left running or on disk after
    ``close()`` (also on garbage collection, interpreter exit, or the owner's death).

    Parameters: ``command_timeout`` (seconds for ordinary commands), ``long_timeout`` (for commands that run a
    training program: ``python``, ``torchrun``, ...; default the task's ``training_timeout`` or 3600),
    ``max_output_chars`` (cap on one observation), ``memory_limit_mb`` (memory of the whole env when a memory cgroup
    can be made, else address space per process; default 4096), ``cpu_seconds`` (CPU time per process),
    ``max_processes`` (tasks alive at once in the session), ``max_file_mb`` (largest file a command may write; default
    4096), ``max_snapshot_mb`` (most file data the copy of the workspace an evaluation makes may hold, holes of sparse
    files not counted; default four times ``max_file_mb``; a bigger workspace fails to evaluate), ``max_disk_mb``
    (the env's disk quota: what the agent's files in the workspace and the copy an evaluation makes of them may take
    together, the task's own files as given not counted; default ``2 * max_file_mb + 2048``; see ``quota.py``),
    ``network``
    (allow network access), ``seed`` (starts the episodes' seed stream, as ``reset(seed=...)``; see
    ``reset``),
    ``workspace_dir`` (folder to create the private temporary folder in), ``python`` (the interpreter the agent's
    shell and the evaluator use, e.g. a virtual environment with the task's packages, as MLGym's conda environment
    would have them; default the task's: see ``task_python``), ``sandbox`` (``"bwrap"``, the default, or ``"none"`` to
    run unsandboxed: unsafe, for trusted policies only), ``data_dir`` (a folder, or several separated by ``os.pathsep``,
    searched first for the task's local datasets; see ``mlgym_registry.preparation.datasets``), ``gpus`` (show the
    host's NVIDIA devices and driver libraries to the sandbox; see ``sandbox.gpu_devices``), ``trust_agent_code``
    (run a task whose evaluator imports the agent's code into its own process, ``agent_code_in_evaluator``: its
    scores can be forged), ``validation_rows`` (``"held_out"``, the default: validate and submit score disjoint rows of
    a task whose metric is a mean over rows, see ``mlgym_registry.held_out``; ``"all"``: both score every row, as
    MLGym does, to reproduce its published numbers).
    """

    option_rules = LOCAL_OPTION_RULES
    """The rules of these parameters, which ``registry.make`` checks before the backend is built (``options.py``)."""

    name = "mlgym_main"

    def __init__(
        self,
        spec: TaskSpec,
        *,
        command_timeout: float = SHORT_TIMEOUT,
        long_timeout: float | None = None,
        max_output_chars: int = 100_000,
        memory_limit_mb: int | None = DEFAULT_MEMORY_MB,
        cpu_seconds: int | None = None,
        max_processes: int | None = 1024,
        max_file_mb: int | None = DEFAULT_FILE_MB,
        max_snapshot_mb: int | None = None,
        max_disk_mb: int | None = None,
        network: bool = False,
        seed: int | None = None,
        workspace_dir: str | None = None,
        python: str | None = None,
        sandbox: str = "bwrap",
        data_dir: str | None = None,
        gpus: bool = False,
        trust_agent_code: bool = False,
        validation_rows: str = "held_out",
    ):
        self.options: dict[str, Any] = {k: v for k, v in locals().items() if k not in ("self", "spec")}
        """The keyword arguments this backend was made with: a fork's children are made with the same."""
        if sandbox not in sandbox_mod.SANDBOX_MODES:
            raise ValueError(f"local backend: sandbox={sandbox!r}; use one of {', '.join(sandbox_mod.SANDBOX_MODES)}")
        self.check_available(sandbox=sandbox)
        self.sandboxed = sandbox == "bwrap"
        self.python = task_checks.interpreter(python, spec)
        self.spec = spec
        self.command_timeout = command_timeout
        self.long_timeout = long_timeout if long_timeout is not None else (spec.training_timeout or LONG_TIMEOUT)
        self.max_output_chars = max_output_chars
        self.limits = limits_mod.Limits(memory_limit_mb, cpu_seconds, max_processes)
        self.max_file_mb = max_file_mb
        self.max_snapshot_mb = max_snapshot_mb if max_snapshot_mb is not None else SNAPSHOT_FILE_MULTIPLE * (
            max_file_mb or DEFAULT_FILE_MB)
        self.max_disk_mb = max_disk_mb if max_disk_mb is not None else quota_mod.default_disk_mb(
            max_file_mb, DEFAULT_FILE_MB)
        self.network = network
        self.data_dir = data_dir
        self.gpus = gpus
        self.trust_agent_code = trust_agent_code
        held_out.row_split(spec, 0, validation_rows)  # a ValueError naming the values, at make
        self.validation_rows = validation_rows
        task_checks.refuse_untrusted_evaluator(spec, trust_agent_code)
        if gpus:
            task_checks.refuse_missing_gpus()
        task_checks.refuse_unservable(spec, data_dir)
        hub_views = hub_datasets_mod.hub_views(spec, self.python, data_dir)  # written now unless prepare did
        self.seed = seed
        """The user's seed of the current stream of episodes (None: every episode draws fresh randomness)."""
        self.episode = -1
        """The current episode's index in the stream of ``seed`` (0 after ``reset(seed=...)``)."""
        self._episode_seeds: seeding.EpisodeSeeds | None = None
        self.max_steps = spec.max_steps
        self.current_step = 0
        self.returncode: int | None = None
        self.task: LocalTask | None = None
        self.tools: ToolSet | None = None
        self.notes: list[str] = []

        sweep_orphans(Path(workspace_dir or tempfile.gettempdir()))
        layers.sweep_layers(Path(workspace_dir or tempfile.gettempdir()))
        root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX, dir=workspace_dir))
        self._res = Resources(root)
        self._res.owner_lock = hold_owner_lock(root)
        self._finalizer = weakref.finalize(self, self._res.release)
        folders = Folders.make(root)
        self.host_workspace = folders.workspace
        """The workspace's folder on this machine (what the driver reads and writes)."""
        self._commands = folders.commands
        self._files = WorkspaceFiles(spec, folders.workspace, folders.pristine, data_dir)
        self._disk = quota_mod.DiskQuota(self.max_disk_mb << 20, folders.workspace,
                                         outside=[folders.root / "hf-datasets"] if hub_views else [])
        self._stop_over_quota = functools.partial(_stop_processes, self._res)
        disk_guard.watch(self._disk, self._stop_over_quota)
        self._added: list[dict[str, str]] = []
        self._scores: list[Any] = []

        prefix: tuple[str, ...] = ()
        if not network and not self.sandboxed:
            isolation = limits_mod.network_isolation_prefix()
            if isolation is None:
                limits_mod.warn_no_network_isolation()
                self.notes.append(limits_mod.NO_NETWORK_ISOLATION)
            else:
                prefix = isolation
        nproc = self._res.make_cgroups(self.limits, self.notes)
        bash = "/bin/bash" if os.path.exists("/bin/bash") else (shutil.which("bash") or "bash")
        self._confinement = Confinement(
            spec, python=self.python, sandboxed=self.sandboxed, network=network, gpus=gpus, limits=self.limits,
            max_file_mb=max_file_mb, bash=bash, prefix=prefix, nproc=nproc, resources=self._res, folders=folders,
            files=self._files, hub_views=hub_views, models=task_checks.needs(spec, "models"),
            hub_cache_dir=task_checks.hub_cache(),
        )
        self.task_workspace = self._confinement.task_workspace
        """The workspace as the agent sees it (MLGym's ``/home/agent/workspace`` when sandboxed)."""
        self._warm_shells = self.sandboxed and self._res.make_spare_cgroups(self.limits)
        """Whether each reset starts the next episode's shell ahead (sandboxed only: see ``reset``)."""
        self._preload: list[str] = []
        """The system modules the task's last finished evaluation imported: the next one's evaluator preloads them."""
        self.trace_evaluations = False
        """Set by trusted tooling (the tests, the integrity audit): each evaluation's evaluator reports what it
        trusted, kept in ``last_evaluation_trace``. Never set by anything the agent controls."""
        self.last_evaluation_trace: dict[str, list[str]] = {}
        """What the last evaluation's evaluator trusted (with ``trace_evaluations``; ``Evaluator.last_trace``): the
        paths it opened or listed (``opened``, the workspace named as the agent sees it, the interpreter's own files
        left out), the strings it compiled, the commands it started, the classes it unpickled."""

    @staticmethod
    def check_available(*, sandbox: str = "bwrap", gpus: bool = False, **_options: Any) -> None:
        """Raise ``BackendUnavailable`` now (at ``make``) when this host cannot run the chosen sandbox or has no GPUs
        to show; warn once when there is to be no sandbox."""
        if gpus:
            task_checks.refuse_missing_gpus()
        if sandbox == "none":
            sandbox_mod.warn_unsandboxed()
        elif sandbox == "bwrap":
            try:
                sandbox_mod.check()
            except sandbox_mod.SandboxUnavailable as exc:
                raise BackendUnavailable(f"local backend: {exc}") from None

    @staticmethod
    def check_task(spec: TaskSpec, *, data_dir: str | None = None, python: str | None = None,
                   trust_agent_code: bool = False, **_options: Any) -> None:
        """Raise now (at ``make``) the first of ``task_checks.blockers``: its evaluator would run the agent's code
        in-process untrusted, the packages it needs are nowhere (``MissingTaskPackages``; before the data, as
        ``prepare`` makes both), it needs a device this host lacks, or its data or models are missing or unservable."""
        found = task_checks.blockers(spec, data_dir=data_dir, python=python, trust_agent_code=trust_agent_code)
        if found:
            raise found[0].error

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Fresh workspace (starter code, read-only data) and fresh shell; returns ``({"observation": None}, {})``.

        Seeds follow Gymnasium: ``reset(seed=s)`` starts the stream of ``s`` at episode 0, and each later reset without
        a seed plays the stream's next episode (the constructor's ``seed`` starts a stream too). An episode's evaluator
        seed is derived from the user's seed, the episode's index and this installation's key (``seeding.py``); it
        reaches the evaluator's process only, and stays the same for every evaluation of the episode. Without a seed,
        every episode draws fresh randomness. ``options={"evaluation_seed": s}`` sets the evaluator's seed itself
        (and the agent process's, unless ``"agent_seed"`` is given too), for tools that score starter code under
        chosen seeds (``mlgym_registry.testing.run_evaluator``); it comes from the trainer, never from the agent.
        """
        if self._finalizer.alive is False:
            raise RuntimeError("this LocalBackend was closed; make a new one")
        if seed is not None:
            self.seed, self.episode = seed, -1
        self.episode += 1
        self._episode_seeds = seeding.EpisodeSeeds.draw(self.seed, self.episode)
        options = options or {}
        if options.get("evaluation_seed") is not None:  # trusted tooling (check, baselines) scoring under chosen seeds
            self._episode_seeds = seeding.EpisodeSeeds(
                int(options["evaluation_seed"]), int(options.get("agent_seed", options["evaluation_seed"])))
        self._res.stop_evaluation()  # it holds the last episode's seed
        self._res.stop_session()
        if self._res.view is not None:  # a forked env's episode ends: its next one is a plain workspace again
            forking.drop_view(self)
        self.current_step = 0
        self.returncode = None
        self._scores = []
        with self._disk.lock:  # the disk guard must not walk the workspace while it is emptied and filled
            self._files.prepare()
            self._confinement.reset_hub_caches()
            self._disk.record_task_files(list(self._files.pristine))
        self._disk.exceeded_seen, self._disk.stopped_at = False, 0
        self.task = LocalTask(args=self._task_args())
        if not self._take_warm_shell():
            self._start_session()
        if self._warm_shells:
            self._res.start_warm(self.host_workspace, self._new_session)
        return {"observation": None}, {}

    def _take_warm_shell(self) -> bool:
        """Make the warm shell (``Resources.start_warm``) the session and set it up; False when there is none to take
        or its set-up failed."""
        warm = self._res.take_warm(self.host_workspace)
        if warm is None:
            return False
        try:
            self._set_up(warm)
        except RuntimeError:
            self._res.stop_session()  # started in the sandbox but failed its set-up: a new one is started the usual way
            return False
        return True

    def fork(self, n: int = 1) -> list[LocalBackend]:
        """``n`` independent backends in exactly this one's state (``forking.fork``: the workspace's files shared
        copy-on-write, the shell's working directory and exported variables, the step count, the scores and the
        episode's seeds); refused (``forking.ForkRefused``) while the agent's background processes run."""
        return forking.fork(self, n)

    def fork_point(self) -> forking.ForkPoint:
        """This backend's state as a picklable ``forking.ForkPoint`` whose ``make()`` makes a child in this process or
        another (a multiprocessing pool's worker) while the point is open; close it once its children are made."""
        return forking.fork_point(self)

    def prepare_forks(self, n: int, *, wait: bool = False) -> int:
        """Make ``n`` children ahead, in the background (``spares.py``), so that the next ``fork(n)`` takes them
        instead of building and starting them: what a fork after a fork does by itself (it keeps as many as it
        made). ``wait``: return once they are made. How many are ready. Each holds a sandbox and a shell, idle,
        until a fork takes it or this backend closes."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"prepare_forks(n): n must be a non-negative integer, got {n!r}")
        forking.keep_spares(self, n)
        spares = self._res.spares
        if spares is None:
            return 0
        return spares.wait() if wait else spares.wait(0)

    def use_workspace(self, path: Path) -> None:
        """Make ``path`` the workspace as the driver reads and writes it (a forked env's copy-on-write view, or its
        plain folder again), for every part of the backend that walks or copies it."""
        self.host_workspace = path
        self._confinement.folders = dataclasses.replace(self._confinement.folders, workspace=path)
        self._files.workspace = path
        self._disk.workspace = path

    def reset_container(self) -> None:
        """TorchRL's MLGym wrapper calls this before ``reset()``: a fresh shell in the same workspace."""
        self._res.stop_session()
        self._start_session()

    def close(self) -> None:
        """Kill every process of the backend and delete its folder. Safe to call more than once."""
        disk_guard.unwatch(self._disk)
        with self._disk.lock:  # a walk of the disk guard's under way ends first
            self._finalizer()

    # -- tools -----------------------------------------------------------------------------------------------------
    def install_tools(self) -> ToolSet:
        """Define ``state``, the tool commands and their variables in the session; return their ``ToolSet``."""
        self.tools = toolset.tool_set()
        self._run_setup(self._confinement.tools_script())
        return self.tools

    def add_commands(self, commands: list[dict[str, str]]) -> None:
        """Install command files (``{name, contents, type}``; type ``source_file``, ``script`` or ``utility``)."""
        for command in commands:
            if command.get("type") not in ("source_file", "script", "utility"):
                raise ValueError(
                    f"command {command.get('name')!r} has type {command.get('type')!r}; "
                    "use 'source_file', 'script' or 'utility'"
                )
        for command in commands:
            path = self._commands / command["name"]
            path.write_text(command["contents"])
            if command["type"] == "script":
                path.chmod(0o755)
            self._added.append(dict(command))
            if command["type"] == "source_file":
                self._run_setup(self._confinement.source_command(command["name"]))

    # -- running commands ------------------------------------------------------------------------------------------
    def communicate(
        self,
        input: str,
        timeout_duration: float = 25,
        no_output_timeout_duration: float | None = None,
        *,
        set_last_action: bool = False,
    ) -> str:
        """Run ``input`` in the session and return its normalised output; sets ``returncode``.

        ``exit`` ends the session (the next command starts a new one). A bash syntax error is returned as the output
        (the command is not run). Raises ``CommandTimeout`` when the command runs out of time (its processes are
        killed first, so the session stays usable).
        """
        input = actions.LONE_SURROGATE.sub("\ufffd", input)
        if input.strip() == "exit":
            self._res.stop_session()
            self.returncode = 0
            return ""
        if self._res.session is None or not self._res.session.alive:
            self._start_session()
        syntax = actions.syntax_error(input, bash=self._confinement.bash, timeout=self.command_timeout)
        if syntax is not None:
            self.returncode, text = syntax
            return cap(text, self.max_output_chars)
        session = self._res.session
        assert session is not None
        after = f"export LAST_ACTION={quote(input.strip())}" if set_last_action else ""
        quiet = no_output_timeout_duration if no_output_timeout_duration is not None else timeout_duration
        result = session.run(input, timeout_duration, quiet, after=after)
        if disk_guard.enforce(self._disk, self._stop_over_quota, periodic=False):
            self._res.stop_session()  # over its quota when the command ended: the next command gets a new shell
        output = cap(result.output, self.max_output_chars)
        if result.timed_out:
            note = result.starved_note
            if result.marker_lost or result.shell_died:
                restart = self._restart(result, "did not return after its command was stopped")
                note = f"{note}\n{restart}" if note else restart
            self.returncode = result.returncode
            seconds = timeout_duration if result.timed_out == "total" else quiet
            raise CommandTimeout(result.timed_out, seconds, output, note)
        if result.shell_died:
            note = self._restart(result, "exited")
            self.returncode = result.returncode
            return self._disk_note(f"{output}\n{note}" if output else note)
        self.returncode = result.returncode
        return self._disk_note(self._res.after_command(output, self.limits))

    def _disk_note(self, output: str) -> str:
        """``output``, with a note when the disk guard stopped the env's processes since the last one."""
        if not self._disk.exceeded_seen:
            return output
        self._disk.exceeded_seen = False
        note = disk_guard.NOTE_OVER_QUOTA.format(mb=self.max_disk_mb)
        return f"{output}\n{note}" if output else note

    def step(self, action: str) -> tuple[str | None, float, bool, dict[str, Any]]:
        """One agent action, in MLGym's order: count, autosubmit past ``max_steps``, special actions, run, markers."""
        info = new_info()
        info["score"] = list(self._scores)
        self.current_step += 1
        if self.current_step > self.max_steps:
            return self._evaluate(info, "max_steps")
        action = action.strip()
        if action == "skip":
            info["exit_status"] = "skipped"
            return "Skipped", 0, True, info
        if action == "exit_forfeit":
            info["exit_status"] = "exit_forfeit"
            return "Exited (exit_forfeit)", 0, True, info
        if action in AUTOSUBMIT_EXITS:
            return self._evaluate(info, action)
        if actions.EDIT_PATTERN.match(action) and "end_of_edit" not in action:
            return observations.MALFORMED_EDIT, 0, False, info
        if actions.INSERT_PATTERN.match(action) and "end_of_insert" not in action:
            return observations.MALFORMED_INSERT, 0, False, info

        timeout = self.long_timeout if actions.runs_training(action) else self.command_timeout
        try:
            observation = self.communicate(action, timeout, self.long_timeout, set_last_action=True)
        except CommandTimeout as exc:
            observation = observations.timed_out(exc)
        if action == "exit":
            self._start_session()
            observation = observations.restart_note("ended with the exit command", None, self.task_workspace)

        if actions.has_marker(observation, "VALIDATION"):
            return self._evaluate(info, "validate")
        if actions.has_marker(observation, "SUBMISSION"):
            return self._evaluate(info, "submit")
        return observation, 0, False, info

    # -- evaluation ------------------------------------------------------------------------------------------------
    def _evaluate(self, info: dict[str, Any], action: str) -> Outcome:
        """MLGym's outcomes table for validate, submit and autosubmission."""
        assert self.task is not None, "call reset() before step()"
        evaluator = self._evaluator()
        started, self._res.evaluation = self._res.evaluation, None
        try:
            return self._outcome(info, action, evaluator, started)
        finally:
            if evaluator.last_modules:
                self._preload = evaluator.last_modules
            self.last_evaluation_trace = dict(evaluator.last_trace)
            if action == "validate":  # the episode goes on: its next evaluation can start now
                self._start_next_evaluation(evaluator)

    def _start_next_evaluation(self, evaluator: Evaluator) -> None:
        """Start the episode's next evaluation now (``Evaluator.start``), so that the next validate need not wait for
        two sandboxes and interpreters, nor for the modules the last one imported (numpy, ...)."""
        try:
            self._res.evaluation = evaluator.start(self._preload)
        except (OSError, subprocess.SubprocessError):
            self._res.evaluation = None  # the next validate starts its own

    def _outcome(self, info: dict[str, Any], action: str, evaluator: Evaluator, started: Started | None) -> Outcome:
        try:
            metrics, submission = evaluator.evaluate(
                freeze=self._res.frozen_session, started=started,
                part=held_out.VALIDATE if action == "validate" else held_out.SUBMIT)
        except EvaluationFailure as exc:
            info[EVALUATION_STATUS_KEY] = exc.status
            if exc.status == INFRA_ERROR:
                self.notes.append(f"infra_error in {action}: {exc}")
            return observations.failed_evaluation(info, action, exc)
        info[EVALUATION_STATUS_KEY] = EVALUATION_OK
        self._scores.append(metrics)
        info["score"] = list(self._scores)
        baseline = self.spec.baseline_scores[0] if self.spec.baseline_scores else "NA (no baseline was there)"
        artefact_exists = action == "validate" and os.path.exists(self._in_workspace(submission))  # False if locked
        return observations.scored(info, action, metrics, submission, baseline=baseline,
                                   artefact_exists=artefact_exists)

    def row_split(self) -> held_out.RowSplit | None:
        """The current episode's split of the answers' rows between validate and submit (``held_out``), for trusted
        tooling (the audit's canary that submits what validates could teach); None when both score every row."""
        return self._confinement.row_split(self._episode_seeds or seeding.EpisodeSeeds.draw(None, 0),
                                           self.validation_rows)

    def task_file(self, relative: str) -> Path | None:
        """The host path of the task's own copy of the workspace file ``relative`` (a starter, evaluation, protected,
        data or secret file, also one inside a folder the task puts back whole), for trusted tooling (the audit);
        None when ``relative`` is none of the task's."""
        for files in (self._files.pristine, self._files.task_files):
            for key, source in files.items():
                if relative == key:
                    return Path(source)
                if relative.startswith(key.rstrip("/") + "/") and Path(source).is_dir():
                    return Path(source) / relative[len(key.rstrip("/")) + 1:]
        return None

    def foreign_inputs(self, opened: list[str]) -> list[str]:
        """The paths of ``opened`` (a trace's, ``last_evaluation_trace["opened"]``) that are neither the task's own
        files (a starter, evaluation, protected, data or secret file, or a folder above one) nor the declared
        submission: workspace paths of the agent's other files, and anything under the agent's home outside the
        workspace. [] for an evaluation that read only what it should, as the built view makes it."""
        from ...submissions import declared_submission

        workspace = str(self.task_workspace).rstrip("/") + "/"
        own = [*self._files.task_files, *self._files.pristine, *declared_submission(self.spec)]

        def allowed(relative: str) -> bool:
            parts = Path(relative).parts
            return any(relative == key or relative.startswith(key + "/") or Path(key).parts[:len(parts)] == parts
                       for key in own)

        inside = sorted({path[len(workspace):] for path in opened if path.startswith(workspace)})
        home = str(Path(workspace).parent) + "/"
        return ([p for p in inside if p and not allowed(p)]
                + [p for p in opened if p.startswith(home) and not (p + "/").startswith(workspace)])

    def _in_workspace(self, shown: str) -> Path:
        """The host path of ``shown``, a path as the agent sees it (inside the sandbox it differs)."""
        try:
            return self.host_workspace / Path(shown).relative_to(self.task_workspace)
        except ValueError:
            return Path(shown)

    def _evaluator(self) -> Evaluator:
        evaluator = self._confinement.evaluator(
            seeds=self._episode_seeds or seeding.EpisodeSeeds.draw(None, 0),
            timeout=float(self.task.args.training_timeout if self.task else self.long_timeout),
            max_output_bytes=4 * self.max_output_chars,
            max_snapshot_bytes=self.max_snapshot_mb << 20 if self.max_snapshot_mb else None,
            agent_code_in_process=self.trust_agent_code and task_checks.agent_code_in_evaluator(self.spec),
            validation_rows=self.validation_rows,
        )
        evaluator.disk_quota = self._disk
        evaluator.trace_inputs = self.trace_evaluations
        return evaluator

    # -- internals -------------------------------------------------------------------------------------------------
    def _task_args(self) -> TaskSpec:
        docs = "".join(
            f"{str(ds.get('name', '')).upper()}:\n{ds.get('description', '')}\n\n" for ds in self.spec.datasets
        )
        return self.spec.replace(
            description=self.spec.description.replace("{dataset_docs}", docs),
            training_timeout=self.spec.training_timeout or LONG_TIMEOUT,
        )

    def _start_session(self) -> None:
        self._res.stop_session()
        with contextlib.suppress(OSError), self._disk.lock:  # the agent may have locked its own workspace (chmod
            mode = self.host_workspace.stat().st_mode  # 000): reopen it, or the new shell's ``cd`` fails
            if mode & 0o700 != 0o700:
                os.chmod(self.host_workspace, (mode & 0o7777) | 0o700)
        self._set_up(self._new_session(self._res.cgroup, self._res.memory))

    def _new_session(
        self, cgroup: limits_mod.PidsCgroup | None, memory: limits_mod.MemoryCgroup | None
    ) -> ShellSession:
        view = self._res.view
        if view is not None and not view.waiting:  # a shell started before its view is mounted binds the empty folder
            view.wait_ready()
        return self._confinement.new_session(cgroup, memory, max_output_bytes=4 * self.max_output_chars)

    def _set_up(self, session: ShellSession, then: str = "") -> None:
        """Make ``session`` the env's shell and run the set-up in it: tool variables, aliases, tools, commands (and
        ``then``, in the same round trip: a fork's restored shell state)."""
        self._res.session = session
        self._res.count_limit_events()
        source_files = [c["name"] for c in self._added if c["type"] == "source_file"]
        script = self._confinement.setup_script(tools=self.tools is not None, source_files=source_files)
        self._run_setup(f"{script}\n{then}" if then else script)

    def _run_setup(self, script: str) -> None:
        if self._res.session is None or not self._res.session.alive:
            self._start_session()
        result = self._res.session.run(script, timeout=60)  # type: ignore[union-attr]
        if result.timed_out or result.shell_died or result.returncode != 0:
            raise RuntimeError(
                f"setting up the local backend's shell failed (exit status {result.returncode}): {result.output}"
            )

    def _restart(self, result: Result, how: str) -> str:
        status = result.returncode if result.shell_died else None
        self._start_session()
        return observations.restart_note(how, status, self.task_workspace)

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop_processes(resources: Resources) -> None:
    """Kill every process of the env's session, its shell too (``disk_guard``: the env is over its disk quota).

    The shell goes too because a loop of the command runs in the shell itself. Only signals are sent (from the
    guard's thread): the driver sees the shell end and starts a new one, as after any shell that exits. Returns once
    they are gone (or after ``procs.END_WITHIN`` seconds), so that what they were still writing is on the disk when
    the guard measures the env again."""
    session = resources.session
    if session is not None and session.alive:
        victims = session.processes() | {session.shell_pid}
        procs.kill_all(victims)
        procs.wait_gone(victims)
