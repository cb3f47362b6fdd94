"""Stage 8, chat template: ``history`` -> the prompt text; inverse: the generated response -> the assistant turn.

The prompt is grown from the previous one by rendering only the new turns (reference bug #10: re-rendering and
re-parsing the whole transcript made each step cost more the longer the episode). The inverse takes the assistant
turn's content from the response text alone, cut at the template's end-of-turn marker, without parsing the prompt.
``chat_template_name`` resolves in ``torchrl.data.llm.history`` (reference bug #5: a module path that does not exist).
"""

from __future__ import annotations

from typing import Any

from tensordict import LazyStackedTensorDict, TensorDictBase
from torchrl.data import Composite, NonTensor

from ..errors import PolicyOutputError
from .base import ASSISTANT_KEY, ChainTransform, missing_response, text_of
from .history import as_dicts, common_prefix
from .layout import Layout, set_entry, set_spec
from .rendering import ChatRenderer, IncrementalPrompt


def _shared_messages(history: Any) -> list[Any] | None:
    """The message tensordicts a lazily stacked one-conversation ``History`` shares, else None."""
    td = history._tensordict
    if isinstance(td, LazyStackedTensorDict) and td.stack_dim == 0:
        return td.tensordicts
    return None


class ChatTemplate(ChainTransform):
    """Writes the prompt text; in the inverse pass, the assistant turn's content."""

    def __init__(self, layout: Layout, tokenizer: Any = None, chat_template_name: str | None = None,
                 tools: list[dict[str, Any]] | None = None):
        super().__init__(layout, in_keys_inv=[layout.response], out_keys_inv=[ASSISTANT_KEY])
        self.renderer = ChatRenderer(tokenizer, chat_template_name, tools)
        self.prompt = IncrementalPrompt(self.renderer)
        self._rendered: list[Any] = []
        """The message tensordicts the prompt was rendered from last (a history processor may change earlier ones
        from one step to the next; the prompt is rendered again from the first that changed)."""
        self._dicts: dict[int, tuple[Any, dict[str, str]]] = {}
        """``id(message)`` -> (message, its dict), this episode: reading a message's fields costs more than a render."""

    def _dict(self, message: Any) -> dict[str, str]:
        known = self._dicts.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        item = {"role": message["role"], "content": message["content"]}
        self._dicts[id(message)] = (message, item)
        return item

    @property
    def tokenizer(self) -> Any:
        """The tokenizer, if any."""
        return self.renderer.tokenizer

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        history = tensordict_reset.get(self.layout.history)
        set_entry(tensordict_reset, self.layout.prompt, self.prompt.start(as_dicts(history)))
        self._rendered = list(_shared_messages(history) or ())
        self._dicts = {}
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        history = next_tensordict.get(self.layout.history)
        previous = tensordict.get(self.layout.prompt, None)
        previous = previous if previous is None or isinstance(previous, str) else str(previous.data)
        messages = _shared_messages(history)
        prompt = self.prompt
        if messages is not None and previous is not None and (previous is prompt.prompt or previous == prompt.prompt):
            prompt.unchanged = len(prompt.base)
            same = common_prefix(messages, self._rendered)
            kept = prompt.rewind(same) if same < len(prompt.messages) else same
            if kept == 0:
                text = prompt.start([self._dict(m) for m in messages])
            elif kept < len(messages):
                # a processor that changed message ``same`` this turn (one that hides old turns) is likely to change
                # the one a turn later next time: mark that point too, so the next turn re-renders from there
                split = same + 2 - kept if same < len(self._rendered) else None
                text = prompt.extend([self._dict(m) for m in messages[kept:]], split)
            else:
                text = prompt.prompt
        else:  # not the conversation we rendered last (e.g. a step from an older tensordict): render it all
            text = prompt.start(as_dicts(history))
        self._rendered = list(messages or ())
        set_entry(next_tensordict, self.layout.prompt, text)
        return next_tensordict

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        response = tensordict.get(self.layout.response, None)
        if response is None:
            raise missing_response(self.layout)
        if not isinstance(response, str) and not isinstance(getattr(response, "data", None), str):
            raise PolicyOutputError(
                f"{self.layout.response!r} holds a {type(response).__name__}, but the env reads the response text "
                "there (one string per env); token ids go to ('tokens', 'response') with input_mode='tokens'"
            )
        response = text_of(response)
        tensordict.set(ASSISTANT_KEY, self.renderer.assistant_content(response))
        return tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        set_spec(observation_spec, self.layout.prompt, NonTensor(example_data="<a prompt>", shape=(),
                                                                 device=observation_spec.device))
        return observation_spec
