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
# The real MLGym needs containers; this package has MLGym's module layout and the names the mlgym backend uses
# (register_task, EnvironmentArguments, MLGymEnv, AgentConfig.load_yaml, tools_handler), and records every call.

STANDIN_COMMAND_DOCS = "open <path> [<line_number>]:\n  opens the file at the given path (stand-in MLGym docs)"

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
    "mlgym/environment/env.py": '''
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import yaml

from mlgym import CONFIG_DIR

INSTANCES = []


@dataclass(frozen=True)
class TaskConfig:
    id: str
    name: str = ""
    description: str = ""
    training_timeout: int = 1800
    baseline_scores: list = field(default_factory=list)
    starter_code: list = field(default_factory=list)

    @classmethod
    def load_yaml(cls, path):
        data = yaml.safe_load(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
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
    aliases_file: str = None

    def __post_init__(self):
        self.task = TaskConfig.load_yaml(CONFIG_DIR / self.task_config_path)


class AgentInfo(defaultdict):
    def __init__(self):
        super().__init__(lambda: None)
        self.update(model_stats={}, exit_status="", submission=None, score=[], summarizer={})


class MLGymEnv(gym.Env):
    metadata = {"render_modes": ["human"]}

    def __init__(self, args, devices, render_mode=None):
        self.args = args
        self.devices = devices
        self.cwd_at_init = os.getcwd()
        self.action_space = gym.spaces.Text(max_length=1000)
        self.observation_space = gym.spaces.Text(max_length=10000)
        self.task_workspace = Path("/home/agent/workspace")
        self.max_steps = args.max_steps
        self.current_step = 0
        self.returncode = None
        self.task = None
        self.calls = []
        self.commands = []
        self.closed = False
        INSTANCES.append(self)

    def reset_container(self):
        self.calls.append(("reset_container",))

    def reset(self, *, seed=None, options=None):
        self.calls.append(("reset", os.getcwd()))
        self.current_step = 0
        self.info = AgentInfo()
        self.task = SimpleNamespace(args=self.args.task)
        return {"observation": None}, {}

    def step(self, action):
        self.calls.append(("step", action))
        self.current_step += 1
        if action.strip() == "validate":
            metrics = {"Score": 3.0}
            self.info["score"].append(metrics)
            base = self.args.task.baseline_scores[0]
            return (f"Your code produced a valid submission artefact at /home/agent/workspace/target.py.\\n"
                    f"Baseline Score: {base}\\nEvaluation Score: {metrics}"), 0, False, self.info
        if action.strip() == "submit":
            self.info["score"].append({"Score": 3.5})
            self.info["exit_status"] = "submitted"
            return "Exited (submit)", 0, True, self.info
        return f"ran: {action}", 0, False, self.info

    def communicate(self, input, timeout_duration=25, no_output_timeout_duration=None):
        self.calls.append(("communicate", input))
        self.returncode = 0
        if input == "state":
            return json.dumps({"open_file": "n/a", "working_dir": "/home/agent/workspace"})
        return ""

    def add_commands(self, commands):
        self.commands.extend(commands)

    def close(self):
        self.closed = True
''',
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
    code: "state() { echo state; }"
  command_files:
    - tools/defaults.sh
    - tools/submit
    - tools/_split_string
''',
    "configs/tasks/checkoutTask.yaml": '''
id: checkoutTask
name: A task from the checkout
description: Do the checkout task.
baseline_scores:
  - Score: 1.0
''',
    "tools/defaults.sh": "open() {\n  echo opened \"$1\"\n}\n",
    "tools/submit": "#!/bin/bash\necho '<<SUBMISSION||target.py||SUBMISSION>>'\n",
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


def write_container_engine(bin_dir: Path, name: str, *, answers: bool = True) -> Path:
    """A fake ``docker``/``podman`` executable whose ``info`` succeeds (``answers``) or fails like a dead daemon."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    body = "exit 0" if answers else "echo 'Cannot connect to the container daemon' >&2\nexit 125"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path
