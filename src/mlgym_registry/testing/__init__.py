"""The conformance kit: check that a component honours its contract before you register it.

Each ``check_*`` function exercises one kind of component the way the chain will, and raises ``ConformanceError``
(an ``AssertionError``, so pytest shows it as a failure) with a message that says what broke and what the contract
expects. They return normally when the component conforms::

    from mlgym_registry.testing import check_parser
    check_parser(MyParser())

``registered_plugin`` is a pytest fixture that adds a plugin to the registry for one test and removes it after;
expose it to your tests with ``from mlgym_registry.testing import registered_plugin`` in your ``conftest.py``.
``integrity_audit`` (a fixture) and ``check_integrity`` run the integrity audit of a task and fail when a canary
beats honest play.
"""

from __future__ import annotations

from ._common import (
    ConformanceError,
)
from .backends import (
    check_backend,
)
from .components import (
    KIT_CHECKS,
    ComponentCheck,
    check_component,
    check_plugin,
)
from .fixture import (
    _registered_plugin as _registered_plugin,
)
from .fixture import integrity_audit, registered_plugin
from .history import (
    check_history_processor,
    example_conversation,
)
from .integrity import check_integrity
from .isolators import (
    COMMAND_HOSTILE_REPLIES,
    EDIT_ACTION,
    EDIT_RESPONSE,
    ISOLATOR_HOSTILE_REPLIES,
    NO_COMMAND_RESPONSES,
    RESPONSE_STYLES,
    check_isolator,
    check_isolator_hostile,
    isolator_responses,
)
from .parsers import (
    HOSTILE_REPLIES,
    ODD_RESPONSES,
    WELL_FORMED_RESPONSES,
    HostileReply,
    check_parser,
    check_parser_hostile,
)
from .rewards import (
    check_reward_assigner,
)
from .tasks import (
    EvaluationRun,
    TaskCheck,
    check_task,
    run_evaluator,
)
from .templates import (
    STATE_FIELDS,
    TOOL_VARIABLES,
    TURN_FIELDS,
    TURN_TEMPLATES,
    check_template,
    template_fields,
)

__all__ = [
    "KIT_CHECKS",
    "COMMAND_HOSTILE_REPLIES",
    "EDIT_ACTION",
    "EDIT_RESPONSE",
    "HOSTILE_REPLIES",
    "ISOLATOR_HOSTILE_REPLIES",
    "NO_COMMAND_RESPONSES",
    "RESPONSE_STYLES",
    "ODD_RESPONSES",
    "WELL_FORMED_RESPONSES",
    "STATE_FIELDS",
    "TOOL_VARIABLES",
    "TURN_FIELDS",
    "TURN_TEMPLATES",
    "ComponentCheck",
    "ConformanceError",
    "EvaluationRun",
    "HostileReply",
    "TaskCheck",
    "check_backend",
    "check_component",
    "check_history_processor",
    "check_integrity",
    "check_isolator",
    "check_isolator_hostile",
    "check_parser",
    "check_parser_hostile",
    "check_plugin",
    "check_reward_assigner",
    "check_task",
    "check_template",
    "example_conversation",
    "integrity_audit",
    "isolator_responses",
    "registered_plugin",
    "run_evaluator",
    "template_fields",
]
