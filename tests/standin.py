"""A stand-in backend for tests and benchmarks: honours the MLGym env contract, costs nothing, runs nothing.

    backend = StandinBackend(spec, outputs=["file1  file2", ""], scores=[{"Score": 2.5}, {"Score": 2.6}])

- ``step(action)`` records ``action`` in ``actions`` and answers, in order of precedence:
  past ``max_steps`` -> autosubmission (``"Exited (max_steps)"``, done); ``submit`` -> ``"Exited (submit)"``, done
  (MLGym's ``exit_*`` actions: an autosubmission),
  ``info["score"]`` gets the next score; ``validate`` -> MLGym's validation text with the baseline and the next score,
  ``info["score"]`` gets it; otherwise the next scripted output (``outputs``: strings, or one callable
  ``outputs(action) -> str``), then ``"ok"`` once the script runs out. Output that prints MLGym's markers
  (``<<VALIDATION||``, ``<<SUBMISSION||``) counts as validate/submit too, as in MLGym.
- ``communicate(cmd)`` records ``cmd`` in ``communicated``; the state command returns the state JSON.
- ``install_tools()`` returns a ``ToolSet`` (``command_docs``, ``env_variables``) and counts installs.
- ``resets``, ``closed`` and ``close_calls`` tell what the chain did with it.

Register it for ``registry.make`` with ``registry.register("backend", "standin", StandinBackend)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mlgym_registry.backends.protocol import ToolSet, new_info
from mlgym_registry.policies.base import Policy, PolicyExhausted

COMMAND_DOCS = "open <path>:\n  opens a file\nvalidate:\n  scores the submission\nsubmit:\n  submits and ends"
"""The ``command_docs`` the stand-in's tools document."""


class StandinBackend:
    """A scripted MLGym-contract backend (see the module docstring)."""

    def __init__(
        self,
        spec: Any = None,
        *,
        outputs: Sequence[str] | Callable[[str], str] | None = None,
        scores: Sequence[dict[str, float]] | None = None,
        max_steps: int | None = None,
        command_docs: str = COMMAND_DOCS,
        env_variables: dict[str, str] | None = None,
        workspace: str = "/home/agent/workspace",
        submission: str = "target.py",
    ):
        self.spec = spec
        self.outputs = outputs if callable(outputs) else list(outputs or [])
        self.scores = [dict(s) for s in (scores or [])]
        self.max_steps = max_steps if max_steps is not None else getattr(spec, "max_steps", 50)
        self.command_docs = command_docs
        self.env_variables = dict(env_variables if env_variables is not None else {"WINDOW": "100"})
        self.task_workspace = Path(workspace)
        self.submission = f"{workspace}/{submission}"
        self.task = SimpleNamespace(args=spec if spec is not None else SimpleNamespace(id="standin", description=""))
        self.current_step = 0
        self.returncode: int | None = 0
        self.actions: list[str] = []
        self.communicated: list[str] = []
        self.added_commands: list[dict[str, str]] = []
        self.resets = 0
        self.tools_installed = 0
        self.closed = False
        self.close_calls = 0
        self.open_file = "n/a"
        self._script_index = 0
        self._score_index = 0
        self._info = new_info()

    # -- contract ------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new episode."""
        self.resets += 1
        self.current_step = 0
        self.closed = False
        self._info = new_info()
        return {"observation": None}, {}

    def install_tools(self) -> ToolSet:
        """The tools' docs and variables (nothing is installed anywhere)."""
        self.tools_installed += 1
        return ToolSet(command_docs=self.command_docs, env_variables=dict(self.env_variables), state_command="state")

    def step(self, action: str) -> tuple[str | None, float, bool, dict[str, Any]]:
        """Record ``action`` and answer from the script (see the module docstring)."""
        self.actions.append(action)
        self.current_step += 1
        info = self._info
        if self.current_step > self.max_steps:
            return self._evaluate(info, "max_steps")
        command = action.strip()
        if command == "submit":
            return self._evaluate(info, "submit")
        if command in ("exit_context", "exit_cost", "exit_error", "exit_format", "exit_api"):
            return self._evaluate(info, command)  # MLGym's special actions autosubmit
        if command == "validate":
            return self._evaluate(info, "validate")
        output = self._next_output(action)
        if "<<VALIDATION||" in output:
            return self._evaluate(info, "validate")
        if "<<SUBMISSION||" in output:
            return self._evaluate(info, "submit")
        return output, 0.0, False, info

    def communicate(
        self, input: str, timeout_duration: float = 25, no_output_timeout_duration: float | None = None
    ) -> str:
        """Record ``input``; the state command prints the state JSON, anything else prints nothing."""
        self.communicated.append(input)
        self.returncode = 0
        if input.strip() == "state":
            return json.dumps({"open_file": self.open_file, "working_dir": str(self.task_workspace)})
        return ""

    def add_commands(self, commands: list[dict[str, str]]) -> None:
        """Record tool files."""
        self.added_commands.extend(commands)

    def close(self) -> None:
        """Mark closed (may be called more than once)."""
        self.closed = True
        self.close_calls += 1

    # -- helpers -------------------------------------------------------------------------------------------------
    @property
    def baseline(self) -> dict[str, float] | None:
        """The spec's first baseline score dict."""
        scores = getattr(self.spec, "baseline_scores", None) or []
        return scores[0] if scores else None

    def _next_output(self, action: str) -> str:
        if callable(self.outputs):
            return self.outputs(action)
        if self._script_index < len(self.outputs):
            self._script_index += 1
            return self.outputs[self._script_index - 1]
        return "ok"

    def _next_score(self) -> dict[str, float]:
        if self._score_index < len(self.scores):
            self._score_index += 1
            return self.scores[self._score_index - 1]
        return self.scores[-1] if self.scores else {"Score": 0.0}

    def _evaluate(self, info: dict[str, Any], action: str) -> tuple[str, float, bool, dict[str, Any]]:
        metrics = self._next_score()
        info["score"].append(metrics)
        if action == "validate":
            baseline = str(self.baseline) if self.baseline is not None else "NA (no baseline was there)"
            text = (
                f"Your code produced a valid submission artefact at {self.submission}.\n"
                f"Baseline Score: {baseline}\nEvaluation Score: {metrics}"
            )
            return text, 0.0, False, info
        info["submission"] = self.submission
        info["exit_status"] = "submitted" if action == "submit" else f"autosubmission ({action})"
        return f"Exited ({action})", 0.0, True, info


