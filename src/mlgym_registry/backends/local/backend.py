"""``LocalBackend``: MLGym's environment contract on this machine, without containers.

The order of operations in ``step`` and every observation text an agent can rely on follow MLGym's ``MLGymEnv``
(see ``backends/protocol.py``); the shell session, tools, limits and evaluation live in the sibling modules.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import TaskFilesMissing
from ...specs import TaskSpec
from ..protocol import ToolSet, new_info
from . import limits as limits_mod
from . import toolset
from .evaluation import (
    EvaluationFormatError,
    Evaluator,
    SubmissionNotFoundError,
    force_rmtree,
)
from .output import cap, normalise
from .session import Result, ShellSession

SHORT_TIMEOUT = 25.0
LONG_TIMEOUT = 3600
TRAIN_COMMANDS = ("torchrun", "python", "python3", "accelerate", "deepspeed")
SPECIAL_EXITS = ("exit_context", "exit_cost", "exit_error", "exit_format", "exit_api")
EDIT_PATTERN = re.compile(r"^edit\s+(\d+):(\d+)(?:\n|$|\s)", re.MULTILINE)
VALIDATION = re.compile(r"<<VALIDATION\|\|(.*)\|\|VALIDATION>>", re.DOTALL)
SUBMISSION = re.compile(r"<<SUBMISSION\|\|(.*)\|\|SUBMISSION>>", re.DOTALL)

MALFORMED_EDIT = (
    "Malformed edit command. Please ensure you use the `end_of_edit` keyword to mark the end of your edit."
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

    def stop_session(self) -> None:
        if self.session is not None:
            self.session.kill()
            self.session = None

    def release(self) -> None:
        if os.getpid() != self.owner:
            return  # a forked child inherited this finalizer: the resources belong to the parent
        self.stop_session()
        if self.cgroup is not None:
            from . import procs

            deadline = time.monotonic() + 2
            while self.cgroup.members() and time.monotonic() < deadline:
                procs.kill_all(self.cgroup.members())
                time.sleep(0.01)
            self.cgroup.remove()
            self.cgroup = None
        force_rmtree(self.root)


ROOT_PREFIX = "mlgym-registry-"
OWNER_FILE = "owner.pid"


def sweep_orphans(parent: Path) -> None:
    """Remove backend folders whose owning process is gone (it was SIGKILLed before it could clean up)."""
    try:
        candidates = list(parent.glob(f"{ROOT_PREFIX}*/{OWNER_FILE}"))
    except OSError:
        return
    for owner_file in candidates:
        try:
            owner = owner_file.read_text().strip()
        except OSError:
            continue
        if owner.isdigit() and not limits_mod.pid_alive(owner):
            force_rmtree(owner_file.parent)


class LocalBackend:
    """An MLGym-compatible environment in a temporary workspace on this machine.

    One persistent ``bash`` per episode (stderr merged, own process session), MLGym's tool language, step counting,
    special actions, output normalisation and validate/submit evaluation. Safety: per-command timeouts that kill the
    command's whole process tree, capped output, CPU/memory/process limits, no network where the OS allows it, and
    nothing left running or on disk after ``close()`` (also on garbage collection and interpreter exit).

    Parameters: ``command_timeout`` (seconds for ordinary commands), ``long_timeout`` (for commands that mention
    ``python``/``torchrun``/...; default the task's ``training_timeout`` or 3600), ``max_output_chars`` (cap on one
    observation), ``memory_limit_mb`` (address space per process), ``cpu_seconds`` (CPU time per process),
    ``max_processes`` (tasks alive at once in the session), ``network`` (allow network access), ``seed`` (exported to
    evaluators as ``MLGYM_REGISTRY_SEED``), ``workspace_dir`` (folder to create the private temporary folder in),
    ``python`` (the interpreter the agent's shell and the evaluator use, e.g. a virtual environment with the task's
    packages, as MLGym's conda environment would have them; default the one running this process).
    """

    name = "mlgym_main"

    def __init__(
        self,
        spec: TaskSpec,
        *,
        command_timeout: float = SHORT_TIMEOUT,
        long_timeout: float | None = None,
        max_output_chars: int = 100_000,
        memory_limit_mb: int | None = None,
        cpu_seconds: int | None = None,
        max_processes: int | None = 1024,
        network: bool = False,
        seed: int | None = None,
        workspace_dir: str | None = None,
        python: str | None = None,
    ):
        self.python = _interpreter(python)
        self.spec = spec
        self.command_timeout = command_timeout
        self.long_timeout = long_timeout if long_timeout is not None else (spec.training_timeout or LONG_TIMEOUT)
        self.max_output_chars = max_output_chars
        self.limits = limits_mod.Limits(memory_limit_mb, cpu_seconds, max_processes)
        self.network = network
        self.seed = seed
        self.max_steps = spec.max_steps
        self.current_step = 0
        self.returncode: int | None = None
        self.task: LocalTask | None = None
        self.tools: ToolSet | None = None
        self.notes: list[str] = []

        sweep_orphans(Path(workspace_dir or tempfile.gettempdir()))
        root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX, dir=workspace_dir))
        (root / OWNER_FILE).write_text(str(os.getpid()))
        self._res = _Resources(root)
        self._finalizer = weakref.finalize(self, self._res.release)
        self.task_workspace = root / "workspace"
        self._home, self._tmp, self._commands = root / "home", root / "tmp", root / "commands"
        self._pristine_dir, self._scratch = root / "pristine", root / "scratch"
        for folder in (self._home, self._tmp, self._commands, self._pristine_dir, self._scratch, self.task_workspace):
            folder.mkdir()
        self._added: list[dict[str, str]] = []
        self._scores: list[Any] = []
        self._pristine: dict[str, Path] = {}
        self._limit_hits = 0

        self._prefix: tuple[str, ...] = ()
        if not network:
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
        self._bash = "/bin/bash" if os.path.exists("/bin/bash") else (shutil.which("bash") or "bash")

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Fresh workspace (starter code, read-only data) and fresh shell; returns ``({"observation": None}, {})``."""
        if self._finalizer.alive is False:
            raise RuntimeError("this LocalBackend was closed; make a new one")
        if seed is not None:
            self.seed = seed
        self._res.stop_session()
        self.current_step = 0
        self.returncode = None
        self._scores = []
        self._prepare_workspace()
        self.task = LocalTask(args=self._task_args())
        self._start_session()
        return {"observation": None}, {}

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
        self._run_setup(toolset.install_script())
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
                self._run_setup(f"source {_quote(path)}")

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

        timeout = self.long_timeout if any(word in action for word in TRAIN_COMMANDS) else self.command_timeout
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

        if VALIDATION.search(observation):
            return self._evaluate(info, "validate")
        if SUBMISSION.search(observation):
            return self._evaluate(info, "submit")
        return observation, 0, False, info

    # -- evaluation ------------------------------------------------------------------------------------------------
    def _evaluate(self, info: dict[str, Any], action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """MLGym's outcomes table for validate, submit and autosubmission."""
        assert self.task is not None, "call reset() before step()"
        try:
            metrics, submission = self._evaluator().evaluate()
        except SubmissionNotFoundError:
            if action == "validate":
                return SUBMISSION_NOT_FOUND, 0, False, info
            info["exit_status"] = f"submission_not_found ({action})"
            return f"Exited ({action})", 0, True, info
        except EvaluationFormatError as exc:
            if action == "validate":
                return str(exc.args[0]), 0, False, info
            info["exit_status"] = f"evaluation_format_error ({action})"
            return f"Exited ({action})", 0, True, info
        except Exception as exc:  # noqa: BLE001 - MLGym reports any other failure the same way
            if action == "validate":
                return f"Error: {exc}", 0, False, info
            info["exit_status"] = f"{type(exc).__name__}, {exc}, ({action})"
            return f"Exited ({action})", 0, True, info
        self._scores.append(metrics)
        info["score"] = list(self._scores)
        if action == "submit":
            info["exit_status"] = "submitted"
            info["submission"] = submission
            return "Exited (submit)", 0, True, info
        if action == "validate":
            baseline = self.spec.baseline_scores[0] if self.spec.baseline_scores else "NA (no baseline was there)"
            text = (
                f"Your code produced a valid submission artefact at {submission}.\n"
                f"Baseline Score: {baseline}\nEvaluation Score: {metrics}"
            )
            return text.strip(), 0, False, info
        info["exit_status"] = f"autosubmission ({action})"
        info["submission"] = submission
        return f"Exited ({action})", 0, True, info

    def _evaluator(self) -> Evaluator:
        extra = {"MLGYM_REGISTRY_SEED": str(self.seed)} if self.seed is not None else {}
        return Evaluator(
            entrypoint=self.spec.task_entrypoint,
            workspace=self.task_workspace,
            evaluation_paths=list(self.spec.evaluation_paths),
            pristine=dict(self._pristine),
            scratch_root=self._scratch,
            python=self.python,
            env=self._environment(),
            timeout=float(self.task.args.training_timeout if self.task else self.long_timeout),
            prefix=self._prefix,
            preexec=self._preexec(),
            max_output_bytes=4 * self.max_output_chars,
            extra_env=extra,
        )

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
        workspace = self.task_workspace
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
        data = self.task_workspace / "data"
        for dataset in self.spec.datasets:
            if not dataset.get("is_local") or not dataset.get("data_path"):
                continue
            source = self.spec.resolve_path(dataset["data_path"])
            if not source.exists():
                raise TaskFilesMissing(
                    f"task {self.spec.id!r}: the files of its local dataset {dataset.get('name', '')!r} are not at "
                    f"{str(source)!r}. The task file's repository does not ship them: put them there (MLGym prepares "
                    "such data outside its repository) or choose a task whose data is present"
                )
            target = data if not data.exists() else data / source.name
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                target.mkdir(parents=True, exist_ok=True)
                target = target / source.name
                shutil.copy2(source, target)
            self._pristine[str(target.relative_to(self.task_workspace))] = source
        if data.exists():
            _chmod_tree(data, 0o555)

    def _hide_secrets(self) -> None:
        """Take ``spec.secret_files`` (e.g. a test set's answers) out of the workspace; evaluations still see them."""
        for relative in self.spec.secret_files:
            path = self.task_workspace / relative
            if not path.exists():
                continue
            covered = any(relative == key or relative.startswith(key.rstrip("/") + "/") for key in self._pristine)
            if not covered:
                self._keep_pristine(relative)
            if path.is_dir():
                force_rmtree(path)
            else:
                path.unlink()

    def _protect(self) -> None:
        """Keep pristine copies of the evaluation and protected files; show them read-only in the workspace."""
        guarded = {p: 0o555 for p in self.spec.evaluation_paths} if self.spec.evaluation_read_only else {}
        guarded.update({p: 0o444 for p in self.spec.protected_files})
        force_rmtree(self._pristine_dir)
        self._pristine_dir.mkdir()
        self._pristine = {}
        for relative, mode in guarded.items():
            source = self.task_workspace / relative
            if not source.exists():
                continue
            self._keep_pristine(relative)
            _chmod_tree(source, mode)

    def _keep_pristine(self, relative: str) -> None:
        """Copy ``workspace/relative`` aside; evaluations put this copy back over whatever the agent left there."""
        source, copy = self.task_workspace / relative, self._pristine_dir / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, copy)
        else:
            shutil.copy2(source, copy)
        self._pristine[relative] = copy

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BASH_FUNC_", "MLGR_"))}
        bin_dir = os.path.dirname(self.python)
        env.update(
            PATH=os.pathsep.join([bin_dir, str(self._commands), env.get("PATH", os.defpath)]),
            HOME=str(self._home),
            TMPDIR=str(self._tmp),
            PYTHONUNBUFFERED="1",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
        )
        if os.path.exists(os.path.join(bin_dir, "activate")):
            env["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
        env.pop("PS1", None)
        if self.seed is not None:
            env["MLGYM_REGISTRY_SEED"] = str(self.seed)
        return env

    def _preexec(self):
        cgroup = self._res.cgroup
        return limits_mod.make_preexec(self.limits, self._nproc, cgroup.procs_file if cgroup else None)

    def _start_session(self) -> None:
        self._res.stop_session()
        cgroup = self._res.cgroup
        self._res.session = ShellSession(
            self.task_workspace,
            self._environment(),
            bash=self._bash,
            prefix=self._prefix,
            preexec=self._preexec(),
            max_output_bytes=4 * self.max_output_chars,
            extra_kill=cgroup.members if cgroup else None,
        )
        self._limit_hits = cgroup.hit_limit_count() if cgroup else 0
        lines = []
        if self._prefix:
            lines.append("command -v ip >/dev/null 2>&1 && ip link set lo up >/dev/null 2>&1")
        lines.append(toolset.reset_variables_script())
        if self.spec.aliases_file:
            lines += ["shopt -s expand_aliases", f"source {_quote(self.spec.resolve_path(self.spec.aliases_file))}"]
        if self.tools is not None:
            lines.append(toolset.install_script())
        lines += [f"source {_quote(self._commands / c['name'])}" for c in self._added if c["type"] == "source_file"]
        lines.append(f"cd {_quote(self.task_workspace)}")
        self._run_setup("\n".join(lines))

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
        """Stop what a command left behind when it ran into the process limit (a fork bomb keeps forking)."""
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
        done = subprocess.run(
            [self._bash, "-n"], input=command.encode("utf-8", errors="surrogateescape"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
        )
        if done.returncode == 0:
            return None
        self.returncode = done.returncode
        return cap(normalise(done.stdout), self.max_output_chars)

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _interpreter(python: str | None) -> str:
    """The absolute path of the ``python=`` option's interpreter (a path or a command name on ``PATH``)."""
    if python is None:
        return sys.executable
    found = shutil.which(python)
    if found is None:
        raise ValueError(
            f"local backend: python={python!r} is not an executable found on this machine; pass the path of a Python "
            "interpreter, e.g. python='/path/to/venv/bin/python'"
        )
    return os.path.abspath(found)


def _quote(value: object) -> str:
    import shlex

    return shlex.quote(str(value))


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _chmod_tree(path: Path, mode: int) -> None:
    if path.is_dir():
        for folder, _dirs, files in os.walk(path):
            for name in files:
                os.chmod(os.path.join(folder, name), mode)
        for folder, _dirs, _files in sorted(os.walk(path), reverse=True):
            os.chmod(folder, mode if mode & 0o111 else mode | 0o111)
    else:
        os.chmod(path, mode)
