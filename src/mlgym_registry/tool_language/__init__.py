"""MLGym's tool language: the commands an agent may call (their names, signatures, arguments and documentation,
``commands.yaml``), the tool variables and their starting values, and the ``{command_docs}`` text rendered from
them.

Every backend, component and policy that speaks the language reads it here: the local backend installs its shell
implementation of these commands (``backends/local/tools``), the ``tool_calls`` parser turns them into JSON-schema
tools, the tiny model's chat template lists them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ToolSet:
    """What the agent's shell offers once its tools are installed; fills ``{command_docs}`` and ``{WINDOW}``."""

    command_docs: str
    env_variables: dict[str, str] = field(default_factory=dict)
    state_command: str = "state"


COMMANDS_FILE = Path(__file__).parent / "commands.yaml"
"""The documented tool commands."""

ENV_VARIABLES: dict[str, str] = {
    "WINDOW": "1000",
    "OVERLAP": "2",
    "CURRENT_LINE": "0",
    "CURRENT_FILE": "",
    "SEARCH_RESULTS": "()",
    "SEARCH_FILES": "()",
    "SEARCH_INDEX": "0",
}
"""The tool variables and their starting values, as in MLGym's default agent config (strings, like MLGym's)."""

AUTOSUBMIT_EXITS = ("exit_context", "exit_cost", "exit_error", "exit_format", "exit_api")
"""MLGym's made-up actions that end an episode with an autosubmission of what the workspace holds."""
EXIT_FORMAT = "exit_format"
"""The one of them MLGym's agent sends after too many format errors in a row."""
EXIT_FORMAT_THOUGHT = "Exit due to format error"
"""The thought MLGym's agent records on the step that ends an episode after repeated format errors."""
SPECIAL_ACTIONS = (*AUTOSUBMIT_EXITS, "exit_forfeit")
"""Every action MLGym's agent makes up itself (a policy gives up: format, context or cost exhausted, forfeit):
they arrive as fenced text, never as tool calls."""


@functools.lru_cache(maxsize=1)
def commands() -> list[dict[str, Any]]:
    """The documented tool commands, in the order the docs list them."""
    import yaml

    return yaml.safe_load(COMMANDS_FILE.read_text())


def signature(command: dict[str, Any]) -> str:
    """The command's signature, built from its arguments when not given."""
    if command.get("signature"):
        return command["signature"]
    parts = [command["name"]]
    for name, arg in (command.get("arguments") or {}).items():
        parts.append(f"<{name}>" if arg.get("required") else f"[<{name}>]")
    return " ".join(parts)


def render_docs(env_variables: dict[str, str] | None = None) -> str:
    """``{command_docs}`` in MLGym's detailed layout: name, docstring, signature, then the arguments."""
    values = {**ENV_VARIABLES, **(env_variables or {})}
    blocks = []
    for command in commands():
        lines = [
            f"{command['name']}:",
            f"  docstring: {command['docstring'].format(**values)}",
            f"  signature: {signature(command)}",
        ]
        arguments = command.get("arguments") or {}
        if arguments:
            lines.append("  arguments:")
            for name, arg in arguments.items():
                need = "required" if arg.get("required") else "optional"
                lines.append(f"    - {name} ({arg['type']}) [{need}]: {arg['description']}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def tool_set() -> ToolSet:
    """What ``install_tools()`` returns."""
    return ToolSet(command_docs=render_docs(), env_variables=dict(ENV_VARIABLES), state_command="state")
