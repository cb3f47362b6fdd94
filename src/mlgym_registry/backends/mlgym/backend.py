"""``MLGymBackend``: the real MLGym env, registered and built from the spec, behind the backend contract (see the
package's docstring for what the adapter adds to MLGym)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ... import seeding
from ...errors import BackendUnavailable
from ...options import BOOLEAN, SEED, Rule, instance_of, one_of
from ...specs import TaskSpec
from ..protocol import ToolSet, new_info
from .checkout import command_file_entry, import_from_checkout, in_directory, mlgym_checkout
from .engine import DEFAULT_IMAGE, check_container_engine, check_engine_api
from .task_checks import check_entrypoint, check_task_files, refuse_unprotected_files
from .task_config import write_task_config

SEED_VARIABLE = seeding.EVALUATION_SEED_VARIABLE


class MLGymBackend:
    """The real MLGym env behind the backend contract.

    Args:
        spec: the task. MLGym always gets a task config written from the spec as it is (to a temporary folder that
            ``close()`` removes): paths made absolute, the spec's datasets as dataset configs.
        container_type: ``"docker"`` (MLGym's default) or ``"podman"``. Either way MLGym also needs the Docker
            Engine API (``DOCKER_HOST``); see ``check_engine_api``.
        devices: MLGym's ``devices`` (``["cpu_0"]``, or GPU ids).
        agent_config: an MLGym agent YAML whose tools are installed (default: the checkout's
            ``configs/agents/default.yaml``).
        image_name: the container image (default: MLGym's ``aigym/mlgym-agent:latest``; it must exist locally).
        seed: MLGym's task seed (MLGym's default 42 when None); each episode exports an evaluation seed derived from
            it and the episode's index as ``MLGYM_REGISTRY_EVAL_SEED`` in the container's shell, which our tasks'
            evaluators read (and the agent can read too: MLGym evaluates in the agent's shell). ``reset(seed=...)``
            starts a new stream of episodes, later resets continue it.
        aliases_file: bash aliases to source (default: the spec's ``aliases_file``, else the checkout's
            ``dockerfiles/aliases.sh`` when present).
        allow_unprotected_files: run a task with ``secret_files`` or ``protected_files`` although MLGym shows those
            files to the agent and lets it change them (refused by default).
        environment_options: further ``EnvironmentArguments`` fields.
    """

    option_rules: dict[str, Rule] = {
        "container_type": one_of("docker", "podman"),
        "devices": Rule("a list of MLGym device names (['cpu_0'], ['0', '1'])",
                        lambda value: isinstance(value, (list, tuple)) and all(isinstance(d, str) for d in value)),
        "agent_config": instance_of("an agent YAML path", str, os.PathLike, optional=True),
        "image_name": instance_of("an image name", str, optional=True),
        "seed": SEED,
        "aliases_file": instance_of("a bash aliases file path", str, os.PathLike, optional=True),
        "allow_unprotected_files": BOOLEAN,
        "environment_options": instance_of("a dict of EnvironmentArguments fields", dict, optional=True),
    }
    """The rules of these parameters, which ``registry.make`` checks before the backend is built (``options.py``)."""

    @staticmethod
    def check_available(*, container_type: str = "docker", image_name: str | None = None, **_options: Any) -> None:
        """What ``registry.make`` checks before building anything: MLGym is installed from its checkout, the engine
        answers on its command line and its Engine API, and the image is there; ``BackendUnavailable`` otherwise."""
        mlgym_checkout()
        check_container_engine(container_type)
        check_engine_api(container_type, image_name or DEFAULT_IMAGE)

    def __init__(
        self,
        spec: TaskSpec,
        *,
        container_type: str = "docker",
        devices: Sequence[str] = ("cpu_0",),
        agent_config: str | Path | None = None,
        image_name: str | None = None,
        seed: int | None = None,
        aliases_file: str | Path | None = None,
        allow_unprotected_files: bool = False,
        environment_options: dict[str, Any] | None = None,
    ):
        self.spec = spec
        self.env: Any = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.root = mlgym_checkout()
        if not allow_unprotected_files:
            refuse_unprotected_files(spec)
        check_container_engine(container_type)
        self.container_type = container_type
        self.devices = list(devices)
        self.seed = seed
        self.episode = -1
        """The current episode's index in the stream of ``seed`` (0 after ``reset(seed=...)``)."""
        self._scores: list[Any] = []
        self._action_returncode: int | None = None
        default_agent = self.root / "configs" / "agents" / "default.yaml"
        self.agent_config_path = Path(agent_config) if agent_config else default_agent
        if not self.agent_config_path.is_file():
            raise BackendUnavailable(f"MLGym agent config {str(self.agent_config_path)!r} does not exist")
        try:
            with in_directory(self.root):
                env_module = import_from_checkout(self.root, "mlgym.environment.env")
                registration = import_from_checkout(self.root, "mlgym.environment.registration")
                self.agent_config = self._load_agent_config()
                check_task_files(self.spec, self.root)
                self.env_args = self._environment_arguments(
                    env_module, image_name, aliases_file, environment_options or {}
                )
                check_entrypoint(self.spec, self.root, import_from_checkout(self.root, "mlgym.environment.tasks"))
                check_engine_api(container_type, self.env_args.image_name)
                registration.register_task(self.env_args)
                import gymnasium as gym

                self.env = gym.make(f"mlgym/{self.env_args.task.id}", devices=self.devices).unwrapped
        except BaseException:
            self.close()
            raise

    # -- construction --------------------------------------------------------------------------------------------
    def _load_agent_config(self) -> Any:
        agent = import_from_checkout(self.root, "mlgym.agent.base")
        return agent.AgentConfig.load_yaml(self.agent_config_path)

    def _task_config_path(self) -> str:
        """A task config for MLGym, written from the spec as it is now (never the checkout's own YAML)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="mlgym-registry-task-")
        return write_task_config(self.spec, Path(self._tmp.name))

    def _environment_arguments(
        self, env_module: Any, image_name: str | None, aliases_file: str | Path | None, options: dict[str, Any]
    ) -> Any:
        aliases_file = aliases_file or self.spec.aliases_file
        if aliases_file is None and (self.root / "dockerfiles" / "aliases.sh").is_file():
            aliases_file = self.root / "dockerfiles" / "aliases.sh"
        arguments = {
            "task_config_path": self._task_config_path(),
            "max_steps": self.spec.max_steps,
            "container_type": self.container_type,
            "verbose": False,
            # a computed baseline would otherwise be written back into the task config
            "cache_baseline_scores": False,
            **({"seed": self.seed} if self.seed is not None else {}),
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
        """Return code of the last ``communicate``, or after a step the action's (not MLGym's ``export
        LAST_ACTION`` nor an evaluation's)."""
        if self._action_returncode is not None:
            return self._action_returncode
        return self.env.returncode

    @property
    def task(self) -> Any:
        """MLGym's task object (``task.args`` is its ``TaskConfig`` dataclass)."""
        return self.env.task

    @property
    def task_workspace(self) -> Path:
        """The agent's workspace inside the container (there is no ``host_workspace``: it is not on this host)."""
        return Path(self.env.task_workspace)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """A fresh container session and task workspace (``reset_container``, ``cd``, ``reset``), as TorchRL does;
        ``seed`` becomes MLGym's task seed and starts a stream of episodes whose evaluation seeds (derived, see
        ``seeding.py``) are exported as ``MLGYM_REGISTRY_EVAL_SEED`` in the shell; later resets continue the stream."""
        if seed is not None:
            self.seed, self.episode = seed, -1
        self.episode += 1
        self._scores = []
        self._action_returncode = None
        with in_directory(self.root):
            if self.seed is not None:
                self.env.seed = self.seed  # MLGym builds the task with env.seed at every reset
            try:
                self.env.reset_container()
            except RuntimeError as exc:
                raise BackendUnavailable(f"MLGym could not start its {self.container_type} container: {exc}") from exc
            self.env.communicate(f"cd {Path(self.env.task_workspace).parent}")
            if self.seed is not None:
                # MLGym runs evaluators in this shell, so they see it (our tasks' evaluators read it)
                evaluation_seed = seeding.EpisodeSeeds.draw(self.seed, self.episode).evaluation
                self.env.communicate(f"export {SEED_VARIABLE}={evaluation_seed}")
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
        """MLGym's ``step``: ``(observation, reward, done, info)``, ``info`` a plain dict whose ``score`` holds
        every metric dict of the episode so far (MLGym's holds only this step's)."""
        self._action_returncode = None
        with in_directory(self.root), self._recording_returncode(action) as recorded:
            observation, reward, done, info = self.env.step(action)
        self._action_returncode = recorded[0] if recorded else None
        info = {**new_info(), **dict(info or {})}
        self._scores.extend(info["score"] or [])
        info["score"] = list(self._scores)
        return observation, reward, done, info

    @contextlib.contextmanager
    def _recording_returncode(self, action: str) -> Iterator[list[int | None]]:
        """Record the return code of the action itself: MLGym's ``step`` runs ``export LAST_ACTION=...`` after it
        (and an evaluation may follow), each of which overwrites ``env.returncode``."""
        env, recorded = self.env, []
        run = env._communicate
        command = action.strip()

        def recording(*args: Any, **kwargs: Any) -> str:
            output = run(*args, **kwargs)
            if not recorded and (args[0] if args else kwargs.get("input")) == command:
                recorded.append(env.returncode)
            return output

        env._communicate = recording
        try:
            yield recorded
        finally:
            with contextlib.suppress(AttributeError):
                del env._communicate

    def communicate(
        self, input: str, timeout_duration: float = 25, no_output_timeout_duration: float | None = None
    ) -> str:
        """Run ``input`` in the container's shell."""
        self._action_returncode = None
        kwargs = {}
        if no_output_timeout_duration is not None:
            kwargs["no_output_timeout_duration"] = no_output_timeout_duration
        return self.env.communicate(input, timeout_duration=timeout_duration, **kwargs)

    def add_commands(self, commands: list[dict[str, str]]) -> None:
        """Copy tool files into the container."""
        with in_directory(self.root):
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
