"""The last stage: the chain's one-episode tensordicts get TorchRL ``ChatEnv``'s batch shape, ``(1,)`` by default.

Every stage below works on one episode with batch size ``()``. This stage gives its outputs the env's batch shape
(any shape with one element: ``(1,)``, ``(1, 1)``, ...) and turns a step's input back into one episode's values, so
TorchRL's LLM wrappers, collectors and losses see the shapes they expect (a ``History`` of shape ``(1, n)``, rewards
of shape ``batch + (1, 1)``, done flags of shape ``batch + (1,)``).

The conversation is never converted as a whole: each message gets its batched twin once, the batched ``History``
grows by sharing them, and a step's input ``History`` that is the one this stage wrote maps back to the episode's
own ``History`` in constant time. A step from any other tensordict (an older one, one built by hand) is converted
message by message.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase
from torchrl.data import Composite

from .base import ChainTransform
from .history import History, MessageStack, common_prefix, extend_history, history_from
from .layout import Layout, set_entry


def _scalar(value: Any, index: tuple[int, ...]) -> Any:
    """One episode's value out of a batched entry (a string, a tensor, a ``History``, ...)."""
    if isinstance(value, NonTensorData):
        return value.data
    if isinstance(value, NonTensorStack):
        items = value.tolist()
        while isinstance(items, list) and len(items) == 1:
            items = items[0]
        return items
    if isinstance(value, (str, bytes)) or value is None:
        return value
    return value[index]


def _messages_of(history: History | None) -> list[TensorDict] | None:
    """The message tensordicts a lazily stacked ``History`` shares (None for anything else)."""
    return None if history is None else getattr(history._tensordict, "tensordicts", None)


class ChatBatch(ChainTransform):
    """Gives the chain's outputs ``batch_size`` (one element) and its step inputs back the chain's own shape."""

    fork_caches = ("_batched_last",)
    """What a fork's child starts empty rather than copied (``transforms/forking.py``): a cache of the last batched
    conversation, rebuilt from the tensordict the child is stepped with."""

    def __init__(self, layout: Layout, batch_size: Any = (1,)):
        """``batch_size``: a shape of one element, at least one dim (``transforms.chain`` checks the option)."""
        super().__init__(layout)
        self.batch_size = torch.Size([batch_size] if isinstance(batch_size, int) else batch_size)
        self.index = (0,) * len(self.batch_size)
        self._batched_last: dict[Any, tuple[History, History]] = {}
        """For each ``History`` key: the episode's ``History`` this stage batched last, and its batched twin."""

    # -- shapes --------------------------------------------------------------------------------------------------
    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        return self.batch_size

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        return output_spec.expand(self.batch_size)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        return input_spec.expand(self.batch_size)

    # -- outputs: one episode -> batched -------------------------------------------------------------------------
    def _batched_message(self, message: TensorDict) -> TensorDict:
        for _ in self.batch_size:  # unsqueeze costs half of expand, and the batch dims are all 1
            message = message.unsqueeze(0)
        return message

    def _batched_history(self, key: Any, history: History) -> History:
        """``history`` with the batch dims in front, sharing the batched twin of every message seen before at ``key``
        (a history processor's view may change earlier messages: the twins are shared up to the first change)."""
        stack = history._tensordict
        messages = stack.tensordicts if isinstance(stack, MessageStack) else list(stack.unbind(0))
        last = self._batched_last.get(key)
        known, twins = (_messages_of(last[0]), _messages_of(last[1])) if last is not None else (None, None)
        kept = common_prefix(messages, known) if known and twins else 0
        if kept == len(known or ()) and kept:
            fresh = [self._batched_message(message) for message in messages[kept:]]
            batched = extend_history(last[1], fresh) if fresh else last[1]
        elif kept and isinstance(last[1]._tensordict, MessageStack):
            fresh = [self._batched_message(message) for message in messages[kept:]]
            batched = History._from_tensordict(last[1]._tensordict.shared_with(twins[:kept] + fresh))
        else:  # another conversation than the one batched last: start over
            batched = history_from([self._batched_message(m) for m in messages], stack_dim=len(self.batch_size))
        self._batched_last[key] = (history, batched)
        return batched

    def _batched(self, source: TensorDictBase) -> TensorDictBase:
        out = TensorDict(batch_size=self.batch_size, device=source.device)
        self._copy_batched(source, out, ())
        return out

    def _copy_batched(self, source: TensorDictBase, out: TensorDictBase, prefix: tuple[str, ...]) -> None:
        for key in source.keys():
            value = source.get(key)
            target = (*prefix, key)
            if isinstance(value, History):
                value = self._batched_history(target, value)
            elif isinstance(value, NonTensorData):
                value = value.data
            elif isinstance(value, torch.Tensor):
                value = value.expand(*self.batch_size, *value.shape)
            elif isinstance(value, TensorDictBase) or hasattr(value, "_tensordict"):
                self._copy_batched(value if isinstance(value, TensorDictBase) else value._tensordict, out, target)
                continue
            set_entry(out, target if len(target) > 1 else key, value)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        self._batched_last = {}
        return self._batched(tensordict_reset)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._batched(next_tensordict)

    # -- inputs: batched -> one episode --------------------------------------------------------------------------
    def _reset_env_preprocess(self, tensordict: TensorDictBase | None) -> TensorDictBase | None:
        # a collector's reset input (``_reset`` flags of the batch shape) means nothing to one episode
        return None

    def _episode_history(self, key: Any, history: Any) -> History:
        last = self._batched_last.get(key if isinstance(key, tuple) else (key,))
        messages, ours = _messages_of(history), _messages_of(last[1]) if last is not None else None
        if messages and ours and len(messages) == len(ours) and messages[-1] is ours[-1]:
            return last[0]
        return History._from_tensordict(history._tensordict[self.index])

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        # (TorchRL's EnvBase.step has already refused a tensordict of another batch size)
        episode = TensorDict(batch_size=(), device=tensordict.device)
        for key in self._carried_keys():
            value = tensordict.get(key, None)
            if value is None:
                continue
            if key in (self.layout.history, self.layout.conversation):
                value = self._episode_history(key, value)
            else:
                value = _scalar(value, self.index)
            if value is not None:
                set_entry(episode, key, value)
        return episode

    def _carried_keys(self) -> list[Any]:
        """What the stages below read from a step's input: the observation they wrote, and the policy's output."""
        layout = self.layout
        keys = [layout.history, layout.prompt, layout.state, layout.retry, layout.task, layout.response]
        if layout.conversation is not None:
            keys.append(layout.conversation)
        if layout.tokens_response is not None:
            keys.append(layout.tokens_response)
        return keys
