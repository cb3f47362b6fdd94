"""Stage a task's files the way MLGym lays out a workspace: starter files at the top, local datasets under ``data/``.

Used to run starter and baseline code outside any backend (baseline computation, tests, ``check`` commands).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import InvalidTaskError
from ..specs import TaskSpec


def copy_into(source: Path, destination: Path) -> None:
    """Copy a file or a folder to ``destination`` (a folder's content is merged into it)."""
    if source.is_dir():
        shutil.copytree(source, destination, dirs_exist_ok=True)
    else:
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


def stage_workspace(spec: TaskSpec, workspace: str | Path) -> Path:
    """Copy ``spec``'s starter files and local datasets into ``workspace`` (created if needed) and return it."""
    workspace = Path(workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    for dataset in spec.datasets:
        if not dataset.get("is_local", False):
            continue
        source = spec.resolve_path(dataset["data_path"])
        if not source.exists():
            raise InvalidTaskError(f"task {spec.id!r}: dataset {dataset.get('name')!r} not found at {str(source)!r}")
        copy_into(source, workspace / "data")
    for item in spec.starter_code:
        source = spec.resolve_path(item)
        if not source.exists():
            raise InvalidTaskError(f"task {spec.id!r}: starter file {item!r} not found at {str(source)!r}")
        copy_into(source, workspace / source.name)
    return workspace