@contextmanager
def registered_standin(name: str) -> Iterator[list[StandinBackend]]:
    """Register a stand-in backend factory as ``name`` for the block; yields every backend it made, in order."""
    from mlgym_registry import registry

    made: list[StandinBackend] = []

    def factory(spec: Any, **options: Any) -> StandinBackend:
        made.append(StandinBackend(spec, **options))
        return made[-1]

    registry.register("backend", name, factory)
    try:
        yield made
    finally:
        registry.unregister("backend", name)


# -- a stand-in MLGym checkout ------------------------------------------------------------------------------------
# The real MLGym cannot be installed here (it is CC-BY-NC, needs docker-py and a container engine). This package has
# MLGym's module layout, the names the mlgym backend uses (register_task, EnvironmentArguments, MLGymEnv,
# AbstractMLTask.get, AgentConfig.load_yaml, tools_handler) and MLGym's behaviour as the adapter meets it (written
# from docs/../mlgym-contract facts, not from MLGym's code):
# - the container: image check and container lookup through the Docker Engine API at DOCKER_HOST, the shell from
#   ``<engine> run -i --rm --network host ... --name N IMAGE /bin/bash -l``, files in with ``<engine> cp`` and
#   ``<engine> exec -u root ... chown``, ``exec_run`` and ``remove`` through the API (see tests/engine_double.py);
# - a task config read from ``CONFIG_DIR / task_config_path``, dataset configs from ``CONFIG_DIR / path``, starter
#   files and local data copied in at reset, the task seed fixed at construction (``env.seed``);
# - ``step``: a fresh info every step (only MLGym's agent accumulates scores), the action followed by
#   ``export LAST_ACTION=...`` in the same shell, evaluation run in the agent's shell.
# The agent home is ``$MLGYM_STANDIN_AGENT_HOME`` (default MLGym's /home/agent) so the double's shell can hold it.

STANDIN_COMMAND_DOCS = "open <path> [<line_number>]:\n  opens the file at the given path (stand-in MLGym docs)"

