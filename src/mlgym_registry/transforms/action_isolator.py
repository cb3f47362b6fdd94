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

The step's facts are written here, once, into the step's output under ``layout.turn``: the ``thought``, the
``action`` as the model gave it ('' on a retry; the backend ran its isolated form) and the ``format_error`` message
('' when the reply was usable). The episode loop, the Gymnasium face and the worker processes read their turn from
them (``episodes.episode.turn_facts``), and the reply is parsed once per step: the thought comes from the parse the
isolator itself asked for.
"""

from __future__ import annotations

from typing import Any

from tensordict import NonTensorData, TensorDictBase
from torchrl.data import Composite, NonTensor

from ..components import output_checks
from ..components.isolators import replace_lone_surrogates
from ..errors import FormatError
from ..tool_language import EXIT_FORMAT, EXIT_FORMAT_THOUGHT
from .base import ASSISTANT_KEY, FORMAT_ERROR_KEY, ChainTransform, missing_response, text_of
from .layout import Layout
from .turn_facts import NO_FACTS, TurnFacts

_TURN_KEY = "_turn"
"""Private key (in the inverse pass only) holding the step's facts until the step's output is there."""


class RememberingParser:
    """A parser that keeps what it last returned, so that the thought of a reply comes from the parse its isolator
    asked for instead of a second one; reads any other attribute from the parser itself."""

    __slots__ = ("parser", "text", "parsed")

    def __init__(self, parser: Any):
        self.parser, self.text, self.parsed = parser, None, None

    def __call__(self, text: str) -> tuple[str, str]:
        parsed = self.parser(text)
        self.text, self.parsed = text, parsed
        return parsed

    def parse_of(self, text: str) -> tuple[str, str] | None:
        """``(thought, action)`` of ``text``: the remembered parse when the isolator parsed ``text`` itself, else a
        parse now (an isolator that reads replies without the parser); None when the parser finds no command."""
        if self.text is not text and self.text != text:
            try:
                self(text)
            except FormatError:
                return None
        thought, action = self.parsed
        return (thought if isinstance(thought, str) else str(thought)), (action if isinstance(action, str) else
                                                                       str(action))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)

    def __repr__(self) -> str:
        return repr(self.parser)


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
        response = replace_lone_surrogates(text_of(response))
        base = self.base
        task = base.task
        parser = RememberingParser(output_checks.checked_parser(task))
        try:
            # the parser is checked where the isolator calls it, the isolator's action right after (output_checks)
            action = output_checks.call_isolator(task, response, parser)
        except FormatError as exc:
            base.format_errors += 1
            error = str(exc)
            tensordict.set(FORMAT_ERROR_KEY, error)
            if base.max_format_errors is not None and base.format_errors >= base.max_format_errors:
                tensordict.set(self.layout.retry, False)
                tensordict.set(self.layout.action, EXIT_FORMAT)
                return _with_facts(tensordict, TurnFacts(EXIT_FORMAT_THOUGHT, EXIT_FORMAT, error))
            tensordict.set(self.layout.retry, True)
            return _with_facts(tensordict, TurnFacts(response, "", error))
        base.format_errors = 0
        if isinstance(action, str):  # (with output checks off, whatever the isolator returned goes on as it is)
            action = replace_lone_surrogates(action)
        tensordict.set(self.layout.retry, False)
        tensordict.set(self.layout.action, action)
        # the turn's action is the command as the model gave it (what MLGym's trajectories record), not the
        # isolator's heredoc-guarded form of it that the backend runs
        thought, command = parser.parse_of(response) or ("", text_of(action))
        return _with_facts(tensordict, TurnFacts(thought, command, ""))

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if self.reward_wrong_format is not None and tensordict.get(FORMAT_ERROR_KEY, None) is not None:
            reward = next_tensordict.get(self.layout.reward)
            next_tensordict.set(self.layout.reward, reward + float(self.reward_wrong_format))
        facts = tensordict.get(_TURN_KEY, None)
        next_tensordict.set(self.layout.turn, facts if facts is not None else _entry(NO_FACTS))
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set(self.layout.turn, _entry(NO_FACTS))
        return tensordict_reset

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[self.layout.turn] = NonTensor(example_data=NO_FACTS, shape=(), device=observation_spec.device)
        return observation_spec


def _entry(facts: TurnFacts) -> NonTensorData:
    # one entry for the three: a nested TensorDict of three strings cost the step ~0.5 ms more (bench_chain.py)
    return NonTensorData(facts, batch_size=())


def _with_facts(tensordict: TensorDictBase, facts: TurnFacts) -> TensorDictBase:
    tensordict.set(_TURN_KEY, _entry(facts))
    return tensordict
