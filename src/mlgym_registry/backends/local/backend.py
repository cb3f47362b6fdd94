"""``LocalBackend``: MLGym's environment contract on this machine, without containers.

The order of operations in ``step`` and every observation text an agent can rely on follow MLGym's ``MLGymEnv``
(see ``backends/protocol.py``); the shell session, tools, limits and evaluation live in the sibling modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import datasets as datasets_mod
from ... import seeding
from ...environments import task_python
from ...errors import BackendUnavailable, TaskFilesMissing
from ...specs import TaskSpec
from ..protocol import EVALUATION_OK, EVALUATION_STATUS_KEY, INFRA_ERROR, ToolSet, new_info
from . import limits as limits_mod
from . import sandbox as sandbox_mod
from . import toolset, trees
from .evaluation import (
    HARNESS_DIR,
    EvaluationFailure,
    EvaluationFormatError,
    Evaluator,
    InvalidMetrics,
    Started,
    SubmissionNotFoundError,
    force_rmtree,
)
from .output import cap, normalise
from .session import Result, ShellSession

SHORT_TIMEOUT = 25.0
LONG_TIMEOUT = 3600
DEFAULT_MEMORY_MB = 4096
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSED_VARIABLES = frozenset({"LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS"})
PASSED_PREFIXES = ("OPENBLAS_",)  # numerical-library settings some hosts need for correct results
ALIASES_MOUNT = "/opt/mlgym-registry/aliases.sh"
LEGACY_SEED_VARIABLE = "MLGYM_REGISTRY_SEED"
"""Set to the evaluation seed too, in the evaluator's process only, for evaluators older than the new variable."""
SEED_VARIABLES = frozenset({seeding.KEY_VARIABLE, seeding.EVALUATION_SEED_VARIABLE, LEGACY_SEED_VARIABLE})
"""Never passed on from the driver's environment (unsandboxed): the key, and seeds the evaluator alone may get."""
PACKAGE_DIR = Path(__file__).resolve().parents[2]
"""This package's folder (task files, data): never shown to the agent."""
DEFAULT_FILE_MB = 4096
SNAPSHOT_FILE_MULTIPLE = 4
"""``max_snapshot_mb`` defaults to this many times ``max_file_mb``: four files of the largest size a command may
write (16 GB by default), far more than a workspace needs, but not the whole disk."""
TRAIN_COMMANDS = frozenset({"torchrun", "python", "python3", "accelerate", "deepspeed"})
"""Programs whose commands get the long (training) timeout, as MLGym gives them; only as a command, not any word."""
SPECIAL_EXITS = ("exit_context", "exit_cost", "exit_error", "exit_format", "exit_api")
EDIT_PATTERN = re.compile(r"^edit\s+(\d+):(\d+)(?:\n|$|\s)", re.MULTILINE)
INSERT_PATTERN = re.compile(r"^insert\s+(\d+)(?:\n|$|\s)", re.MULTILINE)
LONE_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
"""Surrogates that are not ``surrogateescape``'s stand-ins for raw bytes: they cannot be sent to the shell."""
VALIDATION = re.compile(r"<<VALIDATION\|\|(.*)\|\|VALIDATION>>", re.DOTALL)
SUBMISSION = re.compile(r"<<SUBMISSION\|\|(.*)\|\|SUBMISSION>>", re.DOTALL)
"""MLGym's validate and submit markers, as it searches for them; ``has_marker`` decides the same in linear time."""

MALFORMED_EDIT = (
    "Malformed edit command. Please ensure you use the `end_of_edit` keyword to mark the end of your edit."
)
MALFORMED_INSERT = (
    "Malformed insert command. Please ensure you use the `end_of_insert` keyword to mark the end of your insert."
)
SUBMISSION_NOT_FOUND = (
    "Submission artefact not found. You have to produce a valid submission artefact as described in the task "
    "description to validate your results."
)
NO_OUTPUT_TIMEOUT_TEXT = (
    " BECAUSE NO OUTPUT WAS PRODUCED FOR MORE THAN {seconds} SECONDS.\n"
    "PLEASE REFINE YOUR RUNNING COMMAND SO IT WILL PRODUCE OUTPUT IN THE SPECIFIED TIME FRAME."
)
TOTAL_TIMEOUT_TEXT = " BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN {seconds} SECONDS."

# a single line of plain words (no quotes, operators, expansions or reserved words) cannot be a syntax error
_PLAIN_COMMAND = re.compile(r"[A-Za-z0-9_./:=,+@%-]+(?: +[A-Za-z0-9_./:=,+@%-]+)*")
_RESERVED = frozenset(
    "if then else elif fi case esac for select while until do done in function time coproc { } ! [[ ]]".split()
)


class CommandTimeout(TimeoutError):
    """A command ran out of time. Its processes were killed; ``partial`` is what it printed."""

    def __init__(self, kind: str, seconds: float, partial: str, note: str = ""):
        super().__init__(f"command timed out ({kind}) after {seconds} s", partial)
        self.kind, self.seconds, self.partial, self.note = kind, seconds, partial, note


@dataclass
class LocalTask:
    """What ``backend.task`` is after ``reset()``: ``args`` is the task's spec with MLGym's set-up filled in."""

    args: TaskSpec


