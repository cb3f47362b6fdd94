"""Stage 7b, history view: what of the conversation the policy sees, through the task's history processor.

Only in a chain whose tasks use a history processor other than ``full``. The whole conversation stays at
``conversation``; this stage writes ``history`` (the policy's ``("history", "prompt")`` in the default layout), from
which the chat template renders the prompt text and tokens. It hands the processor the conversation as
``{"role", "content"}`` dicts kept from step to step, so only the new turns are converted, and it reuses the message
of every dict the processor kept as it was: a step costs the same at turn 10 as at turn 200 (the processor's own
cost aside).
"""

from __future__ import annotations

from typing import Any

from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase
from torchrl.data import Composite

from ..components import output_checks
from .base import ChainTransform
from .history import MessageStack, history_from, history_spec, message
from .layout import set_entry, set_spec

_MADE_LIMIT = 20_000
"""Messages the processor made (notes, shortened turns) remembered per episode before the memory is cleared."""


def _message_tds(history: Any) -> list[TensorDict]:
    """The message tensordicts of a one-conversation ``History`` (shared when it is a lazy stack)."""
    stack = history._tensordict
    if isinstance(stack, LazyStackedTensorDict) and stack.stack_dim == 0:
        return stack.tensordicts
    return list(stack.unbind(0))


class HistoryView(ChainTransform):
    """Writes ``history`` = the task's history processor applied to ``conversation``."""

    def __init__(self, layout: Any):
        if layout.conversation is None:
            raise ValueError("HistoryView needs a layout that keeps the conversation apart: layout.with_conversation()")
        super().__init__(layout)
        self._forget()

    def _forget(self) -> None:
        self._tds: list[TensorDict] = []
        """The conversation's messages seen last, in order."""
        self._dicts: list[dict[str, str]] = []
        """The same messages as dicts, for the processor."""
        self._td_of: dict[int, TensorDict] = {}
        """``id(dict)`` -> message, for the dicts in ``_dicts`` (alive while they are there, so ids are unique)."""
        self._made: dict[tuple[str, str], TensorDict] = {}
        """Messages built for dicts the processor made, by role and content."""

    def _dicts_of(self, conversation: Any) -> list[dict[str, str]]:
        tds = _message_tds(conversation)
        known = self._tds
        if not (known and len(tds) >= len(known) and tds[len(known) - 1] is known[-1]):
            self._tds, self._dicts, self._td_of = [], [], {}
            known = self._tds
        for td in tds[len(known):]:
            item = {"role": td["role"], "content": td["content"]}
            self._tds.append(td)
            self._dicts.append(item)
            self._td_of[id(item)] = td
        return self._dicts

    def _td_for(self, item: dict[str, str]) -> TensorDict:
        td = self._td_of.get(id(item))
        if td is not None:
            return td
        key = (item["role"], item["content"])
        td = self._made.get(key)
        if td is None:
            if len(self._made) > _MADE_LIMIT:
                self._made.clear()
            td = self._made[key] = message(item["role"], item["content"], self.base.device)
        return td

    def _view(self, tensordict: TensorDictBase) -> TensorDictBase:
        conversation = tensordict.get(self.layout.conversation)
        dicts = self._dicts_of(conversation)
        shown = output_checks.call_history(self.base.task, list(dicts))  # its exceptions named (output_checks)
        if output_checks.ENABLED:
            output_checks.check_history_output(shown, self.base.task)
        if len(shown) == len(dicts) and all(a is b for a, b in zip(shown, dicts, strict=True)):
            view = conversation
        else:
            tds = [self._td_for(item) for item in shown]
            stack = conversation._tensordict
            if isinstance(stack, MessageStack):
                view = type(conversation)._from_tensordict(stack.shared_with(tds))
            else:
                view = history_from(tds)
        set_entry(tensordict, self.layout.history, view)
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        self._forget()
        return self._view(tensordict_reset)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._view(next_tensordict)

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        set_spec(observation_spec, self.layout.history, history_spec(observation_spec.device))
        return observation_spec
