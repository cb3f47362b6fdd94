"""The plugin hook specification.

A plugin is a module (or object) with one or more functions marked ``@hookimpl`` whose names are below. Each hook is
called once, when the registry first loads its plugins, with a ``register`` callable::

    register(name: str, obj_or_ref: object | str, **meta) -> None

``obj_or_ref`` is the component itself or a lazy ``"package.module:attribute"`` reference that is imported only when the
component is first used. ``meta`` is free-form; ``description=`` is shown by ``mlgym-registry list`` and
``replace=True`` lets a plugin knowingly take over a name another plugin registered.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT_NAME = "mlgym_registry"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[..., None]


@hookspec
def register_tasks(register: Register) -> None:
    """Register tasks: a ``TaskSpec``, a path to a task YAML file, or a callable returning a ``TaskSpec``."""


@hookspec
def register_backends(register: Register) -> None:
    """Register execution backends: factories ``backend(spec: TaskSpec, **options) -> Backend`` (backends.protocol).

    A factory's options are its own: ``make`` checks their values only against the factory's ``option_rules``
    (a mapping of names to ``options.Rule``), when it declares any."""


@hookspec
def register_parsers(register: Register) -> None:
    """Register output parsers: ``parser(response: str) -> (thought, action)``, raising ``FormatError`` on no action."""


@hookspec
def register_templates(register: Register) -> None:
    """Register prompt template sets: a ``TemplateSet`` (or a zero-argument callable returning one)."""


@hookspec
def register_reward_assigners(register: Register) -> None:
    """Register reward assigners: ``reward(observation: str, info: dict, spec: TaskSpec) -> float``."""


@hookspec
def register_history_processors(register: Register) -> None:
    """Register history processors: ``processor(messages: list[dict]) -> list[dict]``, what of the conversation
    the policy sees (components.history_processors)."""


@hookspec
def register_action_isolators(register: Register) -> None:
    """Register action isolators: ``isolator(response: str, parser) -> action``; ``FormatError`` on no action."""


@hookspec
def register_canaries(register: Register) -> None:
    """Register canary sets for the integrity audit: ``canaries(spec: TaskSpec) -> Iterable[Canary]``
    (``mlgym_registry.integrity.Canary``), the behaviours ``check --integrity`` plays against a task; return none for
    a task the set does not apply to."""
