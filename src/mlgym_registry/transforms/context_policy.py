"""The context policy: token budgets per turn and per episode, and what a turn that breaks one becomes.

Two outcomes, each a flag of shape ``(1,)`` beside ``done`` on every step (``("next", "length")``,
``("next", "overflow")``):

- ``"length"``: the reply was cut by the policy's ``max_new_tokens``: its token ids (``("tokens", "response")``, which
  TorchRL's wrappers write in every input mode) do not end with an end-of-sequence or end-of-turn token and, when
  ``max_turn_tokens`` is given, number at least that many. A reply given as text only cannot be judged.
- ``"overflow"``: the episode goes on, but its next turn would not fit a whole reply: the next prompt's tokens plus
  ``max_turn_tokens`` (1 without it) exceed ``context_window``, or the tokens the policy generated this episode plus
  that exceed ``max_episode_tokens``.

What each does is set by ``on_length=`` and ``on_overflow=``: ``"record"`` (nothing more), ``"mask"``
(``("next", "masked")`` is True: leave the turn out of the loss), ``"end"`` (the episode ends there, truncated), a
number (a reward added to the step), or a tuple of those. The defaults are what a trainer expects: a cut reply is
recorded and nothing more, an overflow ends the episode as truncated. Flags, not a string: a string entry costs ten
times a tensor's on every step of every env.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import Categorical, Composite

from .base import ChainTransform, text_of
from .layout import Layout

OUTCOMES = ("length", "overflow")
"""The outcomes, each the key of its flag: ``"length"`` (a reply cut), ``"overflow"`` (no room for the next turn)."""
MASKED_KEY = "masked"
"""True (shape ``(1,)``, beside ``done``) on a step whose outcome is configured ``"mask"``: leave it out of the loss."""


_NO = torch.zeros(1, dtype=torch.bool)


def outcome_of(tensordict: TensorDictBase) -> str:
    """The outcomes flagged in a step's output, joined by ``+`` (``"length+overflow"``), ``""`` for none."""
    flags = [name for name in OUTCOMES if bool(tensordict.get(name, _NO).any())]
    return "+".join(flags)

DEFAULT_ON_LENGTH = "record"
DEFAULT_ON_OVERFLOW = "end"


@dataclass(frozen=True)
class OutcomeRule:
    """What an outcome does to its step: ``mask`` it, ``end`` the episode, add ``penalty`` to the reward."""

    mask: bool = False
    end: bool = False
    penalty: float = 0.0

    @classmethod
    def of(cls, value: Any) -> OutcomeRule:
        """The rule an ``on_length=``/``on_overflow=`` value says (``chain.is_outcome_action`` checked it)."""
        items = value if isinstance(value, (tuple, list)) else (value,)
        words = {item for item in items if isinstance(item, str)}
        penalty = sum(float(item) for item in items if not isinstance(item, str))
        return cls(mask="mask" in words, end="end" in words, penalty=penalty)


