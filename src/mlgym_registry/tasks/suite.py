"""Loading our own task files: a task YAML plus, optionally, a ``prepare`` step that makes its data on first use.

A task file may name ``prepare: "package.module:function"``; the function receives the loaded ``TaskSpec`` and
returns it with its generated data in place (``datasets``, ``sample_submission``). Generated data lives in
``cache_dir()``, never in the package.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidTaskError
from ..machine import cache_root
from ..specs import TaskSpec, load_task_yaml

TASKS_DIR = Path(__file__).parent
"""The folder of our task suite: ``<id>.yaml`` files here, their starter files under ``data/<id>/``."""

CACHE_ENV = "MLGYM_REGISTRY_CACHE"
"""The variable that moves generated task data (and the integrity reports kept with it) out of the cache folder."""


def cache_dir() -> Path:
    """Where generated task data goes: ``$MLGYM_REGISTRY_CACHE``, else the package's cache folder
    (``machine.cache_root``, ``~/.cache/mlgym-registry`` by default)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return cache_root()


def load_suite_task(path: str | Path) -> TaskSpec:
    """Load a task file of the suite and run its ``prepare`` step, if it names one."""
    from ..entries import import_reference

    spec = load_task_yaml(path)
    ref = spec.extra.get("prepare")
    if not ref:
        return spec
    try:
        prepare = import_reference(ref)
    except (ImportError, AttributeError) as exc:
        raise InvalidTaskError(f"task file {str(path)!r}: cannot import its prepare step {ref!r}: {exc}") from exc
    prepared = prepare(spec)
    if not isinstance(prepared, TaskSpec):
        kind = type(prepared).__name__
        raise InvalidTaskError(f"prepare step {ref!r} of {str(path)!r} returned {kind}, not a TaskSpec")
    return prepared
