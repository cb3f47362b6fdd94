"""Plugin loading: the package's own defaults first, then each ``mlgym_registry`` entry point on its own.

A plugin that fails to import, raises in a hook or registers a name that is taken is recorded as a
``PluginLoadError`` (and warned about with a ``PluginLoadWarning``) and all of its registrations are dropped; the
others still load. ``MLGYM_REGISTRY_STRICT=1`` raises instead. A plugin that takes over a name with ``replace=True``
is warned about with a ``PluginReplaceWarning`` naming both providers.

Environment variables:

- ``MLGYM_REGISTRY_LOAD_PLUGINS``: comma list of distributions whose entry points load (empty string: none).
- ``MLGYM_REGISTRY_BLOCK_PLUGINS``: comma list of distributions, entry-point names or built-in modules not to load.
- ``MLGYM_REGISTRY_STRICT``: ``1`` turns load errors into exceptions.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .errors import DuplicateNameError, MLGymRegistryError, PluginLoadError
from .kinds import HOOKS_BY_KIND

DEFAULT_PLUGINS: tuple[str, ...] = (
    "mlgym_registry.components.plugin",
    "mlgym_registry.backends.plugin",
    "mlgym_registry.tasks.plugin",
    "mlgym_registry.tasks.mlgym_source",
    "mlgym_registry.integrity.plugin",
)
"""The package's own plugins, registered exactly like third-party ones, before any entry point."""


BUILTIN_DISTRIBUTION = "mlgym-registry"


class PluginLoadWarning(RuntimeWarning):
    """A plugin failed to load (its ``PluginLoadError`` is the message); the other plugins loaded."""


class PluginReplaceWarning(UserWarning):
    """A plugin took over a name another provider registered (``replace=True``); the message names both."""


@dataclass
class Registration:
    """One ``register(name, obj_or_ref, **meta)`` call, kept until its plugin has loaded without error."""

    kind: str
    name: str
    obj: Any
    meta: dict[str, Any]
    plugin: str
    distribution: str | None


@dataclass
class PluginInfo:
    """What ``registry.plugins()`` reports about one plugin."""

    name: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None
    builtin: bool = False
    hooks: list[str] = field(default_factory=list)
    error: str | None = None
    replaces: list[str] = field(default_factory=list)
    """One line per name this plugin took over with ``replace=True``, naming the provider it replaced."""
    refused: list[str] = field(default_factory=list)
    """One line per name refused because a built-in component holds it (the plugin's other names loaded)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**self.__dict__, "hooks": list(self.hooks), "replaces": list(self.replaces),
                "refused": list(self.refused)}


def env_list(variable: str) -> set[str] | None:
    """The comma list in ``variable`` as a set (None when the variable is unset)."""
    value = os.environ.get(variable)
    if value is None:
        return None
    return {item.strip() for item in value.split(",") if item.strip()}


def strict_mode() -> bool:
    """True when ``MLGYM_REGISTRY_STRICT`` asks for load errors to raise."""
    return os.environ.get("MLGYM_REGISTRY_STRICT", "").strip().lower() in {"1", "true", "yes", "on"}


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-")


def iter_entry_points() -> Iterator[metadata.EntryPoint]:
    """Entry points of group ``mlgym_registry``, one per (distribution, name)."""
    seen: set[tuple[str | None, str]] = set()
    for ep in metadata.entry_points(group=hookspecs.PROJECT_NAME):
        dist = ep.dist.name if ep.dist is not None else None
        if (dist, ep.name) not in seen:
            seen.add((dist, ep.name))
            yield ep


def new_plugin_manager() -> pluggy.PluginManager:
    """A pluggy manager that knows our hook specification."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


class BuiltinNameRefused(MLGymRegistryError):
    """A plugin registered a name a built-in component holds, without ``replace=True``: that one name was refused,
    the plugin's other components loaded. The message says how to rename it."""

    def __init__(self, registration: Registration, builtin_plugin: str | None):
        self.kind, self.name = registration.kind, registration.name
        self.plugin, self.distribution = registration.plugin, registration.distribution
        provider = f"distribution {self.distribution!r}" if self.distribution else f"plugin {self.plugin!r}"
        prefix = (self.distribution or self.plugin or "my").replace("-", "_")
        super().__init__(
            f"{provider} registers {self.kind} {self.name!r}, a name the built-in plugin {builtin_plugin!r} "
            f"({BUILTIN_DISTRIBUTION}) holds: that {self.kind} was refused, the plugin's other components loaded. "
            f"Rename yours: register({prefix + '_' + self.name!r}, ...) in the plugin's {HOOKS_BY_KIND[self.kind]} "
            f"hook, and use that name in your tasks; or pass "
            f"replace=True to take over the built-in {self.name!r} on purpose."
        )


