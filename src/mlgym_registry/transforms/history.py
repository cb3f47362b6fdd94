"""The conversation as a TorchRL ``History``, grown one turn at a time without re-reading what came before."""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase
from torchrl.data import Composite, NonTensor

try:  # tensordict >= 0.15 keeps History (TorchRL re-exports it from there); the package's one import of it
    from tensordict.llm import History
except ImportError:  # tensordict <= 0.14: TorchRL's own
    from torchrl.data.llm import History

HISTORY_FIELDS = ("role", "content", "is_complete")
"""The fields a ``History`` actually stores. ``History.default_spec()`` also declares ``tool_calls`` and
``tool_responses``, which are never stored, so ``check_env_specs`` fails on it (reference bug #4)."""


def history_spec(device: torch.device | None = None) -> Composite:
    """The spec of a one-conversation ``History`` of any length: only the fields that are stored."""
    examples = {"role": "user", "content": "a message", "is_complete": True}
    return Composite(
        {key: NonTensor(example_data=examples[key], shape=(-1,), device=device) for key in HISTORY_FIELDS},
        shape=(-1,),
        data_cls=History,
        device=device,
        # step_mdp moves the History as one object instead of field by field (which would cost a pass per message)
        step_mdp_static=True,
    )


def message(role: str, content: str, device: torch.device | None = None) -> TensorDict:
    """One chat message as the tensordict a ``History`` element holds."""
    history = History(role=role, content=content, batch_size=(), device=device)
    return history._tensordict


_CLONES = threading.local()
"""``share_messages``: set while ``messages_shared_in_clones`` is in force on this thread."""


@contextlib.contextmanager
def messages_shared_in_clones() -> Iterator[None]:
    """Within the block (on this thread), a deep ``clone()`` of a conversation shares its messages, as a shallow one
    does: for a clone whose only purpose is to own its tensors (a pool's copy of what came off its queue), where
    copying each message would cost a pass over the conversation every turn."""
    before = getattr(_CLONES, "share_messages", False)
    _CLONES.share_messages = True
    try:
        yield
    finally:
        _CLONES.share_messages = before


