"""Our own task suite, registered as an ordinary plugin: every ``*.yaml`` beside this file is a task."""

from __future__ import annotations

from pathlib import Path

from ..hookspecs import hookimpl

TASKS_DIR = Path(__file__).parent


@hookimpl
def register_tasks(register):
    for path in sorted(TASKS_DIR.glob("*.yaml")):
        register(path.stem, str(path))
