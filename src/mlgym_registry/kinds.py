"""The kinds of things the registry holds, in one table: each kind's name, the hook plugins register it through, the
words messages call it by, and, for a kind whose name may also be a path to a file, the loader of that file.

Everything that lists the kinds derives from ``KIND_TABLE``: the spec's component fields (``specs.COMPONENT_KINDS``),
plugin loading (``plugins.HOOKS_BY_KIND``), the option rules of component names, component errors' labels, the
registry's path loaders and the CLI's ``--kind`` choices. Adding a kind is one entry here, plus its hook
specification in ``hookspecs.py`` (a test checks that each kind's hook is there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One kind of registered thing."""

    name: str
    """What ``registry.names(kind)``, a task spec's field and ``--kind`` call it."""
    hook: str
    """The hook a plugin registers it through."""
    label: str
    """What messages call one of them (``"reward assigner 'shaped'"``)."""
    path_loader: str | None = None
    """For a kind whose name may be a path to a file: the ``module:attribute`` that loads that file."""
    component: bool = True
    """Whether a task spec names one of this kind (its component field); canary sets serve the audit, not a task."""


KIND_TABLE: tuple[Kind, ...] = (
    Kind("task", "register_tasks", "task", "mlgym_registry.tasks.mlgym_source:load_task_file"),
    Kind("backend", "register_backends", "backend"),
    Kind("parser", "register_parsers", "parser"),
    Kind("template", "register_templates", "template set", "mlgym_registry.components.templates:load_agent_yaml"),
    Kind("reward", "register_reward_assigners", "reward assigner"),
    Kind("isolator", "register_action_isolators", "action isolator"),
    Kind("history", "register_history_processors", "history processor"),
    Kind("canary", "register_canaries", "canary set", component=False),
)
"""Every kind, tasks first."""

KINDS: tuple[str, ...] = tuple(kind.name for kind in KIND_TABLE)
COMPONENT_KINDS: tuple[str, ...] = tuple(kind.name for kind in KIND_TABLE[1:] if kind.component)
"""The kinds a task spec names (all but ``task`` and the audit's canary sets)."""

HOOKS_BY_KIND: dict[str, str] = {kind.name: kind.hook for kind in KIND_TABLE}
LABELS: dict[str, str] = {kind.name: kind.label for kind in KIND_TABLE}
PATH_LOADERS: dict[str, str] = {kind.name: kind.path_loader for kind in KIND_TABLE if kind.path_loader}
"""Kinds whose name may also be a path to a file, and the loader that turns that file into the component. A path
travels in a spec as it is, so a worker process rebuilds the same component without any registration."""
