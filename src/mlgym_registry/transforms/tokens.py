"""Tokens mode: the prompt as the tokenizer's token ids, grown turn by turn; a response given as tokens is decoded.

The prompt of turn t+1 is the full sequence of turn t (its prompt tokens, then the response tokens exactly as the
policy generated them) followed by the tokens of the text the chat template added after the response (end of turn,
the next user message, the generation prompt). So what the model is trained on is what it saw and produced, and
each turn tokenizes only what is new. When the rendered prompt does not continue the response (the model wrote
past its end-of-turn marker, which the conversation drops) the new text is tokenized after the previous prompt.
When an earlier part of the prompt changed (a history processor hid an old turn) the tokens are kept up to the last
turn's prompt that is still unchanged and the rest is tokenized again; when the conversation was rendered anew the
whole prompt is. ``retokenized`` counts those turns.

A chat template that rewrites earlier turns when a new one is added (some drop the reasoning, ``<think>...</think>``,
of past assistant turns, as Qwen3's does) is not prefix-preserving: the next prompt cannot continue the sampled
sequence. The first time a turn's prompt does not continue the previous prompt and the assistant turn, the
conversation is rendered with and without the new turn; when the rendering without it is not a prefix of the one
with it, the template is at fault and a ``TemplateNotPrefixPreserving`` warning says so, once per env.
"""

from __future__ import annotations

import bisect
import warnings
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import Composite, Unbounded

from ..errors import PolicyOutputError
from .base import ChainTransform, text_of
from .layout import Layout, set_entry, set_spec


class TemplateNotPrefixPreserving(UserWarning):
    """Tokens mode runs over a chat template that rewrites earlier turns: later prompts do not hold the tokens the
    policy sampled before."""


