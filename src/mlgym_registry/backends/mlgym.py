"""Adapter to the real MLGym (facebookresearch/MLGym, installed from its git checkout), in docker or podman.

``MLGymBackend`` registers the task with MLGym, builds ``gym.make("mlgym/<id>", devices=[...])`` and exposes it
through the backend contract (``backends/protocol.py``): reset as TorchRL does (``reset_container``, ``cd``,
``reset``), tools from MLGym's agent config (the ``state`` command and env variables through ``communicate``, the
command files through ``add_commands``, MLGym's own ``command_docs``), and MLGym's ``step`` 4-tuple unchanged.

MLGym is imported lazily, only when a backend is made. Each missing piece is a ``BackendUnavailable`` naming the fix.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import BackendUnavailable
from ..specs import TaskSpec
from .protocol import ToolSet, new_info

CHECKOUT_URL = "https://github.com/facebookresearch/MLGym"
CONTAINER_TYPES = ("podman", "docker")
_TASK_FIELDS = (
    "id", "name", "description", "task_entrypoint", "training_timeout", "use_generic_conda", "requirements_path",
    "benchmark_name", "dataset_configs", "starter_code", "baseline_paths", "baseline_scores", "sample_submission",
    "evaluation_paths", "evaluation_read_only", "secret_files", "memory_path",
)
_PATH_FIELDS = ("starter_code", "requirements_path", "sample_submission")


def mlgym_checkout() -> Path:
    """The root of the MLGym checkout the installed ``mlgym`` package comes from (without importing it)."""
    spec = importlib.util.find_spec("mlgym")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(
            "The mlgym backend needs MLGym (facebookresearch/MLGym), which is not installed. Clone it and install "
            f"the checkout: `git clone {CHECKOUT_URL}` then `pip install -e <MLGym checkout>`. The package named "
            "mlgym on PyPI is an unrelated project: do not install MLGym from PyPI."
        )
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    root = package.parent
    if not (root / "configs").is_dir():
        raise BackendUnavailable(
            f"The installed `mlgym` package ({package}) is not facebookresearch/MLGym: it has no `configs` folder "
            "next to it, which is what PyPI's unrelated `mlgym` package looks like. Run `pip uninstall mlgym`, then "
            f"`pip install -e <MLGym checkout>` (git clone {CHECKOUT_URL})."
        )
    return root


def check_container_engine(container_type: str, timeout: float = 20) -> None:
    """Raise ``BackendUnavailable`` unless ``container_type`` (podman or docker) answers ``<engine> info``."""
    if container_type not in CONTAINER_TYPES:
        raise BackendUnavailable(f"container_type={container_type!r}: MLGym runs in {' or '.join(CONTAINER_TYPES)}")
    executable = shutil.which(container_type)
    other = next(t for t in CONTAINER_TYPES if t != container_type)
    if executable is None:
        raise BackendUnavailable(
            f"No container engine answers: `{container_type}` is not on PATH. MLGym runs its tasks in containers; "
            f"install {container_type} (or pass container_type={other!r} if {other} is installed) and build "
            "MLGym's image as its README says."
        )
    try:
        result = subprocess.run(
            [executable, "info"], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailable(
            f"No container engine answers: `{container_type} info` failed ({exc}). Start the {container_type} "
            f"service (or pass container_type={other!r})."
        ) from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise BackendUnavailable(
            f"No container engine answers: `{container_type} info` exited with {result.returncode}"
            f"{': ' + detail[-1] if detail else ''}. Start the {container_type} service or fix its permissions "
            f"(or pass container_type={other!r})."
        )


@contextlib.contextmanager
def in_directory(path: Path) -> Iterator[None]:
    """Run inside ``path``: MLGym resolves task files against the process's working directory."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def command_file_entry(path: str | Path) -> dict[str, str]:
    """A tool file as MLGym's ``add_commands`` takes it (``name``, ``contents``, ``type``), typed as MLGym's agent
    types it: scripts with a shebang run, ``*.sh`` files are sourced, ``_*`` files are utilities."""
    path = Path(path)
    contents = path.read_text()
    if contents.strip().startswith("#!"):
        return {"name": path.name.rsplit(".", 1)[0], "contents": contents, "type": "script"}
    if path.name.endswith(".sh"):
        return {"name": path.name, "contents": contents, "type": "source_file"}
    if path.name.startswith("_"):
        return {"name": path.name, "contents": contents, "type": "utility"}
    raise ValueError(
        f"tool file {str(path)!r} neither starts with a shebang nor ends in .sh; MLGym cannot install it"
    )


