"""Key layouts: where each stage of the chain reads and writes in the tensordict.

``default`` speaks TorchRL's LLM conventions (``("history", "prompt")``, ``("text", "prompt")``,
``("text", "response")``) so TorchRL's policy wrappers plug in directly; ``seed`` gives the flat keys of TorchRL's
reference MLGym chain (``history``, ``text``, ``text_response``, ...). ``query`` (the GRPO group key), the
``tokens`` entries and the reward's shape exist in the default layout only, as in TorchRL's ``ChatEnv``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tensordict import NestedKey, TensorDict

CONVERSATION_KEY = "conversation"
"""Where the chain keeps the whole conversation when a history processor shapes the policy's ``history``."""


@dataclass(frozen=True)
class Layout:
    """The tensordict keys of one layout. ``action`` is where the isolated action goes (the backend's input)."""

    name: str
    history: NestedKey
    prompt: NestedKey
    response: NestedKey
    action: NestedKey
    message: NestedKey = "message"
    state: NestedKey = "state"
    retry: NestedKey = "retry"
    observation: NestedKey = "observation"
    task: NestedKey = "task"
    reward: NestedKey = "reward"
    query: NestedKey | None = None
    tokens_prompt: NestedKey | None = None
    tokens_response: NestedKey | None = None
    attention_mask: NestedKey | None = None
    reward_shape: tuple[int, ...] = (1,)
    turn: NestedKey = "turn"
    """Where each step's facts go, as the chain's action isolator found them (a ``TurnFacts``: ``thought``, ``action``
    as the model gave it, ``format_error``)."""
    conversation: NestedKey | None = None
    """Where the whole conversation is kept when a history processor shapes ``history`` (see ``with_conversation``);
    None when ``history`` is the whole conversation itself."""

    @property
    def stored_history(self) -> NestedKey:
        """The key of the whole conversation: ``conversation`` with a history processor, else ``history``."""
        return self.history if self.conversation is None else self.conversation

    def with_conversation(self, key: NestedKey = CONVERSATION_KEY) -> Layout:
        """This layout, with the whole conversation kept at ``key`` and ``history`` holding what the policy sees."""
        return replace(self, conversation=key)


LAYOUTS: dict[str, Layout] = {
    "default": Layout(
        name="default",
        history=("history", "prompt"),
        prompt=("text", "prompt"),
        response=("text", "response"),
        action="action",
        query="query",
        tokens_prompt=("tokens", "prompt"),
        tokens_response=("tokens", "response"),
        attention_mask=("masks", "all_attention_mask"),
        # TorchRL's LLM reward transforms write rewards of shape batch + (1, 1)
        reward_shape=(1, 1),
    ),
    "seed": Layout(
        name="seed",
        history="history",
        prompt="text",
        response="text_response",
        action="text_response",
    ),
}


def get_layout(layout: str | Layout) -> Layout:
    """The ``Layout`` named ``layout`` (or ``layout`` itself)."""
    if isinstance(layout, Layout):
        return layout
    try:
        return LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(sorted(LAYOUTS))}") from None


def _container_class(name: str) -> type | None:
    """TorchRL's container class for a top-level LLM key (``history`` -> ``ChatHistory``, ...)."""
    from torchrl.modules.llm.policies.common import ChatHistory, Masks, Text, Tokens

    return {"history": ChatHistory, "text": Text, "tokens": Tokens, "masks": Masks}.get(name)


def set_entry(tensordict: Any, key: NestedKey, value: Any) -> None:
    """``tensordict.set(key, value)``; a missing ``("history", ...)``/``("text", ...)`` container is made as TorchRL's
    ``ChatHistory``/``Text``, as its LLM envs and policy wrappers make them."""
    if isinstance(key, tuple) and len(key) == 2 and key[0] not in tensordict.keys():
        cls = _container_class(key[0])
        if cls is not None:
            container = cls._from_tensordict(TensorDict(batch_size=tensordict.batch_size, device=tensordict.device))
            tensordict.set(key[0], container)
    tensordict.set(key, value)


def set_spec(spec: Any, key: NestedKey, leaf: Any) -> None:
    """``spec[key] = leaf``; a missing ``history``/``text`` container is declared with TorchRL's class, static under
    ``step_mdp`` (moved as a whole, as ``ChatEnv`` declares them)."""
    from torchrl.data import Composite

    if isinstance(key, tuple) and len(key) == 2 and key[0] not in spec.keys():
        cls = _container_class(key[0])
        if cls is not None:
            spec[key[0]] = Composite(shape=spec.shape, device=spec.device, data_cls=cls, step_mdp_static=True)
    spec[key] = leaf