_STANDIN_UTILS = '''
"""Stand-in container utilities: the engine's command line and the few Engine API calls MLGym makes."""
import http.client
import json
import os
import select
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

DONE = "__STANDIN_DONE__"


class EngineAPIError(Exception):
    pass


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.socket_path)


class Container:
    def __init__(self, client, attrs):
        self.client, self.attrs, self.id = client, attrs, attrs["Id"]
        self.name = attrs["Name"].lstrip("/")

    def exec_run(self, cmd, user=""):
        _, created = self.client.request("POST", f"/containers/{self.id}/exec", {"Cmd": cmd.split(), "User": user})
        _, output = self.client.request("POST", f"/exec/{created['Id']}/start", {"Detach": False})
        _, inspected = self.client.request("GET", f"/exec/{created['Id']}/json")
        return inspected["ExitCode"], output

    def remove(self, force=False):
        self.client.request("DELETE", f"/containers/{self.id}?force={int(force)}")


class Client:
    """The part of docker-py's client (docker.from_env()) MLGym uses."""

    def __init__(self):
        host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.socket_path = urllib.parse.urlsplit(host).path
        self.request("GET", "/version")

    def request(self, method, path, body=None):
        connection = _UnixConnection(self.socket_path)
        try:
            connection.request(method, "/v1.41" + path, body=None if body is None else json.dumps(body),
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
        except OSError as exc:
            raise EngineAPIError(f"Error while fetching server API version: {exc}") from exc
        finally:
            connection.close()
        if response.getheader("Content-Type") == "application/json":
            data = json.loads(data or b"null")
        return response.status, data

    def images(self, reference):
        query = urllib.parse.urlencode({"filters": json.dumps({"reference": [reference]})})
        return self.request("GET", f"/images/json?{query}")[1]

    def container(self, ref):
        status, attrs = self.request("GET", f"/containers/{ref}/json")
        return Container(self, attrs) if status == 200 else None


def image_exists(name):
    try:
        client = Client()
    except EngineAPIError as exc:
        raise RuntimeError("stand-in MLGym: the container daemon does not seem to be running") from exc
    return bool(client.images(name))


def start_container(name, image, container_type, devices):
    if not image_exists(image):
        raise RuntimeError(f"stand-in MLGym: image {image} not found")
    gpus = [] if len(devices) == 1 and "cpu" in devices[0] else ["--gpus", ",".join(devices)]
    command = [container_type, "run", "-i", "--rm", "--network", "host", *gpus, "--name", name, image,
               "/bin/bash", "-l"]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def copy_to_container(container, container_type, host_path, container_path):
    if not Path(host_path).exists():
        raise FileNotFoundError(f"{host_path} does not exist")
    subprocess.run([container_type, "cp", str(host_path), f"{container.id}:{container_path}"], check=True)
    subprocess.run([container_type, "exec", "-u", "root", container.id, "chown", "-R", "agent:mlgym",
                    container_path], check=True)


def read_until_done(process, timeout):
    buffer, deadline = b"", time.time() + timeout
    fd = process.stdout.fileno()
    while time.time() < deadline:
        if select.select([fd], [], [], 0.05)[0]:
            data = os.read(fd, 65536)
            if not data:
                raise RuntimeError(f"stand-in MLGym: the container shell exited: {buffer!r}")
            buffer += data
            text = buffer.decode(errors="backslashreplace")
            if DONE in text and text.endswith("\\n"):
                body, _, tail = text.rpartition(DONE)
                lines = [line for line in body.splitlines() if line]
                return "\\n".join(lines), int(tail.split()[0])
    raise TimeoutError(f"stand-in MLGym: timed out after {timeout} s", buffer.decode(errors="replace"))
'''