class MLGymBackend:
    """The real MLGym env behind the backend contract.

    Args:
        spec: the task. A task from the checkout's ``configs/tasks`` is used as is; any other is written to a
            temporary MLGym task config (paths made absolute) that is removed on ``close()``.
        container_type: ``"podman"`` or ``"docker"``.
        devices: MLGym's ``devices`` (``["cpu_0"]``, or GPU ids).
        agent_config: an MLGym agent YAML whose tools are installed (default: the checkout's
            ``configs/agents/default.yaml``).
        image_name: the container image (default: MLGym's ``aigym/mlgym-agent:latest``; it must exist locally).
        seed: MLGym's task seed.
        aliases_file: bash aliases to source (default: the checkout's ``dockerfiles/aliases.sh`` when present).
        environment_options: further ``EnvironmentArguments`` fields.
    """

    def __init__(
        self,
        spec: TaskSpec,
        *,
        container_type: str = "podman",
        devices: Sequence[str] = ("cpu_0",),
        agent_config: str | Path | None = None,
        image_name: str | None = None,
        seed: int = 42,
        aliases_file: str | Path | None = None,
        environment_options: dict[str, Any] | None = None,
    ):
        self.spec = spec
        self.root = mlgym_checkout()
        check_container_engine(container_type)
        self.container_type = container_type
        self.devices = list(devices)
        default_agent = self.root / "configs" / "agents" / "default.yaml"
        self.agent_config_path = Path(agent_config) if agent_config else default_agent
        if not self.agent_config_path.is_file():
            raise BackendUnavailable(f"MLGym agent config {str(self.agent_config_path)!r} does not exist")
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.env: Any = None
        with in_directory(self.root):
            self.agent_config = self._load_agent_config()
            self.env_args = self._environment_arguments(seed, image_name, aliases_file, environment_options or {})
            registration = importlib.import_module("mlgym.environment.registration")
            registration.register_task(self.env_args)
            import gymnasium as gym

            self.env = gym.make(f"mlgym/{self.env_args.task.id}", devices=self.devices).unwrapped

    # -- construction --------------------------------------------------------------------------------------------
    def _load_agent_config(self) -> Any:
        agent = importlib.import_module("mlgym.agent.base")
        return agent.AgentConfig.load_yaml(self.agent_config_path)

    def _task_config_path(self) -> str:
        configs = (self.root / "configs").resolve()
        source = Path(self.spec.source).resolve() if self.spec.source else None
        if source is not None and source.is_relative_to(configs):
            return str(source.relative_to(configs))
        import yaml

        self._tmp = tempfile.TemporaryDirectory(prefix="mlgym-registry-task-")
        data = {key: getattr(self.spec, key) for key in _TASK_FIELDS}
        for key in _PATH_FIELDS:
            value = data[key]
            if isinstance(value, list):
                data[key] = [str(self.spec.resolve_path(item).resolve()) for item in value]
            elif value:
                data[key] = str(self.spec.resolve_path(value).resolve())
        data = {key: value for key, value in data.items() if value is not None}
        path = Path(self._tmp.name) / f"{self.spec.id}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return str(path)  # MLGym joins it onto configs/, which keeps an absolute path as it is

    def _environment_arguments(
        self, seed: int, image_name: str | None, aliases_file: str | Path | None, options: dict[str, Any]
    ) -> Any:
        env_module = importlib.import_module("mlgym.environment.env")
        if aliases_file is None and (self.root / "dockerfiles" / "aliases.sh").is_file():
            aliases_file = self.root / "dockerfiles" / "aliases.sh"
        arguments = {
            "task_config_path": self._task_config_path(),
            "max_steps": self.spec.max_steps,
            "seed": seed,
            "container_type": self.container_type,
            "verbose": False,
            # a computed baseline would otherwise be written back into the checkout's task YAML
            "cache_baseline_scores": False,
            **({"aliases_file": str(aliases_file)} if aliases_file else {}),
            **({"image_name": image_name} if image_name else {}),
            **options,
        }
        return env_module.EnvironmentArguments(**arguments)

    # -- the contract --------------------------------------------------------------------------------------------
    @property
    def current_step(self) -> int:
        """Steps taken in this episode."""
        return self.env.current_step

    @property
    def max_steps(self) -> int:
        """MLGym's step budget."""
        return self.env.max_steps

    @property
    def returncode(self) -> int | None:
        """Return code of the last ``communicate``."""
        return self.env.returncode

    @property
    def task(self) -> Any:
        """MLGym's task object (``task.args`` is its ``TaskConfig`` dataclass)."""
        return self.env.task

    @property
    def task_workspace(self) -> Path:
        """The agent's workspace inside the container."""
        return Path(self.env.task_workspace)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """A fresh container session and task workspace (``reset_container``, ``cd``, ``reset``), as TorchRL does."""
        with in_directory(self.root):
            self.env.reset_container()
            self.env.communicate(f"cd {Path(self.env.task_workspace).parent}")
            observation, info = self.env.reset(seed=seed, options=options)
        return dict(observation or {"observation": None}), dict(info or {})

    def install_tools(self) -> ToolSet:
        """Define the ``state`` command and env variables, copy in the command files; MLGym's ``command_docs``."""
        tools = self.agent_config.tools_handler
        state = tools.state_command
        variables = dict(tools.env_variables)
        script = "\n".join([state.code] + [f"{key}={value}" for key, value in variables.items()])
        output = self.communicate(script)
        if self.returncode not in (0, None):
            raise RuntimeError(f"defining MLGym's tools failed with return code {self.returncode}: {output}")
        with in_directory(self.root):
            self.env.add_commands([command_file_entry(path) for path in tools.config.command_files])
        return ToolSet(command_docs=tools.command_docs, env_variables=variables, state_command=state.name)

    def step(self, action: str) -> tuple[str | None, float, bool, dict[str, Any]]:
        """MLGym's ``step``: ``(observation, reward, done, info)``, ``info`` as a plain dict."""
        with in_directory(self.root):
            observation, reward, done, info = self.env.step(action)
        return observation, reward, done, {**new_info(), **dict(info or {})}

    def communicate(
        self, input: str, timeout_duration: float = 25, no_output_timeout_duration: float | None = None
    ) -> str:
        """Run ``input`` in the container's shell."""
        kwargs = {}
        if no_output_timeout_duration is not None:
            kwargs["no_output_timeout_duration"] = no_output_timeout_duration
        return self.env.communicate(input, timeout_duration=timeout_duration, **kwargs)

    def add_commands(self, commands: list[dict[str, str]]) -> None:
        """Copy tool files into the container."""
        self.env.add_commands(commands)

    def close(self) -> None:
        """Stop the container and remove the temporary task config. Safe to call twice."""
        env, self.env = self.env, None
        try:
            if env is not None:
                env.close()
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
