"""What the local backend's processes see and may do: their variables, their sandbox (what is shown, hidden and
writable), their limits and cgroups, and how a shell or an evaluation is started inside all that."""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ... import held_out, seeding
from ...best_scores import past_best_message
from ...preparation.hub_datasets import HubView
from ...specs import TaskSpec
from ...submissions import declared_submission, submission_schema
from . import cgroups, hub_cache, procs, task_checks, toolset
from . import limits as limits_mod
from . import sandbox as sandbox_mod
from .evaluation import HARNESS_DIR, Evaluator
from .resources import Folders, Resources
from .session import ShellSession
from .submission_check import reference_bytes
from .workspace import WorkspaceFiles

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


class Confinement:
    """How one env starts its processes: the agent's shells and the evaluations of its code.

    ``sandboxed``: each in a bubblewrap sandbox that shows the workspace at the agent's path and hides the rest of
    the env (``sandbox_spec``); else directly, with ``prefix`` (network isolation) before the command. Either way in
    the env's cgroups (``resources``) and under ``limits``; ``nproc`` stands in for a pids cgroup that could not be
    made.
    """

    def __init__(
        self,
        spec: TaskSpec,
        *,
        python: str,
        sandboxed: bool,
        network: bool,
        gpus: bool,
        limits: limits_mod.Limits,
        max_file_mb: int | None,
        bash: str,
        prefix: tuple[str, ...],
        nproc: int | None,
        resources: Resources,
        folders: Folders,
        files: WorkspaceFiles,
        hub_views: Sequence[HubView] = (),
        models: Sequence[str] = (),
        hub_cache_dir: str | None = None,
    ):
        self.spec, self.python, self.sandboxed, self.network, self.gpus = spec, python, sandboxed, network, gpus
        self.limits, self.max_file_mb, self.bash, self.prefix, self.nproc = limits, max_file_mb, bash, prefix, nproc
        self.resources, self.folders, self.files = resources, folders, files
        self.hub_views = list(hub_views)
        """The views of the task's hub datasets (``hub_cache``): the agent's in its sandboxes, the evaluator's in
        the evaluator's."""
        self.models = list(models)
        """The Hugging Face models the task loads by name, shown from ``hub_cache_dir`` (this machine's cache)."""
        self.hub_cache_dir = hub_cache_dir
        self.hub_folder = folders.root / "hf-datasets"
        """The writable part of the agent's datasets cache (``hub_cache.fill``), emptied at each reset."""
        self.hub_evaluator_folder = folders.root / "hf-datasets-evaluator"
        """Unsandboxed only: the evaluator's datasets cache (links to its views)."""
        self.task_workspace = Path(sandbox_mod.AGENT_WORKSPACE) if sandboxed else folders.workspace
        """The workspace as the agent sees it (MLGym's ``/home/agent/workspace`` when sandboxed)."""
        self.enter: list[str] = []
        """A forked env's: the prefix that starts the agent's sandbox where its copy-on-write workspace is mounted
        (``layers.OverlayView.enter``); [] for a plain workspace."""
        self.shown_workspace: Path | None = None
        """A forked env's: the folder the agent's sandbox binds, as the holder's namespaces see it (the driver's
        ``folders.workspace`` reaches the same view through ``/proc``); None: ``folders.workspace``."""
        self.layer_folders: list[str] = []
        """A forked env's frozen layers (``layers.Layer``): hidden from its sandboxes like its own folder."""

    def environment(self) -> dict[str, str]:
        """The variables of the agent's shell and of evaluations: built from scratch when sandboxed (never the
        driver's own, which may hold keys), else the driver's less what would confuse bash."""
        bin_dir = os.path.dirname(self.python)
        if self.sandboxed:
            passed = PASSED_VARIABLES | set(sandbox_mod.GPU_VARIABLES) if self.gpus else PASSED_VARIABLES
            env = {k: v for k, v in os.environ.items() if k in passed or k.startswith(PASSED_PREFIXES)}
            env.update(
                PATH=os.pathsep.join([bin_dir, self.commands_path(), SYSTEM_PATH]),
                HOME=sandbox_mod.AGENT_HOME,
                TMPDIR="/tmp",
                USER="agent",
                LANG=os.environ.get("LANG", "C.UTF-8"),
            )
        else:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("BASH_FUNC_", "MLGR_")) and k not in SEED_VARIABLES}
            env.update(
                PATH=os.pathsep.join([bin_dir, str(self.folders.commands), env.get("PATH", os.defpath)]),
                HOME=str(self.folders.home),
                TMPDIR=str(self.folders.tmp),
            )
            env.pop("PS1", None)
        env.update(PYTHONUNBUFFERED="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        if self.hub_views or self.models:
            env.update(hub_cache.environment(str(self.hub_folder) if self.hub_views else None,
                                             sandboxed=self.sandboxed))
        if os.path.exists(os.path.join(bin_dir, "activate")):
            env["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
        return env

    def commands_path(self) -> str:
        """Where the agent's shell finds the files of ``add_commands``."""
        return sandbox_mod.COMMANDS_MOUNT if self.sandboxed else str(self.folders.commands)

    def reset_hub_caches(self) -> None:
        """Empty and fill the writable parts of the datasets caches for a new episode (``hub_cache.fill``)."""
        if not self.hub_views:
            return
        hub_cache.fill(self.hub_folder, self.hub_views, hub_cache.AGENT, link=not self.sandboxed)
        if not self.sandboxed:
            hub_cache.fill(self.hub_evaluator_folder, self.hub_views, hub_cache.EVALUATOR, link=True)

    def sandbox_spec(self, workspace: Path, *, writable: bool,
                     hub: tuple[Path, str] | None = None) -> sandbox_mod.SandboxSpec:
        """What a sandboxed process of this env sees: ``workspace`` at the agent's path, our tools, Python; and
        the task's hub datasets, ``hub``: the writable folder of its datasets cache and whose views it shows
        (``hub_cache.AGENT`` or ``EVALUATOR``; default the agent's shell's)."""
        roots = sandbox_mod.python_roots(self.python) + sandbox_mod.python_roots(sys.executable)  # tools run this one
        binds = [sandbox_mod.Bind(root, root) for root in sandbox_mod.outermost(roots)]
        binds += [
            sandbox_mod.Bind(str(toolset.TOOLS_DIR), sandbox_mod.TOOLS_MOUNT),
            sandbox_mod.Bind(str(HARNESS_DIR), sandbox_mod.HARNESS_MOUNT),
            sandbox_mod.Bind(str(self.folders.commands), sandbox_mod.COMMANDS_MOUNT),
            sandbox_mod.Bind(str(workspace), sandbox_mod.AGENT_WORKSPACE, writable=writable),
        ]
        if self.spec.aliases_file:
            binds.append(sandbox_mod.Bind(str(self.spec.resolve_path(self.spec.aliases_file)), ALIASES_MOUNT))
        if self.hub_views:
            folder, side = hub if hub is not None else (self.hub_folder, hub_cache.AGENT)
            binds += hub_cache.binds(folder, self.hub_views, side)
        if self.models and self.hub_cache_dir:
            binds += hub_cache.model_binds(self.hub_cache_dir, self.models)
        devices: list[str] = []
        if self.gpus:
            devices = sandbox_mod.gpu_devices()
            binds += [sandbox_mod.Bind(folder, folder) for folder in sandbox_mod.gpu_library_folders()]
        hidden = [str(PACKAGE_DIR), str(self.resources.root), *self.layer_folders,
                  *_key_folders([bind.source for bind in binds])]
        if self.spec.root:
            hidden.append(str(Path(self.spec.root).resolve()))
        hidden += [str(source.resolve()) for source in self.files.dataset_sources]  # a data folder may hold answers
        hidden += hub_cache.hidden(self.hub_views)
        # the sandbox's in-memory folders (/tmp, /var/tmp, ~, /dev/shm) count against the memory limit only under a
        # memory cgroup: keep the four together within seven eighths of it in any case
        memory = self.limits.memory_limit_mb
        size = 512 if not memory else max(16, min(512, memory // 4))
        shm = 64 if not memory else max(8, min(64, memory // 8))
        return sandbox_mod.SandboxSpec(binds=binds, hidden=hidden, network=self.network, tmp_size_mb=size,
                                       home_size_mb=size, shm_size_mb=shm, devices=devices)

    def wrap_evaluation(self, argv: list[str], view: Path) -> list[str]:
        """The command line that runs an evaluation's ``argv`` over ``view`` (a copy of the workspace): in a sandbox
        that shows it read-only, in the session's cgroups; unsandboxed, behind ``prefix``."""
        if not self.sandboxed:
            return [*self.prefix, *argv]
        hub = None
        if self.hub_views:
            # Evaluator.start makes the two views of an evaluation, scratch/agent (where the agent's code runs) and
            # scratch/eval (the pristine evaluator's): only the latter sees the scored splits' answers
            side = hub_cache.EVALUATOR if view.name == "eval" else hub_cache.AGENT
            hub = (view.parent / f"hf-{view.name}", side)
            hub_cache.fill(hub[0], self.hub_views, side)
        return [*self._limits_prefix(self.resources.cgroup, self.resources.memory, cgroups.EVAL),
                *sandbox_mod.command(argv, self.sandbox_spec(view, writable=False, hub=hub))]

    def evaluation_usage(self, roots: set[int]) -> cgroups.Usage:
        """The CPU an evaluation used and waited for so far: its cgroup's (``cgroups.Envelope.usage``), else its
        processes' threads' (``roots`` and their descendants), the fallback where no cgroup could be made."""
        envelope = self.resources.envelope
        if envelope is not None:
            return envelope.usage(cgroups.EVAL)
        pids = set(roots)
        for root in roots:
            pids |= procs.descendants(root)
        cpu, waits = cgroups.thread_times(cgroups.process_threads(pids))
        return cgroups.Usage(cpu, None, waits)

    def evaluator(
        self, *, seeds: seeding.EpisodeSeeds, timeout: float, max_output_bytes: int, max_snapshot_bytes: int | None,
        agent_code_in_process: bool, validation_rows: str = "held_out",
    ) -> Evaluator:
        """An ``Evaluator`` of the workspace as it is now, whose processes this confinement starts; the evaluator's
        seed of ``seeds`` reaches its own process only: never the agent's shell, nor where the agent's code runs."""
        extra = {seeding.EVALUATION_SEED_VARIABLE: str(seeds.evaluation), LEGACY_SEED_VARIABLE: str(seeds.evaluation)}
        if self.hub_views and not self.sandboxed:
            extra["HF_DATASETS_CACHE"] = str(self.hub_evaluator_folder)
        return Evaluator(
            entrypoint=self.spec.task_entrypoint,
            workspace=self.folders.workspace,
            evaluation_paths=list(self.spec.evaluation_paths),
            pristine=dict(self.files.pristine),
            task_files=dict(self.files.task_files),
            submission_files=tuple(declared_submission(self.spec)),
            metric_check=functools.partial(past_best_message, spec=self.spec),
            row_split=self.row_split(seeds, validation_rows),
            scratch_root=self.folders.scratch,
            python=self.python,
            env=self.environment(),
            timeout=timeout,
            wrap=self.wrap_evaluation,
            workspace_path=str(self.task_workspace) if self.sandboxed else None,
            secrets=frozenset(self.files.secrets),
            preexec=self.preexec(cgroups.EVAL),  # sandboxed: None, the limits are in the wrap's prefix
            cpu_usage=self.evaluation_usage,
            max_output_bytes=max_output_bytes,
            max_snapshot_bytes=max_snapshot_bytes,
            extra_env=extra,
            agent_seed=seeds.agent,
            limit_events=self.resources.limit_events,
            agent_modules=frozenset(_module_names(self.spec.starter_code)),
            agent_code_in_process=agent_code_in_process,
            submission_schema=submission_schema(self.spec),
            agent_side=frozenset(task_checks.agent_side_files(self.spec)),
        )

    def row_split(self, seeds: seeding.EpisodeSeeds, validation_rows: str) -> held_out.RowSplit | None:
        """The episode's split of the answers' rows between validate and submit (``held_out``), ranked over the ids
        of the task's pristine answers; None when both score every row."""
        schema = submission_schema(self.spec)

        def answers() -> bytes:
            assert schema is not None
            return reference_bytes(schema, dict(self.files.pristine)) or b""

        return held_out.row_split(self.spec, seeds.evaluation, validation_rows, answers)

    def preexec(self, part: str = cgroups.AGENT, cgroup: limits_mod.PidsCgroup | None = None,
                memory: limits_mod.MemoryCgroup | None = None) -> Callable[[], None] | None:
        """What an unsandboxed process runs before its program (join ``cgroup``, ``memory``, default the session's,
        and the envelope's ``part``; set the limits); None when sandboxed, where ``_limits_prefix`` does it."""
        if self.sandboxed:
            return None
        cgroup = cgroup or self.resources.cgroup
        memory = memory or self.resources.memory
        return limits_mod.make_preexec(
            self.limits, self.nproc, self.resources.join_files(part, cgroup, memory), memory_rlimit=memory is None,
            file_size_mb=self.max_file_mb,
        )

    def new_session(
        self, cgroup: limits_mod.PidsCgroup | None, memory: limits_mod.MemoryCgroup | None, *, max_output_bytes: int
    ) -> ShellSession:
        """Start a shell (sandboxed: in a new sandbox) whose processes are in ``cgroup`` and ``memory``."""
        part = self.resources.joining  # the agent's part, or the spare one for a shell started ahead
        prefix: Sequence[str] = self.prefix
        if self.sandboxed:
            # no preexec_fn: with one, Python forks this whole process instead of using vfork (see exec_prefix)
            spec = self.sandbox_spec(self.shown_workspace or self.folders.workspace, writable=True)
            spec.enter = list(self.enter)
            prefix = (*self._limits_prefix(cgroup, memory, part), *sandbox_mod.command([], spec))
        return ShellSession(
            self.folders.workspace,
            self.environment(),
            bash=self.bash,
            prefix=prefix,
            preexec=self.preexec(part, cgroup, memory),
            max_output_bytes=max_output_bytes,
            extra_kill=self.resources.members_of_part(part, cgroup),
            sandboxed=self.sandboxed,
            meter=self.resources.cpu_meter(part),
        )

    def setup_script(self, *, tools: bool, source_files: list[str]) -> str:
        """What a new shell runs before the agent's first command: tool variables, aliases, the tools (``tools``),
        the sourced command files (``source_files``, by name), and ``cd`` into the workspace."""
        lines = []
        if self.prefix and not self.sandboxed:
            lines.append("command -v ip >/dev/null 2>&1 && ip link set lo up >/dev/null 2>&1")
        lines.append(toolset.reset_variables_script())
        if self.spec.aliases_file:
            aliases = ALIASES_MOUNT if self.sandboxed else self.spec.resolve_path(self.spec.aliases_file)
            lines += ["shopt -s expand_aliases", f"source {quote(aliases)}"]
        if tools:
            lines.append(self.tools_script())
        lines += [self.source_command(name) for name in source_files]
        lines.append(f"cd {quote(self.task_workspace)}")
        return "\n".join(lines)

    def tools_script(self) -> str:
        """The script that defines the tool commands in a shell."""
        return toolset.install_script(sandbox_mod.TOOLS_MOUNT if self.sandboxed else None)

    def source_command(self, name: str) -> str:
        """The line that sources the ``add_commands`` file ``name`` in the agent's shell."""
        return f"source {quote(self.commands_path() + '/' + name)}"

    def _limits_prefix(
        self, cgroup: limits_mod.PidsCgroup | None, memory: limits_mod.MemoryCgroup | None, part: str
    ) -> list[str]:
        """The shell prefix that puts a sandbox in this env's cgroups (the envelope's ``part`` among them) and limits
        (``limits.exec_prefix``): with a ``preexec_fn`` instead, Python would fork the whole driver, a trainer
        holding a model included."""
        joins = self.resources.join_files(part, cgroup, memory)
        return limits_mod.exec_prefix(self.bash, self.limits, self.nproc, joins, memory_rlimit=memory is None,
                                      file_size_mb=self.max_file_mb)


def quote(value: object) -> str:
    """``value`` as one shell word."""
    return shlex.quote(str(value))


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