class MessageStack(LazyStackedTensorDict):
    """The messages of a conversation, stacked lazily; a shallow clone shares the (never modified) messages.

    TorchRL shallow-clones every tensordict several times per step (``step``, ``step_mdp``), and a plain lazy stack
    clones each message's fields and intersects every message's keys each time, so a step would cost more the longer
    the conversation. Messages are written once and never changed in place, so sharing them is safe; the common
    keys are kept as the stack grows. A shallow clone or a one-turn-longer stack costs one list copy.
    """

    _message_keys: tuple[str, ...] | None = None

    def _key_list(self) -> list[str]:
        if self._message_keys is not None:
            return list(self._message_keys)
        return super()._key_list()

    def _clone(self, recurse: bool = True) -> MessageStack:
        if recurse and not getattr(_CLONES, "share_messages", False):
            return super()._clone(recurse=True)
        return self._share(list(self.tensordicts), self._message_keys)

    def _apply_nest(self, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        # an in-place apply on a tensordict holding a History (``consolidate(inplace=True)``, which TorchRL's
        # ParallelEnv workers run on every step by default) hands the History itself as ``out``; the lazy stack
        # wants its own tensordict there
        if out is not None and not isinstance(out, LazyStackedTensorDict):
            out = getattr(out, "_tensordict", out)
        return super()._apply_nest(*args, out=out, **kwargs)

    def extended(self, messages: list[TensorDict]) -> MessageStack:
        """A new stack: these messages followed by ``messages`` (shared, not copied)."""
        keys = set(self._key_list())
        for item in messages:
            keys.intersection_update(item.keys())
        return self._share(self.tensordicts + list(messages), tuple(sorted(keys)))

    def shared_with(self, messages: list[TensorDict]) -> MessageStack:
        """A new stack of ``messages`` (shared, not copied) holding the same keys as this one's messages, such as a
        history processor's view that keeps some of them and replaces others by messages built the same way."""
        return self._share(list(messages), self._message_keys)

    def _unbind(self, dim: int) -> tuple[TensorDictBase, ...]:
        # TorchRL's pools view their batch of envs as one dim (AsyncEnvPool's ``view(-1)`` at every send), which
        # unbinds each conversation along a batch dim, message by message: each message's parts are made once and
        # kept with it (messages are never changed), so a turn costs a list, not a rebuilt conversation
        dim = dim + self.batch_dims if dim < 0 else dim
        if dim == self.stack_dim:
            return super()._unbind(dim)
        inner = dim if dim < self.stack_dim else dim - 1
        parts = [_unbound(message, inner) for message in self.tensordicts]
        stack_dim = self.stack_dim - 1 if dim < self.stack_dim else self.stack_dim
        batch_size = torch.Size([size for index, size in enumerate(self._batch_size) if index != dim])
        return tuple(self._share([part[index] for part in parts], self._message_keys, stack_dim, batch_size)
                     for index in range(self._batch_size[dim]))

    def _share(self, messages: list[TensorDict], keys: tuple[str, ...] | None, stack_dim: int | None = None,
               batch_size: torch.Size | None = None) -> MessageStack:
        new = type(self).__new__(type(self))
        new._is_locked = None
        new.tensordicts = messages
        new.stack_dim = dim = self.stack_dim if stack_dim is None else stack_dim
        new._batch_size = batch_size if batch_size is not None else torch.Size(
            [*self._batch_size[:dim], len(messages), *self._batch_size[dim + 1:]])
        new.hook_out = self.hook_out
        new.hook_in = self.hook_in
        new._message_keys = keys
        if self._td_dim_name is not None:
            new._td_dim_name = self._td_dim_name
        return new


def _unbound(message: TensorDictBase, dim: int) -> tuple[TensorDictBase, ...]:
    """``message.unbind(dim)``, made once per message and dim and kept with the message."""
    kept = message.__dict__.setdefault("_mlgym_unbound", {})
    parts = kept.get(dim)
    if parts is None:
        parts = kept[dim] = message.unbind(dim)
    return parts


def history_from(messages: list[TensorDict], stack_dim: int = 0) -> History:
    """A ``History`` over already-built message tensordicts (shared, not copied), stacked along ``stack_dim``: shape
    ``(len(messages),)`` for scalar messages, ``(1, len(messages))`` for messages of shape ``(1,)`` stacked on 1."""
    stacked = MessageStack._new_lazy_unsafe(*messages, stack_dim=stack_dim)
    stacked._message_keys = tuple(LazyStackedTensorDict._key_list(stacked))
    return History._from_tensordict(stacked)


def extend_history(history: History, messages: list[TensorDict]) -> History:
    """``history`` followed by ``messages``; costs the same however long ``history`` is when it was built here."""
    stacked = history._tensordict
    dim = history.ndim - 1
    if isinstance(stacked, MessageStack) and stacked.stack_dim == dim:
        return History._from_tensordict(stacked.extended(messages))
    if isinstance(stacked, LazyStackedTensorDict) and stacked.stack_dim == dim:
        return history_from(list(stacked.tensordicts) + list(messages), dim)
    return history_from(list(stacked.unbind(dim)) + list(messages), dim)


def common_prefix(a: list[Any], b: list[Any]) -> int:
    """How many leading items the lists ``a`` and ``b`` share (the same objects, not equal ones)."""
    count = min(len(a), len(b))
    if all(map(operator.is_, a, b)):  # the usual case, at C speed (map stops at the shorter list: no slice copied)
        return count
    for index in range(count):
        if a[index] is not b[index]:
            return index
    return count


def _single(value: Any) -> str:
    """The one string of a message's field (a ``str``, or TorchRL's non-tensor containers around one)."""
    while not isinstance(value, str):
        if isinstance(value, list | tuple):
            value = value[0]
        elif hasattr(value, "tolist"):
            value = value.tolist()
        else:
            value = value.data
    return value


def _as_dict(message: TensorDictBase) -> dict[str, str]:
    """A message's ``{"role", "content"}`` (a new dict): read once per message and kept with it, since messages are
    never changed and a policy reads the whole conversation every turn."""
    kept = message.__dict__.get("_mlgym_dict")
    if kept is None:
        kept = message.__dict__["_mlgym_dict"] = {"role": _single(message.get("role")),
                                                  "content": _single(message.get("content"))}
    return dict(kept)


def message_count(history: Any) -> int:
    """How many messages a one-conversation ``History`` holds (its last dim), read without touching them."""
    return int(history.batch_size[-1]) if getattr(history, "ndim", 0) else 1


def as_dicts(history: Any, start: int = 0) -> list[dict[str, str]]:
    """The ``{"role", "content"}`` dicts of a one-conversation ``History`` (as chat templates take them), from its
    ``start``-th message on (at a cost in the messages read, not in the conversation's length); a batched one of a
    single conversation (shape ``(1, n)``, as the env gives it) counts as one."""
    if getattr(history, "ndim", 1) > 1 and history.batch_size[:-1].numel() != 1:
        raise ValueError(f"a History of shape {tuple(history.batch_size)} holds several conversations, not one")
    stack = getattr(history, "_tensordict", None)
    if isinstance(stack, LazyStackedTensorDict) and stack.stack_dim == stack.ndim - 1:
        # the chain's own History: its messages one by one, without indexing the stack (which reads every message)
        return [_as_dict(message) for message in stack.tensordicts[start:]]
    if getattr(history, "ndim", 1) > 1:
        history = history[(0,) * (history.ndim - 1)]
    if start:
        if start >= history.batch_size[-1]:
            return []
        history = history[start:]
    roles = history.role
    contents = history.content
    if isinstance(roles, str):
        return [{"role": roles, "content": contents}]
    return [{"role": role, "content": content} for role, content in zip(roles, contents, strict=True)]
