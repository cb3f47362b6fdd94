"""Builds the TorchRL transform chain ``registry.make`` returns (DESIGN.md section 5) from resolved components.

In order: retry skip, action isolator, reset module, task sampler (``tasks=[...]`` only), read state, state to
message, message to history, history view (only with a history processor other than ``full``), chat template,
reward assigner, over a ``BackendEnv`` that steps the backend. The default layout adds the prompt's tokens
(``input_mode="tokens"``), the context policy (token budgets; a cut reply and an overflowing conversation flagged
``length`` and ``overflow``), the group key (``query``) and, last, the batch stage that gives the env TorchRL
``ChatEnv``'s batch shape ``(1,)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..options import Rule, check_options, instance_of, integer_at_least, is_integer, is_number, one_of
from ..specs import ResolvedTask
from .episode_rules import MAX_FORMAT_ERRORS

MAX_OBSERVATION_CHARS = 16_000
"""The default cap on the characters of one observation in the user message (``max_observation_chars``)."""


CHAIN_OPTIONS = (
    "tokenizer",
    "chat_template_name",
    "reward_wrong_format",
    "device",
    "layout",
    "batch_size",
    "input_mode",
    "max_format_errors",
    "max_turns",
    "max_turn_tokens",
    "max_episode_tokens",
    "context_window",
    "on_length",
    "on_overflow",
    "max_observation_chars",
)
"""The keyword options ``build_env`` (and so ``registry.make``) takes for the chain itself."""


def is_batch_size(value: Any) -> bool:
    """True for ``()`` or a shape (a tuple, list or ``torch.Size`` of 1s; an int 1) with exactly one element."""
    if is_integer(value):
        return value == 1
    if not isinstance(value, (tuple, list)):
        return False
    return all(is_integer(dim) and dim == 1 for dim in value)


def is_outcome_action(value: Any) -> bool:
    """True for an ``on_length=``/``on_overflow=`` value: ``"record"``, ``"mask"``, ``"end"``, a finite number (a
    penalty), or a non-empty tuple or list of those (``transforms.context_policy``)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    return bool(items) and all(item in ("record", "mask", "end") if isinstance(item, str) else is_number(item)
                               for item in items)


CHAIN_OPTION_RULES: dict[str, Rule] = {
    "chat_template_name": instance_of("a string", str, optional=True),
    "reward_wrong_format": Rule("a number", is_number, optional=True),
    "input_mode": one_of("history", "text", "tokens"),
    "max_format_errors": integer_at_least(1, optional=True),
    "max_turns": integer_at_least(1, optional=True),
    "max_turn_tokens": integer_at_least(1, optional=True),
    "max_episode_tokens": integer_at_least(1, optional=True),
    "context_window": integer_at_least(1, optional=True),
    "max_observation_chars": integer_at_least(1, optional=True),
    **{name: Rule("'record', 'mask', 'end', a finite number (a penalty) or a tuple of those", is_outcome_action)
       for name in ("on_length", "on_overflow")},
    "batch_size": Rule(
        "a shape of one element ((1,), the default; (1, 1), ...) or () for the chain's unbatched tensordicts",
        is_batch_size,
        optional=True,
    ),
}
"""The rule of each chain option that has one (``tokenizer``, ``device`` and ``layout`` are checked where used)."""


def shapes_history(processor: Any) -> bool:
    """True when ``processor`` (a task's history processor) may show the policy less than the whole conversation:
    anything but None and processors that declare ``keeps_all = True`` (``full``)."""
    return processor is not None and not getattr(processor, "keeps_all", False)


