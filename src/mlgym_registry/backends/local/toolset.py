"""The local backend's tool set: where the tool files are, their documentation, and how to install them in a shell."""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path
from typing import Any

from ..protocol import ToolSet

TOOLS_DIR = Path(__file__).parent / "tools"
TOOLS_SCRIPT = TOOLS_DIR / "tools.sh"
COMMANDS_FILE = TOOLS_DIR / "commands.yaml"

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


def install_script(tools_dir: str | None = None) -> str:
    """Shell text that defines ``state``, the tool commands and the tool variables (plain ``K=V``, as MLGym sends).

    ``tools_dir`` is where the shell sees this package's tool folder (a sandbox mounts it elsewhere).
    """
    folder = tools_dir or str(TOOLS_DIR)
    lines = [
        f"export MLGR_PYTHON={shlex.quote(sys.executable)} MLGR_TOOLS={shlex.quote(folder)}",
        f"source {shlex.quote(folder + '/' + TOOLS_SCRIPT.name)}",
    ]
    lines += [f"{key}={value if value.startswith('(') else shlex.quote(value)}" for key, value in ENV_VARIABLES.items()]
    return "\n".join(lines)


def reset_variables_script() -> str:
    """What MLGym exports on every reset: an empty open file, line 0, empty search results."""
    return "export CURRENT_FILE='' CURRENT_LINE=0 SEARCH_INDEX=0; SEARCH_RESULTS=(); SEARCH_FILES=()"