_STANDIN_TASKS = '''
"""Stand-in task classes and configs."""
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from mlgym import CONFIG_DIR


class SubmissionNotFoundError(Exception):
    pass


class EvaluationFormatError(Exception):
    pass


def _load(cls, path):
    data = yaml.safe_load(Path(path).read_text())
    known = {f.name for f in fields(cls) if f.init}
    return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    description: str
    data_path: str
    is_local: bool = False
    train_split: dict = None
    valid_split: dict = None
    test_split: dict = None


@dataclass
class TaskConfig:
    id: str
    name: str
    description: str
    dataset_configs: list = field(default_factory=list)
    _datasets: list = field(default_factory=list, init=False)
    task_entrypoint: str = "CSVSubmissionTasks"
    training_timeout: int = None
    requirements_path: str = None
    benchmark_name: str = None
    use_generic_conda: bool = True
    starter_code: list = field(default_factory=list)
    baseline_paths: list = field(default_factory=list)
    baseline_scores: list = field(default_factory=list)
    sample_submission: str = None
    evaluation_paths: list = field(default_factory=list)
    evaluation_read_only: bool = False
    secret_files: list = field(default_factory=list)
    memory_path: str = None

    @classmethod
    def load_yaml(cls, path):
        return _load(cls, path)

    def __post_init__(self):
        self._datasets = [_load(DatasetConfig, CONFIG_DIR / path) for path in self.dataset_configs]
        if self.sample_submission is not None and not Path(self.sample_submission).exists():
            raise FileNotFoundError(self.sample_submission)


class AbstractMLTask:
    _registry = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        AbstractMLTask._registry[cls.__name__] = cls

    def __init__(self, seed, args, task_workspace, _communicate, _communicate_with_handling=None):
        self.seed, self.args, self.task_workspace, self._communicate = seed, args, task_workspace, _communicate

    @classmethod
    def get(cls, name):
        try:
            return cls._registry[name]
        except KeyError:
            raise ValueError(f"Task class {name} not found") from None

    def setup(self):
        docs = "".join(f"{d.name.upper()}:\\n{d.description}\\n\\n" for d in self.args._datasets)
        self.args.description = self.args.description.format(dataset_docs=docs)
        if self.args.training_timeout is None:
            self.args.training_timeout = 3600

    def update_baseline_scores(self):
        if not self.args.baseline_scores:
            self.args.baseline_scores.append(self.evaluate()[0])
            return True
        return False

    def _eval_script(self):
        return f"{self.task_workspace}/{self.args.evaluation_paths[0]}"


class PythonSubmissionTasks(AbstractMLTask):
    def evaluate(self):
        output = self._communicate(f"python {self._eval_script()}", timeout_duration=self.args.training_timeout)
        try:
            return json.loads(output), f"{self.task_workspace}/target.py"
        except json.JSONDecodeError as exc:
            raise EvaluationFormatError(f"Failed to decode metrics from evaluation script. Output:\\n{output}") from exc


class CSVSubmissionTasks(AbstractMLTask):
    def evaluate(self):
        if "submission.csv" not in self._communicate(f"ls {self.task_workspace}").split():
            raise SubmissionNotFoundError("no submission.csv")
        submission = f"{self.task_workspace}/submission.csv"
        output = self._communicate(f"python {self._eval_script()} --submission_file {submission}",
                                   timeout_duration=self.args.training_timeout)
        line = next((l for l in output.splitlines() if l.strip().startswith("{")), None)
        if line is None:
            raise EvaluationFormatError(f"Failed to decode metrics from evaluation script. Output:\\n{output}")
        return json.loads(line), submission
'''

