"""``prepare``: make a task ready to run offline, its Python environment (``virtualenvs``) and then its data
(``datasets``). What ``mlgym-registry prepare`` runs, once the registry has found the task (``Registry.prepare``); each
of the two modules knows nothing of the other."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..specs import TaskSpec
from .datasets import ScriptRunner, prepare_data
from .hub_datasets import prepare_hub_views
from .virtualenvs import Echo, prepare_environment


def prepare(spec: TaskSpec, *, run_script: ScriptRunner, force: bool = False, pip_args: Sequence[str] = (),
            data_dir: str | None = None, echo: Echo = print, label: str | None = None) -> Path:
    """Make a task ready to run offline: its Python environment (``prepare_environment``, which names the task
    ``label`` in what it prints), then its data when it has a recipe for it
    (``mlgym_registry.preparation.datasets.prepare_data``, run with that environment's interpreter by ``run_script``,
    into ``data_dir`` or the first data folder), and the offline views of the Hugging Face hub datasets whose local
    copies are here (``hub_datasets.prepare_hub_views``). Returns the task's interpreter."""
    python = prepare_environment(spec, force=force, pip_args=pip_args, echo=echo, label=label)
    prepare_data(spec, str(python), data_dir, run_script=run_script, force=force, echo=echo)
    prepare_hub_views(spec, str(python), data_dir, echo=echo)
    return python