class ContextPolicy(ChainTransform):
    """Writes ``outcome`` and ``masked`` on every step; on ``length``/``overflow`` applies its rule (penalty, end)."""

    def __init__(self, layout: Layout, tokenizer: Any = None, *, end_of_turn: str = "",
                 max_turn_tokens: int | None = None, max_episode_tokens: int | None = None,
                 context_window: int | None = None, on_length: Any = DEFAULT_ON_LENGTH,
                 on_overflow: Any = DEFAULT_ON_OVERFLOW, prompt_tokens: bool = False):
        """``end_of_turn``: the chat template's end-of-turn text (its token ends a reply too); ``prompt_tokens``:
        read the prompt's length from ``("tokens", "prompt")`` (tokens mode) instead of counting its text."""
        if (context_window is not None or max_episode_tokens is not None) and tokenizer is None:
            raise ValueError(
                "context_window= and max_episode_tokens= count tokens: give registry.make a tokenizer= too"
            )
        super().__init__(layout)
        self.tokenizer = tokenizer
        self.max_turn_tokens = max_turn_tokens
        self.max_episode_tokens = max_episode_tokens
        self.context_window = context_window
        self.rules = {"length": OutcomeRule.of(on_length), "overflow": OutcomeRule.of(on_overflow)}
        self.prompt_tokens = prompt_tokens
        self.end_ids = self._end_ids(tokenizer, end_of_turn)
        self.pad_id = getattr(tokenizer, "pad_token_id", None)
        self.budgeted = context_window is not None or max_episode_tokens is not None
        self.episode_tokens = 0
        """Tokens the policy generated this episode (its replies', as far as they came as tokens or text)."""
        self.prompt_length = 0
        """The last prompt's length in tokens (counted only with ``context_window``)."""
        self._prompt_text = ""
        self._cut = False
        self._reply = 0

    @staticmethod
    def _end_ids(tokenizer: Any, end_of_turn: str) -> frozenset[int]:
        """The ids that end a reply: the tokenizer's end-of-sequence token and the template's end-of-turn token."""
        if tokenizer is None:
            return frozenset()
        ids = {getattr(tokenizer, "eos_token_id", None)}
        if end_of_turn:
            encoded = tokenizer(end_of_turn, add_special_tokens=False)["input_ids"]
            if len(encoded) == 1:
                ids.add(encoded[0])
        return frozenset(i for i in ids if isinstance(i, int))

    def _count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0

    # -- a reply: its length and whether it was cut (inverse pass, before anything parses it) --------------------
    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._cut, self._reply = False, 0
        tokens = tensordict.get(self.layout.tokens_response, None) if self.layout.tokens_response else None
        if isinstance(tokens, torch.Tensor) and tokens.ndim == 1 and not tokens.is_floating_point():
            ids = tokens.tolist()
            while ids and self.pad_id is not None and ids[-1] == self.pad_id and self.pad_id not in self.end_ids:
                ids.pop()  # padding a batched policy put after a short reply
            self._reply = len(ids)
            budget = self.max_turn_tokens
            self._cut = bool(ids) and ids[-1] not in self.end_ids and (budget is None or len(ids) >= budget)
        elif self.max_episode_tokens is not None:
            self._reply = self._count(text_of(tensordict.get(self.layout.response, None)))
        return tensordict

    # -- the step: outcomes and their rules ----------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        self.episode_tokens, self.prompt_length, self._prompt_text = 0, 0, ""
        self._write(tensordict_reset, (), False)
        if self.context_window is not None:
            self._measure(tensordict_reset)
            if self.prompt_length + (self.max_turn_tokens or 1) > self.context_window:
                warnings.warn(
                    f"the first prompt of task {self.base.task_name!r} is {self.prompt_length} tokens: with "
                    f"max_turn_tokens={self.max_turn_tokens} it does not fit context_window={self.context_window}; "
                    "the first step will overflow (a shorter template, or a larger window)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return tensordict_reset

    def _measure(self, tensordict: TensorDictBase) -> None:
        """``prompt_length`` of the prompt in ``tensordict``: its token ids' count in tokens mode, else its text's
        tokens, counting only the text added since the last prompt (as tokens mode builds its prompts)."""
        if self.prompt_tokens:
            tokens = tensordict.get(self.layout.tokens_prompt, None)
            if isinstance(tokens, torch.Tensor):
                self.prompt_length = int(tokens.shape[-1])
                return
        text = text_of(tensordict.get(self.layout.prompt, None))
        if text.startswith(self._prompt_text) and self._prompt_text:
            self.prompt_length += self._count(text[len(self._prompt_text):])
        else:
            self.prompt_length = self._count(text)
        self._prompt_text = text

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        self.episode_tokens += self._reply
        outcomes = ["length"] if self._cut else []
        if not (outcomes or self.budgeted):
            self._write(next_tensordict, (), False)
            return next_tensordict
        done = next_tensordict.get("done", None)
        if self.budgeted and (done is None or not bool(done.any())):
            room = self.max_turn_tokens or 1
            if self.context_window is not None:
                self._measure(next_tensordict)
            if (self.context_window is not None and self.prompt_length + room > self.context_window) or (
                self.max_episode_tokens is not None and self.episode_tokens + room > self.max_episode_tokens
            ):
                outcomes.append("overflow")
        if not outcomes:
            self._write(next_tensordict, (), False)
            return next_tensordict
        rules = [self.rules[outcome] for outcome in outcomes]
        penalty = sum(rule.penalty for rule in rules)
        if penalty:
            reward = next_tensordict.get(self.layout.reward)
            next_tensordict.set(self.layout.reward, reward + penalty)
        if any(rule.end for rule in rules) and (done is None or not bool(done.any())):
            self._end(next_tensordict, "+".join(o for o, r in zip(outcomes, rules, strict=True) if r.end))
        self._write(next_tensordict, outcomes, any(rule.mask for rule in rules))
        return next_tensordict

    def _end(self, next_tensordict: TensorDictBase, why: str) -> None:
        """End the episode on this step as truncated; a further step raises ``EnvMisuseError`` naming ``why``."""
        device = next_tensordict.device
        next_tensordict.set("done", torch.tensor([True], device=device))
        next_tensordict.set("truncated", torch.tensor([True], device=device))
        next_tensordict.set("terminated", torch.tensor([False], device=device))
        base = self.base
        base.stop_reason = why
        base.ended = f"{why} (the context policy), after {base.turns} turns"

    def _write(self, tensordict: TensorDictBase, outcomes: Any, masked: bool) -> None:
        flags = torch.zeros(3, dtype=torch.bool, device=tensordict.device)  # one storage for the three flags
        for index, name in enumerate(OUTCOMES):
            if name in outcomes:
                flags[index] = True
            tensordict.set(name, flags[index:index + 1])
        if masked:
            flags[2] = True
        tensordict.set(MASKED_KEY, flags[2:])

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        device = observation_spec.device
        for key in (*OUTCOMES, MASKED_KEY):
            observation_spec[key] = Categorical(2, shape=(1,), dtype=torch.bool, device=device)
        return observation_spec