class _Resources:
    """Everything the backend must release: the session, the cgroup and its private folder.

    Kept apart from the backend so that ``weakref.finalize`` can release them without holding the backend alive.
    """

    def __init__(self, root: Path):
        self.root = root
        self.owner = os.getpid()
        self.session: ShellSession | None = None
        self.cgroup: limits_mod.PidsCgroup | None = None
        self.memory: limits_mod.MemoryCgroup | None = None
        self.owner_lock: int | None = None
        self.warm: ShellSession | None = None
        """The next episode's shell, started ahead in its own sandbox and in the spare cgroups (see ``reset``)."""
        self.warm_workspace: tuple[int, int] | None = None
        """The workspace folder (device, inode) that ``warm``'s sandbox mounted."""
        self.spare_cgroup: limits_mod.PidsCgroup | None = None
        self.spare_memory: limits_mod.MemoryCgroup | None = None
        self.evaluation: Started | None = None
        """The episode's next evaluation, started ahead after the previous one (see ``Evaluator.start``)."""

    def stop_session(self) -> None:
        if self.session is not None:
            self.session.kill()
            self.session = None

    def stop_warm(self) -> None:
        if self.warm is not None:
            self.warm.kill()
            self.warm = None

    def stop_evaluation(self) -> None:
        if self.evaluation is not None:
            self.evaluation.end()
            self.evaluation = None

    def swap_cgroups(self) -> None:
        """The spare cgroups (the warm shell's) become the session's, and the session's the spare ones."""
        self.cgroup, self.spare_cgroup = self.spare_cgroup, self.cgroup
        self.memory, self.spare_memory = self.spare_memory, self.memory

    def release(self) -> None:
        """Release everything; never raises (``close()`` must not fail on what the agent left): each part that
        fails is warned about and the others are still released."""
        if os.getpid() != self.owner:
            return  # a forked child inherited this finalizer: the resources belong to the parent
        for part in (self.stop_session, self.stop_warm, self.stop_evaluation, self._remove_cgroups, self._remove_root):
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - reported, and the rest is released anyway
                warnings.warn(f"local backend: closing {self.root} failed in part: {exc!r}", RuntimeWarning,
                              stacklevel=2)
        if self.owner_lock is not None:
            os.close(self.owner_lock)
            self.owner_lock = None

    def _remove_cgroups(self) -> None:
        for _ in range(2):  # the session's and the spare ones
            if self.cgroup is not None:
                from . import procs

                deadline = time.monotonic() + 2
                while self.cgroup.members() and time.monotonic() < deadline:
                    procs.kill_all(self.cgroup.members())
                    time.sleep(0.01)
                self.cgroup.remove()
                self.cgroup = None
            if self.memory is not None:
                self.memory.remove()
                self.memory = None
            self.swap_cgroups()

    def _remove_root(self) -> None:
        if not force_rmtree(self.root):
            warnings.warn(f"local backend: could not delete all of {self.root}", RuntimeWarning, stacklevel=3)


ROOT_PREFIX = "mlgym-registry-"
OWNER_FILE = "owner.pid"


