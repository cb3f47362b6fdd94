"""The default components, registered as an ordinary plugin with lazy references (nothing heavy is imported here)."""

from __future__ import annotations

from ..hookspecs import hookimpl

_PKG = "mlgym_registry.components"


@hookimpl
def register_parsers(register):
    register("thought_action", f"{_PKG}.parsers:ThoughtActionParser",
             description="The last complete top-level fenced block is the action (MLGym's ThoughtActionParser; "
                         "TorchRL's default).")
    register("mlgym_thought_action", f"{_PKG}.parsers:StrictThoughtActionParser",
             description="Like thought_action, but more than one code block is a format error (MLGym's default agent).")
    register("xml_thought_action", f"{_PKG}.parsers:XMLThoughtActionParser",
             description="The last <command>...</command> is the action.")
    register("identity", f"{_PKG}.parsers:IdentityParser", description="The whole response is the action.")


@hookimpl
def register_templates(register):
    register("mlgym_default", f"{_PKG}.templates:mlgym_default",
             description="Our own wording with MLGym's template fields, placeholders and status block.")


@hookimpl
def register_reward_assigners(register):
    register("mlgym_score_delta", f"{_PKG}.rewards:ScoreDeltaReward",
             description="Evaluation score minus baseline, from validate observations and the final submission score.")


@hookimpl
def register_action_isolators(register):
    register("code_block", f"{_PKG}.isolators:CodeBlockIsolator",
             description="Parse the response (FormatError when it holds no action), heredoc-guard edit/insert bodies.")
