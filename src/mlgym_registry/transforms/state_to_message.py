"""Stage 6, state to message: the user message the model sees next, from the template set, state and observation.

It reads the observation and state of the step that just ran (time t+1): TorchRL's reference read time t, so every
message showed the previous step's output (reference bug #2). After reset the message is the task template (and the
strategy template if any); after a step, ``next_step_template`` or, when the step printed nothing,
``next_step_no_output_template``; after a retry, the format-error message.

An observation longer than ``max_observation_chars`` goes into the message cut to its head and tail around a note
saying how much was cut (``cap_observation``): one huge output would otherwise fill the context window.
"""

from __future__ import annotations

import json
from typing import Any

from tensordict import TensorDictBase
from torchrl.data import Composite, NonTensor

from ..components import output_checks
from ..components.templates import format_error_message
from .base import FORMAT_ERROR_KEY, ChainTransform, is_retry, text_of
from .layout import Layout


class _KeepUnknown(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def cap_observation(observation: str, limit: int | None) -> str:
    """``observation`` itself when it has at most ``limit`` characters (or ``limit`` is None); else its first and last
    ``limit // 2`` characters around a line ``[... 87,412 characters cut ...]``."""
    if limit is None or len(observation) <= limit:
        return observation
    head, tail = limit // 2, limit - limit // 2
    cut = len(observation) - head - tail
    return f"{observation[:head]}\n[... {cut:,} characters cut ...]\n{observation[len(observation) - tail:]}"


class StateToMessage(ChainTransform):
    """Writes ``message``; an observation longer than ``max_observation_chars`` is shown cut (None: whole)."""

    def __init__(self, layout: Layout, *, max_observation_chars: int | None = None, **kwargs: Any):
        super().__init__(layout, **kwargs)
        self.max_observation_chars = max_observation_chars

    def _state_fields(self, state: str) -> dict[str, Any]:
        try:
            fields = json.loads(state)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the backend's state command printed {state!r}, which is not JSON") from exc
        if not isinstance(fields, dict):
            raise ValueError(f"the backend's state command printed {state!r}, which is not a JSON object")
        backend = self.base.backend
        fields["current_step"] = backend.current_step
        fields["remaining_steps"] = backend.max_steps - backend.current_step
        return fields

    def _fields(self, state: str, observation: str) -> dict[str, Any]:
        return {**self.template_fields(), **self._state_fields(state), "observation": observation}

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        templates = self.templates
        fields = self._fields(text_of(tensordict_reset.get(self.layout.state)), "")
        parts = [self.render_template(templates.task_template, fields, what="task_template")]
        if templates.strategy_template:
            parts.append(self.render_template(templates.strategy_template, fields, what="strategy_template"))
        tensordict_reset.set(self.layout.message, "\n".join(parts))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if is_retry(tensordict, self.layout):
            message = self._format_error(text_of(tensordict.get(FORMAT_ERROR_KEY, None)))
        else:
            observation = text_of(next_tensordict.get(self.layout.observation, None))
            shown = cap_observation(observation, self.max_observation_chars)
            fields = self._fields(text_of(next_tensordict.get(self.layout.state)), shown)
            templates = self.templates
            if observation.strip():
                message = self.render_template(templates.next_step, fields, what="next_step_template")
            else:
                message = self.render_template(templates.next_step_no_output, fields,
                                               what="next_step_no_output_template")
        next_tensordict.set(self.layout.message, message)
        return next_tensordict

    def _format_error(self, error: str) -> str:
        templates = self.templates
        text = format_error_message(templates, self.base.task.parser)
        if output_checks.ENABLED and not isinstance(text, str):
            kind = "template" if templates.format_error_template else "parser"
            raise output_checks.fail(kind, self.base.task, f"gave {output_checks.short_repr(text)} as its format-error "
                                     "text", "the format-error text (format_error_template, or a parser's "
                                     "format_error_message) must be a string", text)
        try:
            return text.format_map(_KeepUnknown(self.template_fields(), error=error))
        except (ValueError, IndexError, AttributeError):  # literal braces (code examples): the text is meant as is
            return text

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[self.layout.message] = NonTensor(
            example_data="a message", shape=(), device=observation_spec.device
        )
        return observation_spec
