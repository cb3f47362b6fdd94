"""Every task of the registry as a Gymnasium env id, ``mlgym_registry/<task>``, registered without importing torch.

``import mlgym_registry`` registers the tasks as soon as Gymnasium is imported: at once when it is already, else right
after ``import gymnasium`` runs (a finder on ``sys.meta_path``, removed once Gymnasium is imported). Importing Gymnasium
costs numpy, which listing tasks must not (``mlgym-registry list`` stays fast), so this package never imports it
itself. Each id is registered with the entry point ``mlgym_registry.faces.gymnasium:MLGymRegistryEnv`` and the
task's name: nothing of the task is resolved, and no env is built, until ``gymnasium.make`` is called.

A task name with ``/`` (``mlgym/titanicSurvival``, an MLGym checkout's task) is not a valid Gymnasium name, so ``/``
becomes ``.``: ``mlgym_registry/mlgym.titanicSurvival``. Names Gymnasium cannot hold even then (spaces, ``:``) are
left out. Tasks registered later (``registry.register``, ``registry.reload()`` after setting ``MLGYM_ROOT``) get
their ids from another call to ``register_envs()``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import threading
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

NAMESPACE = "mlgym_registry"
"""The Gymnasium namespace of every task: ``gymnasium.make("mlgym_registry/prisonersDilemma")``."""

ENTRY_POINT = "mlgym_registry.faces.gymnasium:MLGymRegistryEnv"
"""What ``gymnasium.make`` calls, with ``task=<the registry's name>`` and the caller's keyword arguments."""

_GYM_NAME = re.compile(r"[\w.-]+")


def gym_id(task: str) -> str | None:
    """The Gymnasium id of the registry's task ``task`` (``/`` in the name becomes ``.``), or None when Gymnasium
    cannot hold the name."""
    name = task.replace("/", ".")
    return f"{NAMESPACE}/{name}" if _GYM_NAME.fullmatch(name) else None


def register_envs(tasks: Sequence[str] | None = None) -> dict[str, str]:
    """Register ``tasks`` (default: every task of the process-wide registry) in Gymnasium; returns ``{gym id: task}``.

    Imports Gymnasium. Calling it again registers what is new and leaves the ids already registered as they are."""
    import gymnasium

    if tasks is None:
        from ..registry import registry

        tasks = registry.names("task")
    registered: dict[str, str] = {}
    for task in tasks:
        env_id = gym_id(task)
        if env_id is None or env_id in registered:
            continue
        registered[env_id] = task
        existing = gymnasium.registry.get(env_id)
        if existing is not None and existing.kwargs.get("task") == task:
            continue
        gymnasium.register(env_id, entry_point=ENTRY_POINT, kwargs={"task": task}, nondeterministic=False)
    return registered


def _register_quietly() -> None:
    """``register_envs()``, turning any failure into a warning: importing Gymnasium must never fail because of us."""
    try:
        register_envs()
    except Exception as exc:  # noqa: BLE001 - a plugin that fails to load in strict mode, a broken task name
        warnings.warn(f"mlgym_registry could not register its tasks in Gymnasium: {type(exc).__name__}: {exc}; "
                      "call mlgym_registry.faces.gymnasium_registration.register_envs() to see the error",
                      RuntimeWarning, stacklevel=2)


class _LoaderThenRegister(importlib.abc.Loader):
    """Gymnasium's own loader, registering our tasks once Gymnasium's package has run."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        uninstall_hook()
        module.__loader__ = self._loader  # later readers of the module see Gymnasium's loader, not this wrapper
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _register_quietly()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _GymnasiumFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asked for ``gymnasium``, it wraps the spec the other finders give. It stays in place
    until Gymnasium is imported, since a ``find_spec`` call alone (TorchRL asks whether Gymnasium is installed)
    imports nothing."""

    def __init__(self) -> None:
        self._local = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "gymnasium" or getattr(self._local, "searching", False):
            return None
        self._local.searching = True  # the search below asks every finder, this one included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._local.searching = False
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, _LoaderThenRegister):
            spec.loader = _LoaderThenRegister(spec.loader)
        return spec


def uninstall_hook() -> None:
    """Remove the finder ``install_hook`` put on ``sys.meta_path`` (if it is there)."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _GymnasiumFinder)]


def install_hook() -> None:
    """Register the tasks in Gymnasium now when it is imported already, else right after it is imported."""
    if "gymnasium" in sys.modules:
        _register_quietly()
    elif not any(isinstance(finder, _GymnasiumFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GymnasiumFinder())
