"""The conversation as a TorchRL ``History``, grown one turn at a time without re-reading what came before."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torchrl.data import Composite, NonTensor
from torchrl.data.llm import History

HISTORY_FIELDS = ("role", "content", "is_complete")
"""The fields a ``History`` actually stores. ``History.default_spec()`` also declares ``tool_calls`` and
``tool_responses``, which are never stored, so ``check_env_specs`` fails on it (reference bug #4)."""


def history_spec(device: torch.device | None = None) -> Composite:
    """The spec of a one-conversation ``History`` of any length: only the fields that are stored."""
    examples = {"role": "user", "content": "a message", "is_complete": True}
    return Composite(
        {key: NonTensor(example_data=examples[key], shape=(-1,), device=device) for key in HISTORY_FIELDS},
        shape=(),
        data_cls=History,
        device=device,
    )


def message(role: str, content: str, device: torch.device | None = None) -> TensorDict:
    """One chat message as the tensordict a ``History`` element holds."""
    history = History(role=role, content=content, batch_size=(), device=device)
    return history._tensordict


def history_from(messages: list[TensorDict]) -> History:
    """A ``History`` of shape ``(len(messages),)`` over already-built message tensordicts.

    The messages are shared, not copied: building a history one turn longer than the last costs a list copy, not a
    pass over every message's fields.
    """
    stacked = LazyStackedTensorDict._new_lazy_unsafe(*messages, stack_dim=0)
    return History._from_tensordict(stacked)


def as_dicts(history: Any) -> list[dict[str, str]]:
    """The ``{"role", "content"}`` dicts of a one-conversation ``History`` (as chat templates take them)."""
    roles = history.role
    contents = history.content
    if isinstance(roles, str):
        return [{"role": roles, "content": contents}]
    return [{"role": role, "content": content} for role, content in zip(roles, contents, strict=True)]
