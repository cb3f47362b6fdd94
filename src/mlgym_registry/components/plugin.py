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
    register("answer_or_command", f"{_PKG}.parsers:AnswerOrCommandParser",
             description="A fenced block is a command; any other reply is the final answer, written to answer.txt "
                         "and submitted (answer tasks such as capitals).")
    register("tool_calls", f"{_PKG}.tool_calling:ToolCallParser",
             description="Native tool calling: one tool call (OpenAI tool_calls, or <tool_call> JSON text) is the "
                         "command; MLGym's commands and bash are JSON-schema tools.")


@hookimpl
def register_templates(register):
    register("mlgym_default", f"{_PKG}.templates:mlgym_default",
             description="Our own wording with MLGym's template fields, placeholders and status block.")
    register("short", f"{_PKG}.templates:short",
             description="A few hundred tokens: the commands' signatures, the reply format, the task and the status "
                         "block (for training small models; same tool language as mlgym_default).")
    register("tool_calling", f"{_PKG}.tool_calling:tool_calling",
             description="mlgym_default's turns with a system message for tool-calling runs (parser tool_calls).")


@hookimpl
def register_reward_assigners(register):
    register("mlgym_score_delta", f"{_PKG}.rewards:ScoreDeltaReward",
             description="The evaluator's score minus the task's baseline at EVERY real validate and at the final "
                         "submission (the reference chain's reward: sums grow with validates, so train with "
                         "mlgym_best_improvement); failures pay the task's floor, infra errors 0.",
             farmable=True)  # documented: the integrity audit reports its farming, and does not fail a task on it
    register("mlgym_best_improvement", f"{_PKG}.rewards:BestImprovementReward",
             description="Pays only improvements of the episode's best score (the first score pays score minus "
                         "baseline), and the submission takes the total to its own score: an episode sums to its "
                         "submission's score minus the baseline however often it validates; failures pay the task's "
                         "floor. The reward to train on.")


@hookimpl
def register_history_processors(register):
    register("full", f"{_PKG}.history_processors:FullHistory",
             description="The whole conversation, unchanged (TorchRL's MLGym chain).")
    register("last_n_observations", f"{_PKG}.history_processors:LastNObservations",
             description="The task and the last 5 user messages in full, older ones cut to a one-line note "
                         "(MLGym's default agent).")
    register("token_budget", f"{_PKG}.history_processors:TokenBudget",
             description="The system message, the task and the latest turns that fit in 8192 tokens (the env's "
                         "tokenizer counts them).")


@hookimpl
def register_action_isolators(register):
    register("code_block", f"{_PKG}.isolators:CodeBlockIsolator",
             description="Parse the response (FormatError when it holds no action), heredoc-guard edit/insert bodies.")