class TokensPrompt(ChainTransform):
    """Writes ``("tokens", "prompt")`` and its ``("masks", "all_attention_mask")``; in the inverse pass, decodes
    ``("tokens", "response")`` when no text came."""

    def __init__(self, layout: Layout, tokenizer: Any, rendered: Any = None):
        """``rendered``: the chain's ``IncrementalPrompt``, which knows how much of a changed prompt is unchanged."""
        if layout.tokens_prompt is None or layout.tokens_response is None:
            raise ValueError(f"the {layout.name!r} layout has no tokens keys; input_mode='tokens' needs 'default'")
        if tokenizer is None:
            raise ValueError(
                "input_mode='tokens' needs a tokenizer: registry.make(..., input_mode='tokens', tokenizer=tok) with "
                "a tokenizer object or the folder of a saved one"
            )
        super().__init__(layout, in_keys_inv=[layout.tokens_response], out_keys_inv=[layout.response])
        self.tokenizer = tokenizer
        self.rendered = rendered
        self.retokenized = 0
        self.prefix_preserving: bool | None = None
        """False once a turn showed that the chat template rewrites earlier turns (warned once), else None."""
        self._text = ""
        self._tokens = torch.empty(0, dtype=torch.long)
        self._marks: list[tuple[int, int]] = []
        """``(len(text), len(tokens))`` of each turn's prompt this episode: where the tokens can be cut."""
        self._response_text: str | None = None
        self._response_tokens: torch.Tensor | None = None

    def _encode(self, text: str) -> torch.Tensor:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.as_tensor(ids, dtype=torch.long)

    def _remember(self, text: str, tokens: torch.Tensor, out: TensorDictBase) -> TensorDictBase:
        self._text, self._tokens = text, tokens
        self._marks.append((len(text), len(tokens)))
        set_entry(out, self.layout.tokens_prompt, tokens)
        # TorchRL's wrappers read the prompt's mask here before making one, so a stale mask of the previous turn
        # (carried over by step_mdp) must be replaced
        set_entry(out, self.layout.attention_mask, torch.ones(tokens.shape, dtype=torch.bool))
        return out

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        text = text_of(tensordict_reset.get(self.layout.prompt))
        self._marks = []
        return self._remember(text, self._encode(text), tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._response_text = self._response_tokens = None
        tokens = tensordict.get(self.layout.tokens_response, None)
        text = tensordict.get(self.layout.response, None)
        if tokens is not None:
            tokens = self._token_ids(tokens)
        if text is None and tokens is None:
            raise PolicyOutputError(
                f"the step input has no model response: input_mode='tokens' reads the token ids at "
                f"{self.layout.tokens_response!r} (or the text at {self.layout.response!r}); TorchRL's "
                "TransformersWrapper/vLLMWrapper with input_mode='tokens' write both"
            )
        if text is None:
            text = self.tokenizer.decode(tokens.tolist(), skip_special_tokens=False)
            tensordict.set(self.layout.response, text)
        self._response_text = text_of(text)
        self._response_tokens = tokens
        return tensordict

    def _retokenize(self, text: str) -> torch.Tensor:
        """The tokens of ``text``, keeping those of the longest earlier turn's prompt that ``text`` still starts with
        (as far as the chat template stage knows; otherwise none)."""
        unchanged = getattr(self.rendered, "unchanged", 0) if self.rendered is not None else 0
        index = bisect.bisect_right(self._marks, (unchanged, len(self._tokens))) - 1
        if index < 0 or unchanged <= 0:
            self._marks = []
            return self._encode(text)
        length, count = self._marks[index]
        del self._marks[index + 1:]
        return torch.cat([self._tokens[:count], self._encode(text[length:])])

    def _token_ids(self, tokens: Any) -> torch.Tensor:
        if isinstance(tokens, str) or not isinstance(tokens, torch.Tensor):
            raise PolicyOutputError(
                f"{self.layout.tokens_response!r} holds a {type(tokens).__name__}, but input_mode='tokens' expects "
                "the response's token ids (an integer tensor); write text to "
                f"{self.layout.response!r} instead, or build the env with input_mode='history' or 'text'"
            )
        if tokens.is_floating_point() or tokens.ndim != 1:
            raise PolicyOutputError(
                f"{self.layout.tokens_response!r} holds a {tokens.dtype} tensor of shape {tuple(tokens.shape)}; "
                "input_mode='tokens' expects one 1-D integer tensor of token ids per env"
            )
        return tokens.long()

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        text = text_of(next_tensordict.get(self.layout.prompt))
        response, response_tokens = self._response_text, self._response_tokens
        if not text.startswith(self._text):
            self.retokenized += 1
            self._check_template(text)
            return self._remember(text, self._retokenize(text), next_tensordict)
        added = text[len(self._text):]
        if response_tokens is not None and response and added.startswith(response):
            tokens = torch.cat([self._tokens, response_tokens, self._encode(added[len(response):])])
        else:
            if response_tokens is not None:
                self.retokenized += 1
                if response and not added.startswith(self._assistant_content(response)):
                    self._check_template(text)
            tokens = torch.cat([self._tokens, self._encode(added)])
        return self._remember(text, tokens, next_tensordict)

    def _assistant_content(self, response: str) -> str:
        renderer = getattr(self.rendered, "renderer", None)
        return renderer.assistant_content(response) if renderer is not None else response

    def _check_template(self, text: str) -> None:
        """Warn (once) when the chat template is to blame for ``text`` not continuing the last turn: the conversation
        rendered without its newest turn is not a prefix of ``text``, the rendering with it."""
        prompt = self.rendered
        if self.prefix_preserving is not None or prompt is None or not prompt.messages:
            return
        messages = prompt.messages
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        if last < 0 or text.startswith(prompt.renderer.render(messages[: last + 1], False)):
            return
        self.prefix_preserving = False
        name = prompt.renderer.template_name or "the tokenizer's own"
        warnings.warn(
            f"the chat template ({name}) is not prefix-preserving: adding a turn rewrites earlier ones (as templates "
            "that drop the reasoning of past assistant turns do). In tokens mode each later prompt then holds the "
            "template's rewritten text, not the tokens the policy sampled, so the episode is not one sequence: train "
            "on each turn's own prompt and response (as GRPOLoss's masking does), or use a template that keeps past "
            "turns as they were",
            TemplateNotPrefixPreserving,
            stacklevel=2,
        )

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        device = observation_spec.device
        set_spec(observation_spec, self.layout.tokens_prompt, Unbounded(shape=(-1,), dtype=torch.long, device=device))
        set_spec(observation_spec, self.layout.attention_mask, Unbounded(shape=(-1,), dtype=torch.bool, device=device))
        return observation_spec
