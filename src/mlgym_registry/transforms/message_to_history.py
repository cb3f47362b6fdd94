"""Stage 7, message to history: the conversation grows by the assistant turn and the new user message.

Only ``history`` is written (the reference also declared a ``chat`` key it never wrote: reference bug #1). The new
history shares the previous one's messages, so a step costs the same at turn 10 as at turn 200.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from ..components.tool_calling import follow_up_roles
from .base import ASSISTANT_KEY, ChainTransform, text_of
from .history import extend_history, message
from .layout import set_entry


class MessageToHistory(ChainTransform):
    """Appends ``message`` as a user turn (after the assistant turn on a step) to the whole conversation (``history``,
    or ``conversation`` when a history processor shapes ``history``)."""

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        key = self.layout.stored_history
        history = tensordict_reset.get(key)
        user = message("user", str(tensordict_reset[self.layout.message]), self.base.device)
        set_entry(tensordict_reset, key, extend_history(history, [user]))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        device = self.base.device
        key = self.layout.stored_history
        history = tensordict.get(key, None)
        if history is None:
            raise KeyError(f"the step input has no conversation at {key!r}: step from the tensordict the env returned "
                           "(its reset, or the 'next' of its last step)")
        assistant = tensordict.get(ASSISTANT_KEY, None)
        if assistant is None:
            raise KeyError("the chat template stage did not extract the assistant turn from the response")
        assistant = text_of(assistant)
        user = str(next_tensordict[self.layout.message])
        # a parser that calls tools natively has each of the turn's calls answered by a ``tool`` message
        roles = follow_up_roles(self.base.task.parser, assistant)
        new = [message("assistant", assistant, device)] + [message(role, user, device) for role in roles]
        set_entry(next_tensordict, key, extend_history(history, new))
        return next_tensordict
