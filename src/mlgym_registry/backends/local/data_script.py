"""Running a task's data script (its ``prepare_data`` recipe) in the local backend's sandbox: what
``mlgym_registry.preparation.datasets.prepare_data`` is given to run it with, so that a task file's script never runs
on the host."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ...errors import TaskFilesMissing
from . import sandbox
from .confinement import PASSED_VARIABLES, SYSTEM_PATH


def run_data_script(argv: list[str], scratch: Path, cwd: Path, python: str, timeout: float):
    """Run ``argv`` (a task's data script) in the local backend's bubblewrap sandbox: ``scratch`` is its only
    writable folder (at the agent's workspace path, the command starting in its ``cwd``), ``python``'s installation
    is shown read-only, there is no network and its variables are built from scratch (none of this process's).
    ``TaskFilesMissing`` when the sandbox cannot start here; a ``CompletedProcess`` with text output otherwise."""
    binds = [sandbox.Bind(str(scratch), sandbox.AGENT_WORKSPACE, writable=True)]
    binds += [sandbox.Bind(root, root) for root in sandbox.python_roots(python)]
    place = str(Path(sandbox.AGENT_WORKSPACE) / cwd)
    env = {key: value for key, value in os.environ.items() if key in PASSED_VARIABLES}
    env.update(PATH=os.pathsep.join([os.path.dirname(python), SYSTEM_PATH]), HOME=sandbox.AGENT_HOME, TMPDIR="/tmp")
    try:
        sandbox.check()
        command = sandbox.command(argv, sandbox.SandboxSpec(binds=binds, cwd=place))
    except sandbox.SandboxUnavailable as exc:
        raise TaskFilesMissing(f"a task's data script runs in the sandbox, which cannot start here: {exc}") from None
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