class PluginLoader:
    """Loads plugins into a pluggy manager and hands their registrations to ``sink``.

    ``screen(registrations)`` (optional) returns the registrations to store and the ``BuiltinNameRefused`` of each
    that takes a built-in name without ``replace=True``; in strict mode it is not called, so such a name fails the
    plugin. ``sink(registrations)`` then stores all of them or none: it raises ``DuplicateNameError`` (storing
    nothing) when a name is taken, and returns one line per name taken over with ``replace=True``, naming the
    provider replaced.
    """

    def __init__(self, sink: Callable[[list[Registration]], list[str]],
                 screen: Callable[[list[Registration]], tuple[list[Registration], list[BuiltinNameRefused]]]
                 | None = None):
        self.pm = new_plugin_manager()
        self.sink = sink
        self.screen = screen
        self.infos: list[PluginInfo] = []
        self.errors: list[PluginLoadError] = []

    def load_all(self) -> None:
        """Load the built-in plugins, then every allowed entry point."""
        blocked = {_normalise(n) for n in env_list("MLGYM_REGISTRY_BLOCK_PLUGINS") or set()}
        allowed = env_list("MLGYM_REGISTRY_LOAD_PLUGINS")
        allowed = None if allowed is None else {_normalise(n) for n in allowed}
        for module_name in DEFAULT_PLUGINS:
            if _normalise(module_name) in blocked:
                continue
            info = PluginInfo(name=module_name, distribution=BUILTIN_DISTRIBUTION, builtin=True)
            self._load(info, lambda module_name=module_name: importlib.import_module(module_name))
        for ep in iter_entry_points():
            dist = ep.dist.name if ep.dist is not None else None
            names = {_normalise(ep.name)} | ({_normalise(dist)} if dist else set())
            if names & blocked:
                continue
            if allowed is not None and not (dist and _normalise(dist) in allowed):
                continue
            version = ep.dist.version if ep.dist is not None else None
            info = PluginInfo(name=ep.name, distribution=dist, version=version, entry_point=f"{ep.name} = {ep.value}")
            self._load(info, ep.load)

    def load_object(self, plugin: object, name: str, distribution: str | None = None) -> PluginInfo:
        """Register an already-imported plugin object (tests, notebooks)."""
        info = PluginInfo(name=name, distribution=distribution)
        self._load(info, lambda: plugin)
        return info

    def _load(self, info: PluginInfo, importer: Callable[[], object]) -> None:
        self.infos.append(info)
        plugin = None
        fix = None
        try:
            try:
                plugin = importer()
            except Exception as exc:  # noqa: BLE001 - re-raised, with the fix when the entry point is misspelt
                fix = entry_point_fix(info) if _misspelt_entry_point(info, exc) else None
                raise
            if self.pm.is_registered(plugin):
                info.error = "already registered under another name"
                return
            self.pm.register(plugin, name=f"{info.distribution}:{info.name}")
            pending = self._collect(plugin, info)
            refused: list[BuiltinNameRefused] = []
            if self.screen is not None and not strict_mode():
                pending, refused = self.screen(pending)
            replaced = self.sink(pending)  # all of the plugin's names, or none
        except Exception as exc:  # noqa: BLE001 - any failure of a plugin is that plugin's, not ours
            if plugin is not None and self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            self._fail(info, exc, fix)
            return
        for line in replaced:
            info.replaces.append(line)
            warnings.warn(line, PluginReplaceWarning, stacklevel=5)
        for error in refused:
            info.refused.append(str(error))
            self.errors.append(error)
            warnings.warn(str(error), PluginLoadWarning, stacklevel=5)

    def _collect(self, plugin: object, info: PluginInfo) -> list[Registration]:
        """Call each of ``plugin``'s hooks on its own and gather what it registers."""
        pending: list[Registration] = []
        for kind, hook_name in HOOKS_BY_KIND.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                info.hooks.append(hook_name)

                def register(name: str, obj_or_ref: Any, _kind: str = kind, **meta: Any) -> None:
                    if not isinstance(name, str) or not name:
                        raise TypeError(f"register() needs a non-empty string name, got {name!r}")
                    pending.append(Registration(_kind, name, obj_or_ref, meta, info.name, info.distribution))

                impl.function(**{arg: register for arg in impl.argnames})
        return pending

    def _fail(self, info: PluginInfo, exc: Exception, fix: str | None = None) -> None:
        if strict_mode():
            raise exc if isinstance(exc, DuplicateNameError) else PluginLoadError(
                info.name, info.distribution, info.entry_point, exc, fix
            ) from exc
        error = PluginLoadError(info.name, info.distribution, info.entry_point, exc, fix)
        info.error = str(error)
        self.errors.append(error)
        warnings.warn(str(error), PluginLoadWarning, stacklevel=6)


def _misspelt_entry_point(info: PluginInfo, exc: Exception) -> bool:
    """Whether loading ``info``'s entry point failed because the entry point itself names nothing (a misspelt
    module or attribute), rather than because the module it names failed."""
    if info.entry_point is None:
        return False
    value = info.entry_point.partition("=")[2].strip()
    module_name, _, attr = value.partition(":")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return module_name == exc.name or module_name.startswith(exc.name + ".")
    return isinstance(exc, AttributeError) and bool(attr) and attr.split(".")[0] in str(exc)


def entry_point_fix(info: PluginInfo) -> str:
    """How to fix a misspelt entry point: where it is declared, and that the installed metadata must be renewed."""
    return (f"The entry point {info.entry_point!r} names a module or attribute that does not exist: fix it in the "
            f"distribution's pyproject.toml ([project.entry-points.mlgym_registry]) and reinstall the distribution "
            f"(pip install -e PATH; entry points are read from the installed metadata, so an edit shows only after "
            f"reinstalling), or block it")