_STANDIN_ENV = '''
"""Stand-in MLGymEnv: MLGym's env contract as the adapter meets it (see tests/standin.py)."""
import copy
import os
import re
import shlex
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym

from mlgym import CONFIG_DIR
from mlgym.environment import utils
from mlgym.environment.tasks import AbstractMLTask, EvaluationFormatError, SubmissionNotFoundError, TaskConfig
from mlgym.types import AgentInfo

INSTANCES = []
EDIT = re.compile(r"^edit\\s+(\\d+):(\\d+)(?:\\n|$|\\s)", re.MULTILINE)


@dataclass(frozen=True)
class EnvironmentArguments:
    image_name: str = "aigym/mlgym-agent:latest"
    max_steps: int = 100
    seed: int = 42
    task_config_path: str = None
    task: TaskConfig = None
    container_type: str = "docker"
    container_name: str = None
    verbose: bool = False
    cache_baseline_scores: bool = True
    memory_enabled: bool = False
    container_mounts: list = field(default_factory=list)
    aliases_file: str = None

    def __post_init__(self):
        if self.task_config_path is None:
            raise ValueError("You must provide a Task Config")
        object.__setattr__(self, "task", TaskConfig.load_yaml(CONFIG_DIR / self.task_config_path))

    def get_task_class(self):
        return AbstractMLTask.get(self.task.task_entrypoint)


class MLGymEnv(gym.Env):
    metadata = {"render_modes": ["human"]}
    name = "mlgym_main"

    def __init__(self, args, devices, render_mode=None):
        super().__init__()
        self.args, self.task_args, self.devices = args, args.task, devices
        self.cwd_at_init = os.getcwd()
        self.action_space = gym.spaces.Text(max_length=1000)
        self.observation_space = gym.spaces.Text(max_length=10000)
        self.seed, self.max_steps, self.current_step = args.seed, args.max_steps, 0
        self.returncode, self.task = None, None
        self.task_entrypoint = args.get_task_class()
        self.workspace_dir = Path(os.environ.get("MLGYM_STANDIN_AGENT_HOME", "/home/agent"))
        self.task_workspace = self.workspace_dir / "workspace"
        self.image_name, self.container_type = args.image_name, args.container_type
        self.container = self.container_obj = None
        self.calls, self.closed = [], False
        INSTANCES.append(self)
        self._reset_container()

    # -- container
    def reset_container(self):
        self.calls.append(("reset_container",))
        self.close()
        self._reset_container()

    def _reset_container(self):
        name = self.image_name.replace("/", "-").replace(":", "-") + f"-{uuid.uuid4().hex[:10]}"
        self.container = utils.start_container(name, self.image_name, self.container_type, self.devices)
        client = utils.Client()
        for _ in range(200):
            self.container_obj = client.container(name)
            if self.container_obj is not None:
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("stand-in MLGym: failed to get the container object")
        self.closed = False
        commands = self.workspace_dir / "commands"
        self._checked(f"mkdir -p {commands}")
        self._checked(f"export PATH=$PATH:{commands}")
        if self.args.aliases_file is not None:
            self._checked("shopt -s expand_aliases")
            utils.copy_to_container(self.container_obj, self.container_type, self.args.aliases_file,
                                    str(commands / "bash_aliases.sh"))
            self._checked(f"source {commands}/bash_aliases.sh")

    def close(self):
        self.calls.append(("close",))
        if self.container is not None and self.container.poll() is None:
            self.communicate("exit")
            self.container.wait(timeout=60)
        if self.container_obj is not None:
            try:
                self.container_obj.remove(force=True)
            except utils.EngineAPIError:
                pass  # MLGym logs a warning and goes on
        self.container = self.container_obj = None
        self.closed = True

    # -- reset
    def reset(self, *, seed=None, options=None):
        self.calls.append(("reset", os.getcwd()))
        super().reset(seed=seed)
        self.current_step = 0
        self.task = self.task_entrypoint(seed=self.seed, args=copy.deepcopy(self.task_args),
                                         task_workspace=str(self.task_workspace), _communicate=self.communicate)
        ws = self.task_workspace
        self._checked(f"rm -rf {ws}")
        self._checked(f"mkdir {ws}")
        for dataset in self.task.args._datasets:
            if dataset.is_local:
                utils.copy_to_container(self.container_obj, self.container_type, dataset.data_path, f"{ws}/data")
                for entry in self.communicate(f"ls {ws}/data/").split():
                    self.container_obj.exec_run(f"chmod -R 555 {ws}/data/{entry}", user="root")
        for path in self.task.args.starter_code:
            utils.copy_to_container(self.container_obj, self.container_type, path, f"{ws}/")
        if self.task.args.evaluation_read_only:
            for path in self.task.args.evaluation_paths:
                self.container_obj.exec_run(f"chmod 555 {ws}/{path}", user="root")
        self._checked('export CURRENT_FILE="" && export CURRENT_LINE=0')
        self.task.setup()
        self.communicate(f"cd {ws}")
        self.task.update_baseline_scores()
        starter = {Path(p).name for p in self.task.args.starter_code}
        for name in self.communicate(f"ls {ws}").split():
            if name.strip("*/") not in starter | {"data"}:
                self.communicate(f"rm -rf {ws}/{name.strip('*/')}")
        return {"observation": None}, {}

    # -- step
    def step(self, action):
        self.calls.append(("step", action))
        info = AgentInfo()
        self.current_step += 1
        if self.current_step > self.max_steps:
            return self._evaluate(info, "max_steps")
        action = action.strip()
        if action == "skip":
            info["exit_status"] = "skipped"
            return "Skipped", 0, True, info
        if action == "exit_forfeit":
            info["exit_status"] = action
            return "Exited (exit_forfeit)", 0, True, info
        if action in {"exit_context", "exit_cost", "exit_error", "exit_format", "exit_api"}:
            return self._evaluate(info, action)
        if EDIT.match(action) and "end_of_edit" not in action:
            return "Malformed edit command.", 0, False, info
        observation = self.communicate(action, timeout_duration=25, set_last_action=True)
        if re.search(r"<<VALIDATION\\|\\|(.*)\\|\\|VALIDATION>>", observation, re.DOTALL):
            return self._evaluate(info, "validate")
        if re.search(r"<<SUBMISSION\\|\\|(.*)\\|\\|SUBMISSION>>", observation, re.DOTALL):
            return self._evaluate(info, "submit")
        return observation, 0, False, info

    def _evaluate(self, info, action):
        try:
            metrics, submission = self.task.evaluate()
        except SubmissionNotFoundError:
            if action == "validate":
                return "Submission artefact not found.", 0, False, info
            info["exit_status"] = f"submission_not_found ({action})"
            return f"Exited ({action})", 0, True, info
        except EvaluationFormatError as exc:
            if action == "validate":
                return str(exc), 0, False, info
            info["exit_status"] = f"evaluation_format_error ({action})"
            return f"Exited ({action})", 0, True, info
        info["score"].append(metrics)
        if action == "validate":
            base = self.task_args.baseline_scores[0] if self.task_args.baseline_scores else "NA (no baseline was there)"
            return (f"Your code produced a valid submission artefact at {submission}.\\n"
                    f"Baseline Score: {base}\\nEvaluation Score: {metrics}"), 0, False, info
        info["submission"] = submission
        info["exit_status"] = "submitted" if action == "submit" else f"autosubmission ({action})"
        return f"Exited ({action})", 0, True, info

    # -- the shell
    def communicate(self, input, timeout_duration=25, no_output_timeout_duration=None, *, set_last_action=False):
        self.calls.append(("communicate", input))
        if input.strip() == "exit":
            self.container.stdin.write(b"exit\\n")
            self.container.stdin.flush()
            self.returncode = 0
            return ""
        output = self._communicate(f"bash -n <<'STANDIN_EOF'\\n{input}\\nSTANDIN_EOF\\n")
        if self.returncode != 0:
            return output
        output = self._communicate(input, timeout_duration)
        if set_last_action:
            self._communicate(f"export LAST_ACTION={shlex.quote(input.strip())}", 5)
        return output

    def _communicate(self, input, timeout_duration=25, no_output_timeout_duration=None):
        self.returncode = None
        text = input if input.endswith("\\n") else input + "\\n"
        self.container.stdin.write((text + f"printf '\\\\n{utils.DONE} %s\\\\n' \\"$?\\"\\n").encode())
        self.container.stdin.flush()
        output, self.returncode = utils.read_until_done(self.container, timeout_duration or 25)
        return output

    def _checked(self, input):
        output = self.communicate(input)
        if self.returncode != 0:
            raise RuntimeError(f"stand-in MLGym: {input!r} failed: {output}")
        return output

    def add_commands(self, commands):
        for command in commands:
            target = f"{self.workspace_dir}/commands/{command['name']}"
            with tempfile.NamedTemporaryFile("w", delete=False) as handle:
                handle.write(command["contents"])
            try:
                utils.copy_to_container(self.container_obj, self.container_type, handle.name, target)
            finally:
                os.unlink(handle.name)
            if command["type"] == "source_file":
                self._checked(f"source {target}")
            elif command["type"] == "script":
                self.container_obj.exec_run(f"chmod +x {target}", user="root")
'''

