"""Adapter to the real MLGym (facebookresearch/MLGym, installed from its git checkout), in docker or podman.

``MLGymBackend`` registers the task with MLGym, builds ``gym.make("mlgym/<id>", devices=[...])`` and exposes it
through the backend contract (``backends/protocol.py``): reset as TorchRL does (``reset_container``, ``cd``,
``reset``), tools from MLGym's agent config (the ``state`` command and env variables through ``communicate``, the
command files through ``add_commands``, MLGym's own ``command_docs``), and MLGym's ``step`` 4-tuple unchanged.

What the adapter adds to MLGym (see ``docs/differences.md``):

- ``info["score"]`` accumulates over the episode, as the contract says (MLGym builds a fresh ``info`` every step and
  only its agent accumulates scores);
- the task config MLGym reads is always written from the spec as it is now (overrides, replays' starter files,
  ``spec.replace(...)``), with the spec's datasets as dataset configs; tasks whose ``secret_files`` or
  ``protected_files`` MLGym cannot enforce are refused unless ``allow_unprotected_files=True``;
- ``reset(seed=...)`` reaches MLGym's task, and an evaluation seed derived from it (``seeding.py``: the episode's in
  the seed's stream, never the raw seed) is exported as ``MLGYM_REGISTRY_EVAL_SEED`` in the container's shell, where
  MLGym runs the evaluator. The agent's shell is that shell, so there the agent can read the evaluator's seed;
- ``returncode`` after a step is the action's, not that of MLGym's ``export LAST_ACTION=...``;
- everything MLGym needs is checked at ``make()``, before a container starts: MLGym and its Python dependencies, the
  engine's command line, the Docker Engine API that MLGym reaches through docker-py (``DOCKER_HOST``, for podman
  too), the image, the task's entrypoint, dataset configs and starter files.

MLGym is imported lazily, only when a backend is made. Each missing piece is a ``BackendUnavailable`` naming the fix.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import seeding
from ..errors import BackendUnavailable, InvalidTaskError
from ..specs import TaskSpec
from .protocol import ToolSet, new_info

CHECKOUT_URL = "https://github.com/facebookresearch/MLGym"
CONTAINER_TYPES = ("docker", "podman")
DEFAULT_IMAGE = "aigym/mlgym-agent:latest"
"""MLGym's default image (``EnvironmentArguments.image_name``); MLGym never pulls it itself."""
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
"""Where docker-py (``docker.from_env()``, which MLGym calls) looks for the Engine API when ``DOCKER_HOST`` is unset."""
SEED_VARIABLE = seeding.EVALUATION_SEED_VARIABLE
_DATASET_FIELDS = ("name", "description", "data_path", "is_local", "train_split", "valid_split", "test_split")
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
    """Raise ``BackendUnavailable`` unless ``container_type`` (docker or podman) is on PATH and answers ``info``.

    MLGym runs ``<engine> run``, ``<engine> cp`` and ``<engine> exec`` through this command line."""
    if container_type not in CONTAINER_TYPES:
        raise BackendUnavailable(f"container_type={container_type!r}: MLGym runs in {' or '.join(CONTAINER_TYPES)}")
    executable = shutil.which(container_type)
    other = next(t for t in CONTAINER_TYPES if t != container_type)
    if executable is None:
        raise BackendUnavailable(
            f"No container engine answers: `{container_type}` is not on PATH. MLGym runs its tasks in containers; "
            f"install {container_type} (or pass container_type={other!r} if {other} is installed) and get "
            f"MLGym's image (`{container_type} pull {DEFAULT_IMAGE}`)."
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


def podman_socket() -> Path:
    """Where podman's rootless API socket is when ``podman.socket`` runs (MLGym's README points DOCKER_HOST at it)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return Path(runtime) / "podman" / "podman.sock"


def docker_host() -> str:
    """The Engine API address docker-py's ``docker.from_env()`` uses: ``DOCKER_HOST``, else the default socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def engine_api_get(host: str, path: str, timeout: float = 10) -> tuple[int, Any] | None:
    """``GET path`` on the Docker Engine API at ``host`` (``unix://`` or ``tcp://``): ``(status, JSON body)``.

    None when ``host`` cannot be probed without docker-py (TLS, ``ssh://``, ``npipe://``). Raises ``OSError`` when
    nothing answers."""
    url = urllib.parse.urlsplit(host)
    if url.scheme in ("unix", "http+unix"):
        connection: http.client.HTTPConnection = _UnixConnection(url.path, timeout)
    elif url.scheme in ("tcp", "http") and not os.environ.get("DOCKER_TLS_VERIFY"):
        connection = http.client.HTTPConnection(url.hostname or "localhost", url.port or 2375, timeout=timeout)
    else:
        return None
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    except http.client.HTTPException as exc:
        raise OSError(f"not an Engine API: {exc}") from exc
    finally:
        connection.close()
    try:
        return response.status, json.loads(body or b"null")
    except ValueError as exc:
        raise OSError(f"not an Engine API: {path} answered {body[:80]!r}") from exc


def _api_fix(container_type: str) -> str:
    if container_type == "podman":
        return (
            "Start podman's API socket and point DOCKER_HOST at it: `systemctl --user start podman.socket` then "
            f"`export DOCKER_HOST=unix://{podman_socket()}` (macOS: `podman machine start`, then DOCKER_HOST as "
            "MLGym's README shows)."
        )
    return "Start the docker daemon (`sudo systemctl start docker`), or export DOCKER_HOST=<its API address>."


def check_engine_api(container_type: str, image_name: str, timeout: float = 10) -> None:
    """Raise ``BackendUnavailable`` unless the Docker Engine API MLGym uses answers, belongs to ``container_type``
    and holds ``image_name``.

    MLGym reaches the engine through docker-py's ``docker.from_env()`` for podman as well as docker (``DOCKER_HOST``,
    default ``unix:///var/run/docker.sock``): it lists images to find its image, then finds its container and runs
    ``exec`` and ``remove`` through that API. The command-line check alone would pass on a host where none of that
    works, and ``reset()`` would fail with MLGym's plain ``RuntimeError``."""
    host = docker_host()
    where = f"DOCKER_HOST={host}" if os.environ.get("DOCKER_HOST") else f"{host} (DOCKER_HOST is unset)"
    hint = ""
    if container_type == "podman" and not os.environ.get("DOCKER_HOST") and podman_socket().exists():
        hint = f" podman's socket is at {podman_socket()}: `export DOCKER_HOST=unix://{podman_socket()}`."
    try:
        answer = engine_api_get(host, "/version", timeout)
    except OSError as exc:
        raise BackendUnavailable(
            f"No Docker Engine API answers at {where}: {exc}. MLGym talks to {container_type} through that API "
            f"(docker-py's docker.from_env(), for podman too) as well as through its command line.{hint} "
            f"{_api_fix(container_type)}"
        ) from exc
    if answer is None:
        return  # an address only docker-py itself can reach; MLGym will say if it does not answer
    status, version = answer
    if status != 200 or not isinstance(version, dict):
        raise BackendUnavailable(
            f"The Docker Engine API at {where} answered GET /version with HTTP {status}. {_api_fix(container_type)}"
        )
    components = " ".join(str(c.get("Name", "")) for c in version.get("Components") or [] if isinstance(c, dict))
    api_engine = "podman" if "podman" in f"{components} {version.get('Platform', '')}".lower() else "docker"
    if api_engine != container_type:
        raise BackendUnavailable(
            f"The Docker Engine API at {where} is {api_engine}'s, but container_type={container_type!r}: MLGym would "
            f"look for its image and container in {api_engine} and start them with {container_type}. "
            f"Pass container_type={api_engine!r}, or point DOCKER_HOST at {container_type}'s API. "
            f"{_api_fix(container_type)}"
        )
    query = urllib.parse.urlencode({"filters": json.dumps({"reference": [image_name]})})
    try:
        status, images = engine_api_get(host, f"/images/json?{query}", timeout) or (200, [None])
    except OSError as exc:
        raise BackendUnavailable(f"The Docker Engine API at {where} failed to list images: {exc}") from exc
    if status != 200 or not images:
        raise BackendUnavailable(
            f"The container image {image_name!r} is not in {container_type}'s image store (MLGym never pulls it). "
            f"Get it with `{container_type} pull {image_name}`"
            + (
                f", or build it in the MLGym checkout: `{container_type} build -f dockerfiles/mlgym.dockerfile "
                f"-t {image_name} .`"
                if image_name == DEFAULT_IMAGE
                else f" (MLGym's own image is {DEFAULT_IMAGE})"
            )
            + "."
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
                env_module = self._import("mlgym.environment.env")
                registration = self._import("mlgym.environment.registration")
                self.agent_config = self._load_agent_config()
                self._check_task_files()
                self.env_args = self._environment_arguments(
                    env_module, image_name, aliases_file, environment_options or {}
                )
                self._check_entrypoint()
                check_engine_api(container_type, self.env_args.image_name)
                registration.register_task(self.env_args)
                import gymnasium as gym

                self.env = gym.make(f"mlgym/{self.env_args.task.id}", devices=self.devices).unwrapped
        except BaseException:
            self.close()
            raise

    # -- construction --------------------------------------------------------------------------------------------
    def _import(self, module: str) -> Any:
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            missing = getattr(exc, "name", None) or str(exc)
            raise BackendUnavailable(
                f"MLGym ({self.root}) is installed without its dependencies: importing {module} failed ({exc}). "
                f"Install the checkout with them: `pip install -e {self.root}`"
                + (" (docker-py, which MLGym uses to reach the container engine, is `pip install docker`)"
                   if missing == "docker" else "")
                + "."
            ) from exc

    def _load_agent_config(self) -> Any:
        agent = self._import("mlgym.agent.base")
        return agent.AgentConfig.load_yaml(self.agent_config_path)

    def _check_task_files(self) -> None:
        """Every host file MLGym copies in at ``reset()`` exists, and this checkout has the dataset configs."""
        spec, problems = self.spec, []
        paths = [("starter_code", item) for item in spec.starter_code]
        if spec.sample_submission:
            paths.append(("sample_submission", spec.sample_submission))
        if not spec.use_generic_conda and spec.requirements_path:
            paths.append(("requirements_path", spec.requirements_path))
        for dataset in spec.datasets:
            if dataset.get("is_local"):
                paths.append((f"datasets[{dataset.get('name', '?')}].data_path", str(dataset.get("data_path"))))
        for field_name, item in paths:
            resolved = self.spec.resolve_path(item)
            if not resolved.exists():
                problems.append(f"{field_name} {item!r} (looked for {str(resolved)!r})")
        if not spec.datasets:
            for item in spec.dataset_configs:
                if not (self.root / "configs" / item).is_file():
                    problems.append(f"dataset_configs {item!r} (not in {self.root / 'configs'})")
        if problems:
            raise BackendUnavailable(
                f"task {spec.id!r} cannot run on the MLGym checkout {self.root}: missing " + "; ".join(problems)
                + ". Use the MLGym checkout the task comes from (`pip install -e <that checkout>`), or put the "
                "task's files back."
            )

    def _check_entrypoint(self) -> None:
        tasks = self._import("mlgym.environment.tasks")
        try:
            tasks.AbstractMLTask.get(self.spec.task_entrypoint)
        except (KeyError, ValueError) as exc:
            raise BackendUnavailable(
                f"task {self.spec.id!r} needs MLGym's task class {self.spec.task_entrypoint!r} (task_entrypoint), "
                f"which the MLGym at {self.root} does not have. Update the checkout (`git -C {self.root} pull`) "
                f"and reinstall it (`pip install -e {self.root}`)."
            ) from exc

    def _task_config_path(self) -> str:
        """A task config for MLGym, written from the spec as it is now (never the checkout's own YAML)."""
        import yaml

        self._tmp = tempfile.TemporaryDirectory(prefix="mlgym-registry-task-")
        folder = Path(self._tmp.name)
        data = {key: getattr(self.spec, key) for key in _TASK_FIELDS}
        for key in _PATH_FIELDS:
            value = data[key]
            if isinstance(value, list):
                data[key] = [str(self.spec.resolve_path(item).resolve()) for item in value]
            elif value:
                data[key] = str(self.spec.resolve_path(value).resolve())
        if self.spec.datasets:
            data["dataset_configs"] = [self._write_dataset(folder, i, d) for i, d in enumerate(self.spec.datasets)]
        data = {key: value for key, value in data.items() if value is not None}
        path = folder / f"{self.spec.id}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return str(path)  # MLGym joins it onto configs/, which keeps an absolute path as it is

    def _write_dataset(self, folder: Path, index: int, dataset: dict[str, Any]) -> str:
        import yaml

        data = {key: dataset[key] for key in _DATASET_FIELDS if dataset.get(key) is not None}
        data.setdefault("name", f"dataset{index}")
        data.setdefault("description", "")
        if data.get("is_local"):
            data["data_path"] = str(self.spec.resolve_path(str(data["data_path"])).resolve())
        path = folder / "datasets" / f"{index}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return str(path)

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


def refuse_unprotected_files(spec: TaskSpec) -> None:
    """Raise ``InvalidTaskError`` for a task with ``secret_files`` or ``protected_files``: MLGym cannot keep them.

    What ``mlgym_source`` adds to MLGym's own task files does not count: the evaluator's modules it protects (a game's
    opponent) and the overlay's evaluator-only files (titanic's ground truth). The task file asks for neither, and
    this backend runs the task exactly as MLGym does: those files stay readable by the agent there."""
    from ..tasks import mlgym_overlay, mlgym_source

    ours = mlgym_source.TAG in spec.tags
    inferred = set(mlgym_source.evaluator_modules(spec)) if ours else set()
    overlay = set(mlgym_overlay.overlay_secret_files(spec.id)) if ours else set()
    protected = [p for p in spec.protected_files if p not in inferred]
    secret = [p for p in spec.secret_files if p not in overlay]
    fields = {name: value for name, value in (("secret_files", secret), ("protected_files", protected)) if value}
    if not fields:
        return
    named = " and ".join(f"{name}={value}" for name, value in fields.items())
    raise InvalidTaskError(
        f"task {spec.id!r} has {named}, which the mlgym backend cannot enforce: MLGym copies every starter file and "
        "dataset into the agent's workspace and runs the evaluator in the agent's own shell, so the agent could read "
        "the secret files and change the protected ones (and with them its score). Run the task on "
        "backend='local', which enforces both, or pass the backend option allow_unprotected_files=True to run it on "
        "MLGym with those files open to the agent."
    )
