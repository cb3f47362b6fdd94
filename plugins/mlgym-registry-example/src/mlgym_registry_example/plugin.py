"""The plugin module named by this distribution's ``mlgym_registry`` entry point.

It registers components by lazy reference, so listing them imports nothing but this module.
"""

from __future__ import annotations

from mlgym_registry import hookimpl


@hookimpl
def register_parsers(register):
    register(
        "json_command",
        "mlgym_registry_example.components:JsonCommandParser",
        description='The action is the "command" of a JSON object {"thought": ..., "command": ...}.',
    )


@hookimpl
def register_reward_assigners(register):
    register(
        "relative_improvement",
        "mlgym_registry_example.components:RelativeImprovementReward",
        description="Each new score's improvement over the baseline, relative to the baseline's size.",
    )
