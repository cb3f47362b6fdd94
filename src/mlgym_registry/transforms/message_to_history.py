"""Stage 7, message to history: the conversation grows by the assistant turn and the new user message.

Only ``history`` is written (the reference also declared a ``chat`` key it never wrote: reference bug #1). The new
history shares the previous one's messages, so a step costs the same at turn 10 as at turn 200.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from .base import ASSISTANT_KEY, ChainTransform
from .history import extend_history, message
from .layout import set_entry


class MessageToHistory(ChainTransform):
    """Appends ``message`` as a user turn (after the assistant turn on a step) to ``history``."""

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        history = tensordict_reset.get(self.layout.history)
        user = message("user", str(tensordict_reset[self.layout.message]), self.base.device)
        set_entry(tensordict_reset, self.layout.history, extend_history(history, [user]))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        device = self.base.device
        history = tensordict.get(self.layout.history)
        assistant = tensordict.get(ASSISTANT_KEY, None)
        if assistant is None:
            raise KeyError("the chat template stage did not extract the assistant turn from the response")
        assistant = assistant if isinstance(assistant, str) else str(getattr(assistant, "data", assistant))
        user = str(next_tensordict[self.layout.message])
        new = [message("assistant", assistant, device), message("user", user, device)]
        set_entry(next_tensordict, self.layout.history, extend_history(history, new))
        return next_tensordict
