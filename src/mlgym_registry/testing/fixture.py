"""The kit's pytest fixtures: ``registered_plugin`` and ``integrity_audit``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._common import ConformanceError


def _registered_plugin() -> Iterator[Callable[..., Any]]:
    from ..registry import registry as default_registry

    added: list[tuple[Any, str]] = []

    def add(plugin: object, name: str | None = None, *, registry: Any = None) -> Any:
        """Load ``plugin`` (a module or object with ``@hookimpl`` functions) into the registry for this test."""
        target = registry or default_registry
        installed = target.plugin_info(plugin)
        if installed is not None:  # loaded already from its entry point (the plugin is pip-installed): keep it as is
            return installed
        plugin_name = name or getattr(plugin, "__name__", None) or f"test-plugin-{id(plugin)}"
        info = target.add_plugin(plugin, name=plugin_name)
        added.append((target, plugin_name))
        if info.error:
            raise ConformanceError(f"plugin {plugin_name!r} failed to load: {info.error}")
        return info

    try:
        yield add
    finally:
        for target, plugin_name in reversed(added):
            target.remove_plugin(plugin_name)


def _integrity_audit() -> Callable[..., Any]:
    from .integrity import check_integrity

    return check_integrity


try:
    import pytest
except ImportError:  # pytest is only needed by people testing plugins
    registered_plugin = integrity_audit = None
else:
    registered_plugin = pytest.fixture(_registered_plugin)
    registered_plugin.__doc__ = (
        "A pytest fixture: ``registered_plugin(plugin, name=None)`` loads ``plugin`` into the registry for the "
        "current test and removes it, with everything it registered, when the test ends. A plugin the registry "
        "loaded already from its entry point (installed with pip) is left as it is, and its ``PluginInfo`` returned."
    )
    integrity_audit = pytest.fixture(_integrity_audit)
    integrity_audit.__doc__ = (
        "A pytest fixture: ``integrity_audit(task, rewards=None, canaries=None, **make_options)`` runs the integrity "
        "audit of ``task`` and fails the test (``ConformanceError``, with the audit's table) when a canary beat "
        "honesty; it returns the ``IntegrityReport``."
    )
