"""mlgym_registry: turn an MLGym task name into a ready-to-train TorchRL environment for LLM agents.

    from mlgym_registry import registry
    env = registry.make("prisonersDilemma")

Importing this package is cheap: torch, torchrl and tensordict load only when an env is built. It registers every
task in Gymnasium as ``mlgym_registry/<task>`` once Gymnasium is imported (``faces.gymnasium_registration``), so
``gymnasium.make("mlgym_registry/prisonersDilemma")`` works too (``faces.gymnasium``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import env_hooks
from ._version import __version__ as __version__  # in _version.py, which any layer may import
from .errors import (
    BackendUnavailable,
    ComponentOutputError,
    DuplicateNameError,
    EnvMisuseError,
    FormatError,
    InvalidOverrideError,
    InvalidTaskError,
    MissingTaskPackages,
    MLGymRegistryError,
    PluginLoadError,
    PolicyOutputError,
    PrepareFailed,
    TaskFilesMissing,
    UnknownNameError,
)
from .hookspecs import hookimpl
from .interop.torchrl import hooks as _torchrl_hooks
from .registry import Registry, registry
from .specs import ComponentSpec, ResolvedTask, TaskSpec, load_task_yaml

# TorchRL's interop attaches to every env the chain builds and every env factory pickled (torch-free until then): the
# chain and the registry announce those moments (env_hooks) without knowing who listens
env_hooks.ENV_BUILT.append(_torchrl_hooks.env_built)
env_hooks.FACTORY_PICKLED.append(_torchrl_hooks.factory_pickled)

__all__ = [
    "BackendUnavailable",
    "ComponentOutputError",
    "ComponentSpec",
    "DuplicateNameError",
    "FormatError",
    "InvalidOverrideError",
    "InvalidTaskError",
    "MissingTaskPackages",
    "MLGymRegistryError",
    "PluginLoadError",
    "PolicyOutputError",
    "PrepareFailed",
    "EnvMisuseError",
    "Registry",
    "ResolvedTask",
    "TaskFilesMissing",
    "TaskSpec",
    "UnknownNameError",
    "hookimpl",
    "load_task_yaml",
    "make",
    "prepare",
    "registry",
    "spec",
]


def make(name: Any = None, **kwargs: Any):
    """Shorthand for ``registry.make``."""
    return registry.make(name, **kwargs)


def spec(name: Any) -> TaskSpec:
    """Shorthand for ``registry.spec``."""
    return registry.spec(name)


def prepare(task: TaskSpec | str | os.PathLike[str], *, force: bool = False, pip_args: Sequence[str] = (),
            data_dir: str | None = None, echo: Callable[[str], object] = print) -> Path:
    """Shorthand for ``registry.prepare``: make a task (a registered name, a task YAML file or a ``TaskSpec``) ready
    to run offline, its Python environment and then its data, and return its interpreter."""
    return registry.prepare(task, force=force, pip_args=pip_args, data_dir=data_dir, echo=echo)


from .faces.gymnasium_registration import install_hook as _install_gymnasium_hook  # noqa: E402 - once complete

_install_gymnasium_hook()