def build_env(
    resolved: Sequence[ResolvedTask],
    *,
    multi_task: bool = False,
    tokenizer: Any = None,
    chat_template_name: str | None = None,
    reward_wrong_format: float | None = None,
    device: Any = None,
    layout: Any = "default",
    batch_size: Any = None,
    input_mode: str = "history",
    max_format_errors: int | None = MAX_FORMAT_ERRORS,
    max_turns: int | None = None,
    max_turn_tokens: int | None = None,
    max_episode_tokens: int | None = None,
    context_window: int | None = None,
    on_length: Any = "record",
    on_overflow: Any = "end",
    max_observation_chars: int | None = MAX_OBSERVATION_CHARS,
):
    """The TorchRL env of ``resolved`` tasks: a ``TransformedEnv`` over a ``BackendEnv``.

    Args:
        resolved: one ``ResolvedTask`` per task (several with ``multi_task=True``: one is sampled on every reset).
        multi_task: add the task sampler, which writes ``task`` at reset.
        tokenizer: a tokenizer object or the local folder of a saved one; its chat template renders the prompt.
        chat_template_name: a chat template TorchRL knows by name (``"chatml_format"``, ``"qwen"``, ...); it wins
            over the tokenizer's template. With neither, ``"chatml_format"``.
        reward_wrong_format: reward added on a step whose response held no usable action (None: no penalty).
        device: the env's device.
        layout: ``"default"`` (TorchRL's LLM keys) or ``"seed"`` (the reference's flat keys and shapes).
        batch_size: the env's batch size: ``(1,)`` by default in the default layout (TorchRL's ``ChatEnv``), any
            shape of one element, or ``()`` for the chain's own unbatched tensordicts (the seed layout's only shape).
        input_mode: ``"history"``, ``"text"`` or ``"tokens"``, as ``ChatEnv`` names them: what the policy reads.
            Every mode writes ``("history", "prompt")`` and ``("text", "prompt")``; ``"tokens"`` adds
            ``("tokens", "prompt")`` and needs ``tokenizer``.
        max_format_errors: format errors in a row after which the episode ends with MLGym's ``exit_format``
            (None: never).
        max_turns: the most turns of an episode, format errors included; the last one ends it as truncated
            (None: one more than ``max_format_errors`` lets the episode take).
        max_turn_tokens: the policy's ``max_new_tokens``: a reply of that many tokens that does not end its turn was
            cut (outcome ``"length"``; None: any reply that does not end its turn was).
        max_episode_tokens: the most tokens the policy may generate in one episode (its replies' sum).
        context_window: the most tokens of a prompt and its reply; a next prompt that leaves less room than
            ``max_turn_tokens`` is an ``"overflow"`` (so is running out of ``max_episode_tokens``).
        on_length, on_overflow: what a ``"length"``/``"overflow"`` turn does besides being flagged at
            ``("next", "length")``/``("next", "overflow")``: ``"record"``, ``"mask"`` (``("next", "masked")``),
            ``"end"`` (truncated), a number (a reward added), or a tuple of those (``transforms.context_policy``).
        max_observation_chars: the most characters of a command's output the next user message shows; a longer
            output keeps its head and tail around a note saying how many characters were cut (None: no cap).
    """
    import tensordict
    from torchrl.envs import Compose

    from . import (
        ActionIsolator,
        BackendEnv,
        ChatBatch,
        ChatTemplate,
        ContextPolicy,
        GroupKey,
        HistoryView,
        MessageToHistory,
        ReadState,
        ResetModule,
        RetrySkip,
        RewardAssigner,
        StateToMessage,
        TaskSampler,
        TokensPrompt,
    )
    from .chain_env import ChainEnv
    from .layout import get_layout

    if not resolved:
        raise ValueError("build_env needs at least one resolved task")
    if len(resolved) > 1 and not multi_task:
        raise ValueError("several tasks need multi_task=True (registry.make(tasks=[...]))")
    # TorchRL's History refuses to exist otherwise; its LLM wrappers set the same flag.
    tensordict.set_list_to_stack(True).set()
    keys = get_layout(layout)
    check_options(  # registry.make checked them already; build_env may be called directly
        {"batch_size": batch_size, "input_mode": input_mode, "max_format_errors": max_format_errors,
         "max_turns": max_turns, "max_turn_tokens": max_turn_tokens, "max_episode_tokens": max_episode_tokens,
         "context_window": context_window, "on_length": on_length, "on_overflow": on_overflow,
         "max_observation_chars": max_observation_chars}, CHAIN_OPTION_RULES, "a chain option")
    if keys.query is None and (input_mode == "tokens" or batch_size not in (None, ())):
        raise ValueError(
            f"the {keys.name!r} layout keeps the reference's unbatched, text-only env; batch_size and "
            "input_mode='tokens' need layout='default'"
        )
    budgets = {"max_turn_tokens": max_turn_tokens, "max_episode_tokens": max_episode_tokens,
               "context_window": context_window, "on_length": on_length != "record",
               "on_overflow": on_overflow != "end"}
    if keys.query is None and any(value not in (None, False) for value in budgets.values()):
        raise ValueError(f"the {keys.name!r} layout has no context policy (token budgets and their outcomes); "
                         "max_turn_tokens, max_episode_tokens, context_window, on_length and on_overflow need "
                         "layout='default'")
    if batch_size is None:
        batch_size = () if keys.query is None else (1,)
    processing = any(shapes_history(task.history) for task in resolved)
    if processing:
        keys = keys.with_conversation()
    base = BackendEnv(resolved, keys, device=device, max_format_errors=max_format_errors, max_turns=max_turns)
    stages = [
        RetrySkip(keys),
        ActionIsolator(keys, reward_wrong_format=reward_wrong_format),
        ResetModule(keys),
    ]
    if multi_task:
        stages.append(TaskSampler(keys, list(base.tasks)))
    from ..components.tool_calling import parser_tools

    # a tool-calling parser's tools go to the chat template (the first task's that has any: one renderer per env)
    tools = next((found for found in (parser_tools(task.parser) for task in resolved) if found), None)
    chat_template = ChatTemplate(keys, tokenizer=tokenizer, chat_template_name=chat_template_name, tools=tools)
    message = StateToMessage(keys, max_observation_chars=max_observation_chars)
    stages += [ReadState(keys), message, MessageToHistory(keys)]
    if processing:
        stages.append(HistoryView(keys))
        if chat_template.tokenizer is not None:
            for task in resolved:
                set_tokenizer = getattr(task.history, "set_tokenizer", None)
                if callable(set_tokenizer):
                    set_tokenizer(chat_template.tokenizer)
    stages.append(chat_template)
    if input_mode == "tokens":
        stages.append(TokensPrompt(keys, chat_template.tokenizer, chat_template.prompt))
    stages.append(RewardAssigner(keys))
    if keys.query is not None:
        stages.append(ContextPolicy(
            keys, chat_template.tokenizer, end_of_turn=chat_template.renderer.end_of_turn,
            max_turn_tokens=max_turn_tokens, max_episode_tokens=max_episode_tokens, context_window=context_window,
            on_length=on_length, on_overflow=on_overflow, prompt_tokens=input_mode == "tokens",
        ))
        stages.append(GroupKey(keys))
    if tuple(batch_size) != ():
        stages.append(ChatBatch(keys, batch_size))
    return ChainEnv(base, Compose(*stages))
