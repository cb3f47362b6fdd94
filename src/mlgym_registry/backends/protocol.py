"""The MLGym environment contract, as a ``typing.Protocol``.

Every backend honours it, so the chain drives the embedded ``local`` backend and the real MLGym alike. The facts behind
it (formats, step counting, special actions, ``info`` keys) are in MLGym's ``MLGymEnv``; see ``docs/concepts.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass
class ToolSet:
    """What the agent's shell offers once its tools are installed; fills ``{command_docs}`` and ``{WINDOW}``."""

    command_docs: str
    env_variables: dict[str, str] = field(default_factory=dict)
    state_command: str = "state"


@runtime_checkable
class Backend(Protocol):
    """An MLGym-compatible environment: a persistent shell in a task workspace, stepped with text actions.

    - ``reset()`` prepares a fresh workspace and session and returns ``({"observation": None}, {})``.
    - ``install_tools()`` defines the ``state`` command, the tool commands and their env variables in the session
      (what MLGym's agent does after reset) and returns their ``ToolSet``.
    - ``step(action)`` counts the step, autosubmits past ``max_steps``, handles the special actions and the
      validate/submit markers, and returns MLGym's 4-tuple ``(observation, reward, done, info)`` where ``info`` has
      the keys ``model_stats``, ``exit_status``, ``submission``, ``score`` (a list that accumulates), ``summarizer``.
    - ``communicate(cmd)`` runs a command in the session and returns its normalised output; sets ``returncode``.
    - ``close()`` ends every process and removes every file the backend made. It may be called more than once.
    """

    task_workspace: Path
    current_step: int
    max_steps: int
    returncode: int | None
    task: Any

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]: ...

    def install_tools(self) -> ToolSet: ...

    def step(self, action: str) -> tuple[str | None, float, bool, dict[str, Any]]: ...

    def communicate(
        self, input: str, timeout_duration: float = 25, no_output_timeout_duration: float | None = None
    ) -> str: ...

    def add_commands(self, commands: list[dict[str, str]]) -> None: ...

    def close(self) -> None: ...


INFO_KEYS = ("model_stats", "exit_status", "submission", "score", "summarizer")
"""The keys of every ``info`` dict a backend's ``step`` returns (MLGym's ``AgentInfo``)."""


def new_info() -> dict[str, Any]:
    """A fresh ``info`` dict with MLGym's five keys."""
    return {"model_stats": {}, "exit_status": "", "submission": None, "score": [], "summarizer": {}}