_STANDIN_MLGYM_FILES = {
    "mlgym/__init__.py": '''
from pathlib import Path
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
CONFIG_DIR = REPO_ROOT / "configs"
assert CONFIG_DIR.is_dir()
''',
    "mlgym/environment/__init__.py": "",
    "mlgym/agent/__init__.py": "",
    "mlgym/types.py": '''
from collections import defaultdict


class AgentInfo(defaultdict):
    def __init__(self):
        super().__init__(lambda: None)
        self.update(model_stats={}, exit_status="", submission=None, score=[], summarizer={})
''',
    "mlgym/environment/utils.py": _STANDIN_UTILS,
    "mlgym/environment/tasks.py": _STANDIN_TASKS,
    "mlgym/environment/env.py": _STANDIN_ENV,
    "mlgym/environment/registration.py": '''
import gymnasium as gym

from mlgym.environment.env import MLGymEnv


def register_task(env_config, *args, nondeterministic=True, **kwargs):
    gym.register(
        id=f"mlgym/{env_config.task.id}",
        entry_point=lambda *env_args, **env_kwargs: MLGymEnv(env_config, *env_args, **env_kwargs),
        nondeterministic=nondeterministic,
    )
''',
    "mlgym/agent/base.py": '''
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mlgym import REPO_ROOT

COMMAND_DOCS = __COMMAND_DOCS__


@dataclass(frozen=True)
class Command:
    name: str
    code: str


@dataclass(frozen=True)
class ToolsConfig:
    command_files: list = field(default_factory=list)
    env_variables: dict = field(default_factory=dict)
    state_command: Command = Command("state", "state() { echo '{}'; }")


class ToolHandler:
    def __init__(self, config):
        self.config = config
        self.command_docs = COMMAND_DOCS
        self.env_variables = config.env_variables

    @property
    def state_command(self):
        return self.config.state_command


@dataclass(frozen=True)
class AgentConfig:
    system_template: str
    task_template: str
    tools: ToolsConfig = field(default_factory=ToolsConfig)

    def __post_init__(self):
        object.__setattr__(self, "tools_handler", ToolHandler(self.tools))

    @classmethod
    def load_yaml(cls, path):
        data = yaml.safe_load(Path(path).read_text())
        tools = data.get("tools", {})
        files = [str(REPO_ROOT / f) for f in tools.get("command_files", [])]
        state = Command(**tools["state_command"]) if "state_command" in tools else Command("state", "state() { :; }")
        config = ToolsConfig(files, dict(tools.get("env_variables", {})), state)
        return cls(data["system_template"], data["task_template"], config)
'''.replace("__COMMAND_DOCS__", repr(STANDIN_COMMAND_DOCS)),
    "configs/agents/default.yaml": '''
system_template: "stand-in system {command_docs}"
task_template: "stand-in task {description}"
tools:
  env_variables:
    WINDOW: 100
    OVERLAP: 2
  state_command:
    name: state
    code: "state() { echo '{\\"open_file\\": \\"n/a\\", \\"working_dir\\": \\"'$PWD'\\"}'; }"
  command_files:
    - tools/defaults.sh
    - tools/submit
    - tools/validate
    - tools/_split_string
''',
    "configs/tasks/checkoutTask.yaml": '''
id: checkoutTask
name: A task from the checkout
description: |-
  Do the checkout task. {dataset_docs}
task_entrypoint: PythonSubmissionTasks
training_timeout: 1800
dataset_configs:
  - datasets/numbers.yaml
starter_code:
  - data/checkoutTask/evaluate.py
  - data/checkoutTask/target.py
evaluation_paths:
  - evaluate.py
baseline_scores:
  - Score: 1.0
''',
    "configs/datasets/numbers.yaml": '''
name: numbers
description: three numbers
data_path: data/checkoutTask/data
is_local: true
''',
    "data/checkoutTask/evaluate.py": '''
import json
print(json.dumps({"Score": float(len(open("target.py").read().splitlines()))}))
''',
    "data/checkoutTask/target.py": "x = 1\n",
    "data/checkoutTask/data/numbers.txt": "1\n2\n3\n",
    "dockerfiles/aliases.sh": "alias ll='ls -l'\n",
    "tools/defaults.sh": "open() {\n  echo opened \"$1\"\n}\n",
    "tools/submit": "#!/bin/bash\necho '<<SUBMISSION||target.py||SUBMISSION>>'\n",
    "tools/validate": "#!/bin/bash\necho '<<VALIDATION||target.py||VALIDATION>>'\n",
    "tools/_split_string": "print('utility')\n",
}


def write_standin_mlgym(root: Path) -> Path:
    """Write a stand-in MLGym checkout under ``root`` and return it (put it on ``sys.path`` to "install" it)."""
    import textwrap

    root = Path(root)
    for relative, text in _STANDIN_MLGYM_FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


class Script(Policy):
    """A policy that answers with ``responses`` in turn, then gives up (``PolicyExhausted``)."""

    def __init__(self, responses):
        self.responses = list(responses)

    def respond(self, messages):
        if not self.responses:
            raise PolicyExhausted("script over")
        return self.responses.pop(0)