def sweep_orphans(parent: Path) -> None:
    """Remove backend folders whose owning process is gone (it was SIGKILLed before it could clean up).

    The owner holds a lock on its ``owner.pid`` for as long as it lives; a folder is an orphan only when that lock
    can be taken. Locks, unlike pids, mean the same in every PID namespace, and writing the file forges nothing.
    A folder that cannot be deleted is warned about, never an error: it is another process's leftover, and this
    env can start without it gone.
    """
    try:
        candidates = list(parent.glob(f"{ROOT_PREFIX}*/{OWNER_FILE}"))
    except OSError:
        return
    for owner_file in candidates:
        try:
            fd = os.open(owner_file, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        finally:
            os.close(fd)
        try:
            removed = force_rmtree(owner_file.parent)
        except Exception as exc:  # noqa: BLE001 - someone else's folder must not stop this env
            removed, why = False, f": {exc!r}"
        else:
            why = ""
        if not removed:
            warnings.warn(f"local backend: could not delete the abandoned folder {owner_file.parent}{why}",
                          RuntimeWarning, stacklevel=3)


def _hold_owner_lock(root: Path) -> int:
    """Write ``owner.pid`` and lock it for this process's lifetime (see ``sweep_orphans``).

    The file is locked under another name and then renamed: a sweep (another env starting, in this process or
    another) that found ``owner.pid`` between its creation and its lock would take it for an orphan's.
    """
    pending = root / f".{OWNER_FILE}.pending"
    fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, str(os.getpid()).encode())
    os.rename(pending, root / OWNER_FILE)
    return fd


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
    files not counted; default four times ``max_file_mb``; a bigger workspace fails to evaluate), ``network``
    (allow network access), ``seed`` (starts the episodes' seed stream, as ``reset(seed=...)``; see
    ``reset``),
    ``workspace_dir`` (folder to create the private temporary folder in), ``python`` (the interpreter the agent's
    shell and the evaluator use, e.g. a virtual environment with the task's packages, as MLGym's conda environment
    would have them; default the task's: see ``task_python``), ``sandbox`` (``"bwrap"``, the default, or ``"none"`` to
    run unsandboxed: unsafe, for trusted policies only), ``data_dir`` (a folder, or several separated by ``os.pathsep``,
    searched first for the task's local datasets; see ``mlgym_registry.datasets``), ``gpus`` (show the host's NVIDIA
    devices and driver libraries to the sandbox; see ``sandbox.gpu_devices``), ``trust_agent_code`` (run a task whose
    evaluator imports the agent's code into its own process, ``agent_code_in_evaluator``: its scores can be forged).
    """

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
        network: bool = False,
        seed: int | None = None,
        workspace_dir: str | None = None,
        python: str | None = None,
        sandbox: str = "bwrap",
        data_dir: str | None = None,
        gpus: bool = False,
        trust_agent_code: bool = False,
    ):
        if sandbox not in sandbox_mod.SANDBOX_MODES:
            raise ValueError(f"local backend: sandbox={sandbox!r}; use one of {', '.join(sandbox_mod.SANDBOX_MODES)}")
        self.check_available(sandbox=sandbox)
        self.sandboxed = sandbox == "bwrap"
        self.python = _interpreter(python, spec)
        self.spec = spec
        self.command_timeout = command_timeout
        self.long_timeout = long_timeout if long_timeout is not None else (spec.training_timeout or LONG_TIMEOUT)
        self.max_output_chars = max_output_chars
        self.limits = limits_mod.Limits(memory_limit_mb, cpu_seconds, max_processes)
        self.max_file_mb = max_file_mb
        self.max_snapshot_mb = max_snapshot_mb if max_snapshot_mb is not None else SNAPSHOT_FILE_MULTIPLE * (
            max_file_mb or DEFAULT_FILE_MB)
        self.network = network
        self.data_dir = data_dir
        self.gpus = gpus
        self.trust_agent_code = trust_agent_code
        _refuse_untrusted_evaluator(spec, trust_agent_code)
        if gpus:
            _refuse_missing_gpus()
        self._dataset_sources: list[Path] = []
        _refuse_unservable_datasets(spec, data_dir)
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
        root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX, dir=workspace_dir))
        self._res = _Resources(root)
        self._res.owner_lock = _hold_owner_lock(root)
        self._finalizer = weakref.finalize(self, self._res.release)
        self.host_workspace = root / "workspace"
        """The workspace's folder on this machine (what the driver reads and writes)."""
        self.task_workspace = Path(sandbox_mod.AGENT_WORKSPACE) if self.sandboxed else self.host_workspace
        """The workspace as the agent sees it (MLGym's ``/home/agent/workspace`` when sandboxed)."""
        self._home, self._tmp, self._commands = root / "home", root / "tmp", root / "commands"
        self._pristine_dir, self._scratch = root / "pristine", root / "scratch"
        for folder in (self._home, self._tmp, self._commands, self._pristine_dir, self._scratch, self.host_workspace):
            folder.mkdir()
        self._workspace_mode = stat.S_IMODE(self.host_workspace.stat().st_mode)
        self._added: list[dict[str, str]] = []
        self._scores: list[Any] = []
        self._pristine: dict[str, Path] = {}
        self._secrets: set[str] = set()
        self._limit_hits = 0
        self._oom_kills = 0

        self._prefix: tuple[str, ...] = ()
        if not network and not self.sandboxed:
            prefix = limits_mod.network_isolation_prefix()
            if prefix is None:
                limits_mod.warn_no_network_isolation()
                self.notes.append(limits_mod.NO_NETWORK_ISOLATION)
            else:
                self._prefix = prefix
        self._nproc: int | None = None
        if max_processes:
            self._res.cgroup = limits_mod.PidsCgroup.create(max_processes)
            if self._res.cgroup is None and os.geteuid() != 0:
                self._nproc = limits_mod.user_process_count() + max_processes
            elif self._res.cgroup is None:
                self.notes.append("max_processes is not enforced: no pids cgroup could be created, and running as "
                                  "root RLIMIT_NPROC does not apply")
        if memory_limit_mb:
            self._res.memory = limits_mod.MemoryCgroup.create(memory_limit_mb)
        self._bash = "/bin/bash" if os.path.exists("/bin/bash") else (shutil.which("bash") or "bash")
        self._warm_shells = self.sandboxed and self._make_spare_cgroups()
        """Whether each reset starts the next episode's shell ahead (sandboxed only: see ``reset``)."""
        self._preload: list[str] = []
        """The system modules the task's last finished evaluation imported: the next one's evaluator preloads them."""

    @staticmethod
    def check_available(*, sandbox: str = "bwrap", gpus: bool = False, **_options: Any) -> None:
        """Raise ``BackendUnavailable`` now (at ``make``) when this host cannot run the chosen sandbox or has no GPUs
        to show; warn once when there is to be no sandbox."""
        if gpus:
            _refuse_missing_gpus()
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
        """Raise now (at ``make``) when this backend cannot serve ``spec``: its evaluator would run the agent's code
        in-process untrusted, its data is missing or unservable, or the packages it needs are nowhere
        (``MissingTaskPackages``)."""
        _refuse_untrusted_evaluator(spec, trust_agent_code)
        _interpreter(python, spec)  # before the data: `prepare` makes both, and a missing package says so first
        _refuse_unservable_datasets(spec, data_dir)

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
        self.current_step = 0
        self.returncode = None
        self._scores = []
        self._prepare_workspace()
        self.task = LocalTask(args=self._task_args())
        if not self._take_warm_shell():
            self._start_session()
        self._start_warm_shell()
        return {"observation": None}, {}

    def _make_spare_cgroups(self) -> bool:
        """Make the spare cgroups a warm shell waits in, like the session's; False when they cannot be made."""
        res = self._res
        if res.cgroup is not None:
            res.spare_cgroup = limits_mod.PidsCgroup.create(self.limits.max_processes or 0)
        if res.memory is not None:
            res.spare_memory = limits_mod.MemoryCgroup.create(self.limits.memory_limit_mb or 0)
        return (res.spare_cgroup is None) == (res.cgroup is None) and (res.spare_memory is None) == (res.memory is None)

    def _start_warm_shell(self) -> None:
        """Start the next episode's shell now, so that the next reset need not wait for a sandbox to start.

        It is a whole new sandbox (namespaces, in-memory folders, shell), as a reset would start, and nothing runs in
        it before it is taken: ``reset`` then runs the shell's set-up in it. It waits in cgroups of its own (the
        spare ones, with the session's limits), so the agent's processes and limits never include it, and joining
        them (which costs the kernel milliseconds) happens in the background, in the sandbox's own starter.
        """
        if not self._warm_shells or self._res.warm is not None:
            return
        try:
            self._res.warm_workspace = _identity(self.host_workspace)
            self._res.warm = self._new_session(self._res.spare_cgroup, self._res.spare_memory)
        except OSError:
            self._res.warm = None

    def _take_warm_shell(self) -> bool:
        """Make the warm shell the session (its cgroups become the session's); False when there is none to take:
        it ended (its sandbox could not start), or the workspace is another folder than the one its sandbox shows."""
        res = self._res
        warm, res.warm = res.warm, None
        if warm is None:
            return False
        if not warm.alive or res.warm_workspace != _identity(self.host_workspace):
            warm.kill()
            return False
        res.swap_cgroups()
        try:
            self._set_up(warm)
        except RuntimeError:
            res.stop_session()  # started in the sandbox but failed its set-up: a new one is started the usual way
            return False
        return True

    def reset_container(self) -> None:
        """TorchRL's MLGym wrapper calls this before ``reset()``: a fresh shell in the same workspace."""
        self._res.stop_session()
        self._start_session()

    def close(self) -> None:
        """Kill every process of the backend and delete its folder. Safe to call more than once."""
        self._finalizer()

    # -- tools -----------------------------------------------------------------------------------------------------
    def install_tools(self) -> ToolSet:
        """Define ``state``, the tool commands and their variables in the session; return their ``ToolSet``."""
        self.tools = toolset.tool_set()
        self._run_setup(self._tools_script())
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
                self._run_setup(f"source {_quote(self._commands_path() + '/' + command['name'])}")

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
        input = LONE_SURROGATE.sub("\ufffd", input)
        if input.strip() == "exit":
            self._res.stop_session()
            self.returncode = 0
            return ""
        if self._res.session is None or not self._res.session.alive:
            self._start_session()
        syntax = self._check_syntax(input)
        if syntax is not None:
            return syntax
        session = self._res.session
        assert session is not None
        after = f"export LAST_ACTION={_quote(input.strip())}" if set_last_action else ""
        quiet = no_output_timeout_duration if no_output_timeout_duration is not None else timeout_duration
        result = session.run(input, timeout_duration, quiet, after=after)
        output = cap(result.output, self.max_output_chars)
        if result.timed_out:
            note = ""
            if result.marker_lost or result.shell_died:
                note = self._restart(result, "did not return after its command was stopped")
            self.returncode = result.returncode
            seconds = timeout_duration if result.timed_out == "total" else quiet
            raise CommandTimeout(result.timed_out, seconds, output, note)
        if result.shell_died:
            note = self._restart(result, "exited")
            self.returncode = result.returncode
            return f"{output}\n{note}" if output else note
        self.returncode = result.returncode
        return self._after_command(output)

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
        if action in SPECIAL_EXITS:
            return self._evaluate(info, action)
        if EDIT_PATTERN.match(action) and "end_of_edit" not in action:
            return MALFORMED_EDIT, 0, False, info
        if INSERT_PATTERN.match(action) and "end_of_insert" not in action:
            return MALFORMED_INSERT, 0, False, info

        timeout = self.long_timeout if runs_training(action) else self.command_timeout
        try:
            observation = self.communicate(action, timeout, self.long_timeout, set_last_action=True)
        except CommandTimeout as exc:
            text = NO_OUTPUT_TIMEOUT_TEXT if exc.kind == "no_output" else TOTAL_TIMEOUT_TEXT
            observation = exc.partial + "\nEXECUTION TIMED OUT" + text.format(seconds=_seconds(exc.seconds))
            if exc.note:
                observation += "\n" + exc.note
        if action == "exit":
            self._start_session()
            observation = self._restart_note("ended with the exit command", None)

        if has_marker(observation, "VALIDATION"):
            return self._evaluate(info, "validate")
        if has_marker(observation, "SUBMISSION"):
            return self._evaluate(info, "submit")
        return observation, 0, False, info

    # -- evaluation ------------------------------------------------------------------------------------------------
    def _evaluate(self, info: dict[str, Any], action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """MLGym's outcomes table for validate, submit and autosubmission."""
        assert self.task is not None, "call reset() before step()"
        evaluator = self._evaluator()
        started, self._res.evaluation = self._res.evaluation, None
        try:
            return self._outcome(info, action, evaluator, started)
        finally:
            if evaluator.last_modules:
                self._preload = evaluator.last_modules
            if action == "validate":  # the episode goes on: its next evaluation can start now
                self._start_next_evaluation(evaluator)

    def _start_next_evaluation(self, evaluator: Evaluator) -> None:
        """Start the episode's next evaluation now (``Evaluator.start``), so that the next validate need not wait for
        two sandboxes and interpreters, nor for the modules the last one imported (numpy, ...)."""
        try:
            self._res.evaluation = evaluator.start(self._preload)
        except (OSError, subprocess.SubprocessError):
            self._res.evaluation = None  # the next validate starts its own

    def _outcome(
        self, info: dict[str, Any], action: str, evaluator: Evaluator, started: Started | None
    ) -> tuple[str, float, bool, dict[str, Any]]:
        try:
            metrics, submission = evaluator.evaluate(freeze=self._freeze_agent, started=started)
        except EvaluationFailure as exc:
            info[EVALUATION_STATUS_KEY] = exc.status
            if exc.status == INFRA_ERROR:
                self.notes.append(f"infra_error in {action}: {exc}")
            return self._failed_evaluation(info, action, exc)
        info[EVALUATION_STATUS_KEY] = EVALUATION_OK
        self._scores.append(metrics)
        info["score"] = list(self._scores)
        if action == "submit":
            info["exit_status"] = "submitted"
            info["submission"] = submission
            return "Exited (submit)", 0, True, info
        if action == "validate":
            baseline = self.spec.baseline_scores[0] if self.spec.baseline_scores else "NA (no baseline was there)"
            # MLGym names <workspace>/target.py for every python task; a task without that file has no artefact to name
            artefact = f"Your code produced a valid submission artefact at {submission}.\n"
            if not self._in_workspace(submission).exists():
                artefact = ""
            text = f"{artefact}Baseline Score: {baseline}\nEvaluation Score: {metrics}"
            return text.strip(), 0, False, info
        info["exit_status"] = f"autosubmission ({action})"
        info["submission"] = submission
        return f"Exited ({action})", 0, True, info

    @staticmethod
    def _failed_evaluation(
        info: dict[str, Any], action: str, exc: Exception
    ) -> tuple[str, float, bool, dict[str, Any]]:
        """MLGym's observation and ``exit_status`` for an evaluation that produced no score."""
        if isinstance(exc, SubmissionNotFoundError):
            text, status = SUBMISSION_NOT_FOUND, "submission_not_found"
        elif isinstance(exc, EvaluationFormatError):
            text, status = str(exc.args[0]), "evaluation_format_error"
        elif isinstance(exc, InvalidMetrics):
            text, status = str(exc), "invalid_submission"
        else:  # MLGym reports any other failure this way
            text, status = f"Error: {exc}", f"{type(exc).__name__}, {exc},"
        if action == "validate":
            return text, 0, False, info
        info["exit_status"] = f"{status} ({action})"
        return f"Exited ({action})", 0, True, info

    def _in_workspace(self, shown: str) -> Path:
        """The host path of ``shown``, a path as the agent sees it (inside the sandbox it differs)."""
        try:
            return self.host_workspace / Path(shown).relative_to(self.task_workspace)
        except ValueError:
            return Path(shown)

    @contextlib.contextmanager
    def _freeze_agent(self) -> Iterator[None]:
        """Nothing of the agent's runs while the block does (the workspace is being copied)."""
        session = self._res.session
        stopped = session.pause() if session is not None and session.alive else set()
        try:
            yield
        finally:
            if session is not None:
                session.resume(stopped)

    def _evaluator(self) -> Evaluator:
        seeds = self._episode_seeds or seeding.EpisodeSeeds.draw(None, 0)
        # the evaluator's seed in its own process only: never in the agent's shell, nor where the agent's code runs
        extra = {seeding.EVALUATION_SEED_VARIABLE: str(seeds.evaluation), LEGACY_SEED_VARIABLE: str(seeds.evaluation)}
        return Evaluator(
            entrypoint=self.spec.task_entrypoint,
            workspace=self.host_workspace,
            evaluation_paths=list(self.spec.evaluation_paths),
            pristine=dict(self._pristine),
            scratch_root=self._scratch,
            python=self.python,
            env=self._environment(),
            timeout=float(self.task.args.training_timeout if self.task else self.long_timeout),
            wrap=self._wrap_evaluation if self.sandboxed else self._wrap_unsandboxed,
            workspace_path=str(self.task_workspace) if self.sandboxed else None,
            secrets=frozenset(self._secrets),
            preexec=None if self.sandboxed else self._preexec(),  # sandboxed: the limits are in the wrap's prefix
            max_output_bytes=4 * self.max_output_chars,
            max_snapshot_bytes=self.max_snapshot_mb << 20 if self.max_snapshot_mb else None,
            extra_env=extra,
            agent_seed=seeds.agent,
            limit_events=self._limit_events,
            agent_modules=frozenset(_module_names(self.spec.starter_code)),
            agent_code_in_process=self.trust_agent_code and agent_code_in_evaluator(self.spec),
        )

    def _limit_events(self) -> int:
        """Memory kills and process-limit hits of this env so far (each cgroup's own count)."""
        memory, pids = self._res.memory, self._res.cgroup
        return (memory.oom_kills() if memory else 0) + (pids.hit_limit_count() if pids else 0)

    # -- internals -------------------------------------------------------------------------------------------------
    def _task_args(self) -> TaskSpec:
        docs = "".join(
            f"{str(ds.get('name', '')).upper()}:\n{ds.get('description', '')}\n\n" for ds in self.spec.datasets
        )
        return self.spec.replace(
            description=self.spec.description.replace("{dataset_docs}", docs),
            training_timeout=self.spec.training_timeout or LONG_TIMEOUT,
        )

    def _prepare_workspace(self) -> None:
        workspace = self.host_workspace
        # emptied in place: removing the folder the last sandbox mounted waits for the kernel to detach that mount
        if not trees.empty_folder(workspace, self._workspace_mode):
            force_rmtree(workspace)
            workspace.mkdir()
        for item in self.spec.starter_code:
            source = self.spec.resolve_path(item)
            if not source.exists():
                raise TaskFilesMissing(
                    f"task {self.spec.id!r}: starter_code path {str(source)!r} does not exist; check the task file's "
                    f"starter_code entries and its root ({self.spec.root!r})"
                )
            target = workspace / source.name
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target)
        self._protect()
        self._copy_datasets()
        self._hide_secrets()

    def _copy_datasets(self) -> None:
        """Local datasets into ``workspace/data``, read-only; evaluations see the task's own copy, not the agent's."""
        data = self.host_workspace / "data"
        self._dataset_sources = []
        for dataset in datasets_mod.local_datasets(self.spec):
            source = datasets_mod.find_local_dataset(self.spec, dataset, self.data_dir)
            self._dataset_sources.append(source)
            target = data if not data.exists() else data / source.name
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                target.mkdir(parents=True, exist_ok=True)
                target = target / source.name
                shutil.copy2(source, target)
            self._pristine[str(target.relative_to(self.host_workspace))] = source
        if data.exists():
            _chmod_tree(data, 0o555)

    def _hide_secrets(self) -> None:
        """Take ``spec.secret_files`` (e.g. a test set's answers) out of the workspace; evaluations still see them."""
        for relative in self.spec.secret_files:
            path = self.host_workspace / relative
            if not path.exists():
                continue
            covered = any(relative == key or relative.startswith(key.rstrip("/") + "/") for key in self._pristine)
            if not covered:
                self._keep_pristine(relative)
            self._secrets.add(relative)
            if path.is_dir():
                force_rmtree(path)
            else:
                path.unlink()

    def _protect(self) -> None:
        """Keep pristine copies of the evaluation and protected files; show them read-only in the workspace."""
        # the evaluation files are always put back before an evaluation; evaluation_read_only only decides whether
        # the agent's copy is shown read-only, as in MLGym
        guarded = {p: 0o555 if self.spec.evaluation_read_only else None for p in self.spec.evaluation_paths}
        guarded.update({p: 0o444 for p in self.spec.protected_files})
        if not trees.empty_folder(self._pristine_dir, 0o700):
            force_rmtree(self._pristine_dir)
            self._pristine_dir.mkdir()
        self._pristine = {}
        for relative, mode in guarded.items():
            source = self.host_workspace / relative
            if not source.exists():
                continue
            self._keep_pristine(relative)
            if mode is not None:
                _chmod_tree(source, mode)

    def _keep_pristine(self, relative: str) -> None:
        """Copy ``workspace/relative`` aside; evaluations put this copy back over whatever the agent left there."""
        source, copy = self.host_workspace / relative, self._pristine_dir / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, copy)
        else:
            shutil.copy2(source, copy)
        self._pristine[relative] = copy

    def _environment(self) -> dict[str, str]:
        """The variables of the agent's shell and of evaluations: built from scratch when sandboxed (never the
        driver's own, which may hold keys), else the driver's less what would confuse bash."""
        bin_dir = os.path.dirname(self.python)
        if self.sandboxed:
            passed = PASSED_VARIABLES | set(sandbox_mod.GPU_VARIABLES) if self.gpus else PASSED_VARIABLES
            env = {k: v for k, v in os.environ.items() if k in passed or k.startswith(PASSED_PREFIXES)}
            env.update(
                PATH=os.pathsep.join([bin_dir, self._commands_path(), SYSTEM_PATH]),
                HOME=sandbox_mod.AGENT_HOME,
                TMPDIR="/tmp",
                USER="agent",
                LANG=os.environ.get("LANG", "C.UTF-8"),
            )
        else:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("BASH_FUNC_", "MLGR_")) and k not in SEED_VARIABLES}
            env.update(
                PATH=os.pathsep.join([bin_dir, str(self._commands), env.get("PATH", os.defpath)]),
                HOME=str(self._home),
                TMPDIR=str(self._tmp),
            )
            env.pop("PS1", None)
        env.update(PYTHONUNBUFFERED="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        if os.path.exists(os.path.join(bin_dir, "activate")):
            env["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
        return env

    def _commands_path(self) -> str:
        """Where the agent's shell finds the files of ``add_commands``."""
        return sandbox_mod.COMMANDS_MOUNT if self.sandboxed else str(self._commands)

    def _sandbox_spec(self, workspace: Path, *, writable: bool) -> sandbox_mod.SandboxSpec:
        """What a sandboxed process of this env sees: ``workspace`` at the agent's path, our tools, Python."""
        roots = sandbox_mod.python_roots(self.python) + sandbox_mod.python_roots(sys.executable)  # tools run this one
        binds = [sandbox_mod.Bind(root, root) for root in sandbox_mod.outermost(roots)]
        binds += [
            sandbox_mod.Bind(str(toolset.TOOLS_DIR), sandbox_mod.TOOLS_MOUNT),
            sandbox_mod.Bind(str(HARNESS_DIR), sandbox_mod.HARNESS_MOUNT),
            sandbox_mod.Bind(str(self._commands), sandbox_mod.COMMANDS_MOUNT),
            sandbox_mod.Bind(str(workspace), sandbox_mod.AGENT_WORKSPACE, writable=writable),
        ]
        if self.spec.aliases_file:
            binds.append(sandbox_mod.Bind(str(self.spec.resolve_path(self.spec.aliases_file)), ALIASES_MOUNT))
        devices: list[str] = []
        if self.gpus:
            devices = sandbox_mod.gpu_devices()
            binds += [sandbox_mod.Bind(folder, folder) for folder in sandbox_mod.gpu_library_folders()]
        hidden = [str(PACKAGE_DIR), str(self._res.root), *_key_folders([bind.source for bind in binds])]
        if self.spec.root:
            hidden.append(str(Path(self.spec.root).resolve()))
        hidden += [str(source.resolve()) for source in self._dataset_sources]  # a data folder may hold answers
        # the sandbox's in-memory folders (/tmp, /var/tmp, ~, /dev/shm) count against the memory limit only under a
        # memory cgroup: keep the four together within seven eighths of it in any case
        memory = self.limits.memory_limit_mb
        size = 512 if not memory else max(16, min(512, memory // 4))
        shm = 64 if not memory else max(8, min(64, memory // 8))
        return sandbox_mod.SandboxSpec(binds=binds, hidden=hidden, network=self.network, tmp_size_mb=size,
                                       home_size_mb=size, shm_size_mb=shm, devices=devices)

    def _wrap_evaluation(self, argv: list[str], view: Path) -> list[str]:
        return [*self._limits_prefix(self._res.cgroup, self._res.memory),
                *sandbox_mod.command(argv, self._sandbox_spec(view, writable=False))]

    def _limits_prefix(
        self, cgroup: limits_mod.PidsCgroup | None, memory: limits_mod.MemoryCgroup | None
    ) -> list[str]:
        """The shell prefix that puts a sandbox in this env's cgroups and limits (``limits.exec_prefix``): with a
        ``preexec_fn`` instead, Python would fork the whole driver, a trainer holding a model included."""
        cgroups = [c.procs_file for c in (cgroup, memory) if c is not None]
        return limits_mod.exec_prefix(self._bash, self.limits, self._nproc, cgroups,
                                      memory_rlimit=memory is None, file_size_mb=self.max_file_mb)

    def _wrap_unsandboxed(self, argv: list[str], _view: Path) -> list[str]:
        return [*self._prefix, *argv]

    def _preexec(self):
        cgroups = [c.procs_file for c in (self._res.cgroup, self._res.memory) if c is not None]
        return limits_mod.make_preexec(
            self.limits, self._nproc, cgroups, memory_rlimit=self._res.memory is None, file_size_mb=self.max_file_mb
        )

    def _start_session(self) -> None:
        self._res.stop_session()
        with contextlib.suppress(OSError):  # the agent may have locked its own workspace (chmod 000): reopen it,
            mode = self.host_workspace.stat().st_mode  # or the new shell's ``cd`` fails and the step with it
            if mode & 0o700 != 0o700:
                os.chmod(self.host_workspace, (mode & 0o7777) | 0o700)
        self._set_up(self._new_session(self._res.cgroup, self._res.memory))

    def _new_session(
        self, cgroup: limits_mod.PidsCgroup | None, memory: limits_mod.MemoryCgroup | None
    ) -> ShellSession:
        """Start a shell (sandboxed: in a new sandbox) whose processes are in ``cgroup`` and ``memory``."""
        prefix = self._prefix
        preexec = None
        if self.sandboxed:
            # no preexec_fn: with one, Python forks this whole process instead of using vfork (see exec_prefix)
            prefix = (
                *self._limits_prefix(cgroup, memory),
                *sandbox_mod.command([], self._sandbox_spec(self.host_workspace, writable=True)),
            )
        else:
            preexec = self._preexec()
        return ShellSession(
            self.host_workspace,
            self._environment(),
            bash=self._bash,
            prefix=prefix,
            preexec=preexec,
            max_output_bytes=4 * self.max_output_chars,
            extra_kill=cgroup.members if cgroup else None,
            sandboxed=self.sandboxed,
        )

    def _set_up(self, session: ShellSession) -> None:
        """Make ``session`` the env's shell and run the set-up in it: tool variables, aliases, tools, commands."""
        self._res.session = session
        cgroup = self._res.cgroup
        self._limit_hits = cgroup.hit_limit_count() if cgroup else 0
        self._oom_kills = self._res.memory.oom_kills() if self._res.memory else 0
        lines = []
        if self._prefix and not self.sandboxed:
            lines.append("command -v ip >/dev/null 2>&1 && ip link set lo up >/dev/null 2>&1")
        lines.append(toolset.reset_variables_script())
        if self.spec.aliases_file:
            aliases = ALIASES_MOUNT if self.sandboxed else self.spec.resolve_path(self.spec.aliases_file)
            lines += ["shopt -s expand_aliases", f"source {_quote(aliases)}"]
        if self.tools is not None:
            lines.append(self._tools_script())
        lines += [f"source {_quote(self._commands_path() + '/' + c['name'])}"
                  for c in self._added if c["type"] == "source_file"]
        lines.append(f"cd {_quote(self.task_workspace)}")
        self._run_setup("\n".join(lines))

    def _tools_script(self) -> str:
        return toolset.install_script(sandbox_mod.TOOLS_MOUNT if self.sandboxed else None)

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
        return self._restart_note(how, status)

    def _restart_note(self, how: str, status: int | None) -> str:
        code = ""
        if status is not None:
            code = f" (killed by signal {-status})" if status < 0 else f" (exit status {status})"
        return (
            f"NOTE: the shell session {how}{code}, so a new shell was started in the workspace "
            f"{self.task_workspace}. Files are unchanged; the working directory, shell variables and background jobs "
            "were reset, and the tool commands are available again."
        )

    def _after_command(self, output: str) -> str:
        """Say when the command ran into the memory limit; stop what it left behind at the process limit."""
        memory = self._res.memory
        if memory is not None and memory.oom_kills() != self._oom_kills:
            self._oom_kills = memory.oom_kills()
            note = (
                f"NOTE: the command ran out of memory: this environment may use {self.limits.memory_limit_mb} MB in "
                "all, and the system killed the process that went over it."
            )
            output = f"{output}\n{note}" if output else note
        cgroup = self._res.cgroup
        if cgroup is None:
            return output
        hits = cgroup.hit_limit_count()
        if hits == self._limit_hits:
            return output
        if self._res.session is not None:
            self._res.session.kill_processes()
            # killed processes hold their slots until reaped (by init, for orphans): wait so the shell can fork again
            cgroup.wait_reaped(keep=len(cgroup.members()))
            # the shell reports its killed background jobs ("Killed", "Done") when it next runs something: let it do
            # so now, in a command whose output nobody sees, rather than in front of the agent's next command
            self._res.session.run("builtin wait", timeout=10)
            self._res.session.discard_pending()  # what the stopped processes printed after the command ended
        self._limit_hits = cgroup.hit_limit_count()
        note = (
            f"NOTE: the command reached the limit of {self.limits.max_processes} processes; every process it left "
            "running was stopped."
        )
        return f"{output}\n{note}" if output else note

    def _check_syntax(self, command: str) -> str | None:
        """``bash -n`` over the command: its error text (and ``returncode``) when the syntax is wrong, else None."""
        line = command.strip()
        if "\n" not in line and _PLAIN_COMMAND.fullmatch(line) and not _RESERVED.intersection(line.split()):
            return None
        try:
            done = subprocess.run(
                [self._bash, "-n"], input=command.encode("utf-8", errors="surrogateescape"),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, timeout=self.command_timeout,
            )
        except subprocess.TimeoutExpired:
            return None  # no verdict in time: the command runs, under its own time limit
        if done.returncode == 0:
            return None
        self.returncode = done.returncode
        return cap(normalise(done.stdout), self.max_output_chars)

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_COMMAND_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", "|&", ";;", "then", "do", "else"})
_WRAPPERS = frozenset({"nohup", "time", "env", "exec", "nice", "stdbuf", "command"})
_PYTHON = re.compile(r"python[0-9.]*")


def has_marker(text: str, name: str) -> bool:
    """Whether MLGym's marker pattern ``<<NAME||(.*)||NAME>>`` (DOTALL) occurs in ``text``, in linear time.

    The group matches anything, so there is a match exactly when an opener is followed, anywhere later, by a closer:
    the first opener decides. Searching the pattern itself backtracks to the text's end from every opener (7,000
    unclosed openers took 8 s).
    """
    opener = text.find(f"<<{name}||")
    return opener >= 0 and text.find(f"||{name}>>", opener + len(name) + 4) >= 0


def runs_training(action: str) -> bool:
    """Whether a command line runs a training program (``python ...``, ``torchrun ...``) as one of its commands.

    Only the program position counts: ``sleep 12 # python`` or ``echo python`` is an ordinary command.
    """
    for line in action.splitlines():
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
        except ValueError:
            tokens = line.split()
        at_start = True
        for token in tokens:
            if token in _COMMAND_SEPARATORS:
                at_start = True
                continue
            if not at_start:
                continue
            if "=" in token.split("/")[0] or token in _WRAPPERS:
                continue  # VAR=value prefixes and wrappers: the program comes next
            name = token.rsplit("/", 1)[-1]
            if name in TRAIN_COMMANDS or _PYTHON.fullmatch(name):
                return True
            at_start = False
    return False


AGENT_CODE_IN_EVALUATOR = "agent_code_in_evaluator"
"""A task extra: its evaluator must import the agent's code into its own process (to trace it with a JIT compiler,
say), so the agent's code could print or change the score."""


def agent_code_in_evaluator(spec: TaskSpec) -> bool:
    """Whether ``spec``'s evaluator runs the agent's code in its own process (``AGENT_CODE_IN_EVALUATOR``)."""
    return bool(spec.extra.get(AGENT_CODE_IN_EVALUATOR))


def _refuse_untrusted_evaluator(spec: TaskSpec, trust_agent_code: bool) -> None:
    """A task whose evaluator runs the agent's code in-process is refused unless the user trusts that code: the
    agent could forge every score of it."""
    if agent_code_in_evaluator(spec) and not trust_agent_code:
        raise BackendUnavailable(
            f"local backend: task {spec.id!r} declares {AGENT_CODE_IN_EVALUATOR}: its evaluator runs the agent's code "
            "(its model) in the evaluator's own process, so the agent could print or change its score. Pass "
            "trust_agent_code=True to run it anyway (for trusted policies and debugging, never to train on), or run "
            "it on the mlgym backend"
        )


def _refuse_missing_gpus() -> None:
    if not sandbox_mod.gpu_devices():
        raise BackendUnavailable(
            "local backend: gpus=True, but this host has no NVIDIA device nodes (/dev/nvidia*): install the NVIDIA "
            "driver, or leave gpus off"
        )


def _refuse_unservable_datasets(spec: TaskSpec, data_dir: str | None) -> None:
    """At construction, not at the first reset: a local dataset that is nowhere (``TaskFilesMissing`` names where
    it was looked for), or a Hugging Face hub dataset, which this backend cannot serve offline and whose test labels
    the agent could load with the network on."""
    for dataset in datasets_mod.local_datasets(spec):
        datasets_mod.find_local_dataset(spec, dataset, data_dir)
    hub = datasets_mod.hub_datasets(spec)
    if hub:
        raise TaskFilesMissing(
            f"task {spec.id!r} loads the Hugging Face dataset(s) {', '.join(map(repr, hub))} by name, which the local "
            "backend does not serve: it has no network by default, and with it the agent could load the test split's "
            "labels it is scored on. Run this task on the mlgym backend (MLGym's containers), or give it a local copy "
            "without the test labels (a dataset with is_local: true and the answers in secret_files)"
        )


def _interpreter(python: str | None, spec: TaskSpec) -> str:
    """The absolute path of the ``python=`` option's interpreter (a path or a command name on ``PATH``); without one,
    the task's (``task_python``: this process's when it has the task's packages, else the environment
    ``mlgym-registry prepare`` made; ``MissingTaskPackages`` when there is none)."""
    if python is None:
        return task_python(spec)
    found = shutil.which(python)
    if found is None:
        raise ValueError(
            f"local backend: python={python!r} is not an executable found on this machine; pass the path of a Python "
            "interpreter, e.g. python='/path/to/venv/bin/python'"
        )
    return os.path.abspath(found)


def _key_folders(shown: list[str]) -> list[str]:
    """The installation key's folder (``seeding.py``), as it and as its real path, to hide from the sandbox. It is made
    now when a folder the sandbox shows holds it: a folder made later, inside a shown one, would be visible."""
    folder = seeding.key_folder()
    paths = list(dict.fromkeys([str(folder), str(folder.resolve())]))
    if any(Path(path).is_relative_to(root) for path in paths for root in shown):
        with contextlib.suppress(OSError):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return paths


def _module_names(paths: list[str]) -> list[str]:
    """The top-level module names of a task's starter files (``data/x/strategy.py`` -> ``strategy``)."""
    names = []
    for path in paths:
        name = Path(path).name
        names.append(name[:-3] if name.endswith(".py") else name)
    return names


def _quote(value: object) -> str:
    return shlex.quote(str(value))


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _chmod_tree(path: Path, mode: int) -> None:
    if path.is_dir():
        for folder, _dirs, files in os.walk(path):
            for name in files:
                os.chmod(os.path.join(folder, name), mode)
        for folder, _dirs, _files in sorted(os.walk(path), reverse=True):
            os.chmod(folder, mode if mode & 0o111 else mode | 0o111)
    else:
        os.chmod(path, mode)
