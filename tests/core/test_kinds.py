"""The kinds of registered things come from one table (``kinds.KIND_TABLE``): the hook specs, plugin loading, the
specs' component fields, the CLI's ``--kind`` and the errors' labels all agree with it."""

from __future__ import annotations

import inspect

from mlgym_registry import hookspecs, kinds, plugins, registry, specs
from mlgym_registry.cli import build_parser


def test_every_kind_has_its_hook_spec_and_every_registering_hook_a_kind():
    declared = {name for name, value in vars(hookspecs).items()
                if inspect.isfunction(value) and name.startswith("register_")}
    assert declared == {kind.hook for kind in kinds.KIND_TABLE}


def test_the_places_that_list_kinds_derive_them_from_the_table():
    names = tuple(kind.name for kind in kinds.KIND_TABLE)
    components = tuple(kind.name for kind in kinds.KIND_TABLE[1:] if kind.component)
    assert specs.KINDS == names and specs.COMPONENT_KINDS == components
    assert "canary" in names and "canary" not in components  # the audit's canary sets: no task names one
    assert plugins.HOOKS_BY_KIND == {kind.name: kind.hook for kind in kinds.KIND_TABLE}
    assert {kind: registry.names(kind) is not None for kind in names} == dict.fromkeys(names, True)
    kind_choices = [action.choices for parser in _subparsers(build_parser()) for action in parser._actions
                    if "--kind" in action.option_strings and action.choices]
    assert kind_choices and all(tuple(choices) == names for choices in kind_choices)


def _subparsers(parser):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            yield from action.choices.values()
