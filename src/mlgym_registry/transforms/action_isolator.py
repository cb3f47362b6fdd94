"""Stage 2, action isolator: the model's response becomes the backend's action (inverse pass).

The isolator component parses the response and guards multi-line ``edit``/``insert`` bodies with their heredoc the
way MLGym's agent does (reference bug #8). A ``FormatError`` sets ``retry`` (the backend is not stepped), keeps the
error text for the format-error message and adds the ``reward_wrong_format`` penalty on that same step. The
``max_format_errors``-th format error in a row is not retried: as MLGym's agent does, the step sends the backend
``exit_format``, which ends the episode with an autosubmission (the penalty still applies). The parser's output (two
strings) and the isolator's (a string) are checked on the way, and what either raises but ``FormatError`` is reported as
that component's (``output_checks``: ``ComponentOutputError``), except an error on a reply when the component handles
ordinary replies: that reply is a format error like any other (``output_checks.ParserFailedOnReply``,
``IsolatorFailedOnReply``), so one hostile reply does not end the episode.

Whatever the isolator, the response it reads and the action it returns are valid text: a lone surrogate a tokenizer
produced (``"\\ud800"``) cannot be encoded for the shell, so it is replaced before it reaches the backend.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from ..components import output_checks
from ..components.isolators import replace_lone_surrogates
from ..errors import FormatError
from .base import ASSISTANT_KEY, FORMAT_ERROR_KEY, ChainTransform, missing_response, text_of
from .layout import Layout

EXIT_FORMAT = "exit_format"
"""MLGym's special action that ends an episode after too many format errors (the backend autosubmits)."""


class ActionIsolator(ChainTransform):
    """``response`` -> ``action`` and ``retry``; penalty on a retry step."""

    def __init__(self, layout: Layout, reward_wrong_format: float | None = None):
        super().__init__(layout, in_keys_inv=[layout.response], out_keys_inv=[layout.action])
        self.reward_wrong_format = reward_wrong_format

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        # the assistant turn as the chat template cut it from the response (nothing after its end-of-turn marker)
        response = tensordict.get(ASSISTANT_KEY, None)
        if response is None:
            response = tensordict.get(self.layout.response, None)
        if response is None:
            raise missing_response(self.layout)
        response = text_of(response)
        base = self.base
        task = base.task
        try:
            # the parser is checked where the isolator calls it, the isolator's action right after (output_checks)
            action = output_checks.call_isolator(task, replace_lone_surrogates(response),
                                                 output_checks.checked_parser(task))
        except FormatError as exc:
            base.format_errors += 1
            tensordict.set(FORMAT_ERROR_KEY, str(exc))
            if base.max_format_errors is not None and base.format_errors >= base.max_format_errors:
                tensordict.set(self.layout.retry, False)
                tensordict.set(self.layout.action, EXIT_FORMAT)
            else:
                tensordict.set(self.layout.retry, True)
            return tensordict
        base.format_errors = 0
        tensordict.set(self.layout.retry, False)
        tensordict.set(self.layout.action, replace_lone_surrogates(action) if isinstance(action, str) else action)
        return tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if self.reward_wrong_format is not None and tensordict.get(FORMAT_ERROR_KEY, None) is not None:
            reward = next_tensordict.get(self.layout.reward)
            next_tensordict.set(self.layout.reward, reward + float(self.reward_wrong_format))
        return next_tensordict
