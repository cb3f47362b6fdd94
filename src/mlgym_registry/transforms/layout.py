"""Key layouts: where each stage of the chain reads and writes in the tensordict.

``default`` speaks TorchRL's LLM conventions (``("history", "prompt")``, ``("text", "prompt")``,
``("text", "response")``) so TorchRL's policy wrappers plug in directly; ``seed`` gives the flat keys of TorchRL's
reference MLGym chain (``history``, ``text``, ``text_response``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import NestedKey


@dataclass(frozen=True)
class Layout:
    """The tensordict keys of one layout."""

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

    @property
    def llm_containers(self) -> bool:
        """True when prompt/history live in TorchRL's ``Text``/``ChatHistory`` containers."""
        return isinstance(self.prompt, tuple)


LAYOUTS: dict[str, Layout] = {
    "default": Layout(
        name="default",
        history=("history", "prompt"),
        prompt=("text", "prompt"),
        response=("text", "response"),
        action="action",
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
