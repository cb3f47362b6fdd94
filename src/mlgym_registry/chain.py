"""Builds the TorchRL transform chain ``registry.make`` returns (DESIGN.md section 5) from resolved components.

In order: retry skip, action isolator, reset module, task sampler (``tasks=[...]`` only), read state, state to
message, message to history, chat template, reward assigner, over a ``BackendEnv`` that steps the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .specs import ResolvedTask

CHAIN_OPTIONS = ("tokenizer", "chat_template_name", "reward_wrong_format", "device", "layout")
"""The keyword options ``build_env`` (and so ``registry.make``) takes for the chain itself."""


def build_env(
    resolved: Sequence[ResolvedTask],
    *,
    multi_task: bool = False,
    tokenizer: Any = None,
    chat_template_name: str | None = None,
    reward_wrong_format: float | None = None,
    device: Any = None,
    layout: Any = "default",
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
        layout: ``"default"`` (TorchRL's LLM keys) or ``"seed"`` (the reference's flat keys).
    """
    import tensordict
    from torchrl.envs import Compose, TransformedEnv

    from .transforms import (
        ActionIsolator,
        BackendEnv,
        ChatTemplate,
        MessageToHistory,
        ReadState,
        ResetModule,
        RetrySkip,
        RewardAssigner,
        StateToMessage,
        TaskSampler,
    )
    from .transforms.layout import get_layout

    if not resolved:
        raise ValueError("build_env needs at least one resolved task")
    if len(resolved) > 1 and not multi_task:
        raise ValueError("several tasks need multi_task=True (registry.make(tasks=[...]))")
    # TorchRL's History refuses to exist otherwise; its LLM wrappers set the same flag.
    tensordict.set_list_to_stack(True).set()
    keys = get_layout(layout)
    base = BackendEnv(resolved, keys, device=device)
    stages = [
        RetrySkip(keys),
        ActionIsolator(keys, reward_wrong_format=reward_wrong_format),
        ResetModule(keys),
    ]
    if multi_task:
        stages.append(TaskSampler(keys, list(base.tasks)))
    stages += [
        ReadState(keys),
        StateToMessage(keys),
        MessageToHistory(keys),
        ChatTemplate(keys, tokenizer=tokenizer, chat_template_name=chat_template_name),
        RewardAssigner(keys),
    ]
    return TransformedEnv(base, Compose(*stages))
