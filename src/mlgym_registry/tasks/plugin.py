"""Our own task suite, registered as an ordinary plugin: every ``*.yaml`` beside this file is a task, named by its id.

Listing reads only the small task files; starter files, generated data and numpy are touched when a task is used.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..entries import task_line
from ..hookspecs import hookimpl
from .suite import TASKS_DIR, load_suite_task


def task_header(path: Path) -> dict[str, Any]:
    """The fields of a task file that registration needs (``id``, ``name``, ``summary``, ``prepare``)."""
    import yaml

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not data.get("id"):
        raise ValueError(f"task file {str(path)!r} has no 'id'")
    return data


@hookimpl
def register_tasks(register):
    for path in sorted(TASKS_DIR.glob("*.yaml")):
        data = task_header(path)
        # plain task files stay lazy path references; files with a prepare step load through it
        target: Any = functools.partial(load_suite_task, str(path)) if data.get("prepare") else str(path)
        register(str(data["id"]), target, description=task_line(data))
