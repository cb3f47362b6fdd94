"""The local backend's tool set: where its shell implementation of MLGym's tool language lies, and how to install it
in a shell (the language itself, its commands and their documentation: ``mlgym_registry.tool_language``)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ...tool_language import ENV_VARIABLES, commands, render_docs, signature, tool_set

__all__ = ["ENV_VARIABLES", "TOOLS_DIR", "TOOLS_SCRIPT", "commands", "install_script", "render_docs",
           "reset_variables_script", "signature", "tool_set"]

TOOLS_DIR = Path(__file__).parent / "tools"
TOOLS_SCRIPT = TOOLS_DIR / "tools.sh"
"""The shell implementation of the tool commands, in the folder the sandbox mounts."""


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
