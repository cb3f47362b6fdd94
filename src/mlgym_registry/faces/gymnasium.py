"""A Gymnasium face for every task: ``gymnasium.make("mlgym_registry/prisonersDilemma")``.

``MLGymRegistryEnv`` drives the very env ``registry.make`` builds (the same components, backend, format-error rule,
rewards and seeding) with text: an action is a model's whole answer, which the task's parser and isolator turn into a
command exactly as in the TorchRL chain, and an observation is the next user message the chain's template made
(the command's output, the state line, or the format-error message). ``gymnasium_registration`` registers the ids.
"""

from __future__ import annotations

import copy
import math
import string
import sys
from typing import Any

import gymnasium
from gymnasium import spaces

from ..backends.protocol import EVALUATION_STATUS_KEY, EVALUATIONS_KEY, INFRA_ERROR, new_info
from ..episodes.episode import conversation, env_parts, facts_at, text_at, turn_facts
from ..errors import InvalidOverrideError, MLGymRegistryError
from ..transforms.backend_env import INFRA_ERROR_KEY

MAX_ACTION_CHARS = 1_000_000
"""The longest answer the action space admits (a model's answer is far shorter; longer ones are still stepped)."""

MAX_OBSERVATION_CHARS = 10_000_000
"""The longest user message the observation space admits (the chain caps a command's output at
``max_observation_chars``, 16,000 characters by default)."""

SAMPLE_CHARSET = "".join(c for c in string.printable if c not in "`\x0b\x0c\r")
"""The characters ``sample()`` draws from: printable ASCII without the backtick, so a sampled answer never holds a
fenced command block and runs nothing (it is a format error); ``contains`` admits every character."""

SAMPLE_MAX_CHARS = 2_000
"""The longest answer ``sample()`` draws."""

UNPAID = math.nan
"""The reward of a step whose evaluation was an ``infra_error`` (``info["infra_error"]`` is True): not a number, so
no sum or mean of rewards can take it for an outcome of the agent's; leave the step (and its episode) out."""


class GymOverrideError(InvalidOverrideError):
    """A keyword of ``gymnasium.make`` that ``registry.make`` refused (an ``InvalidOverrideError`` or a backend's
    ``UnknownOptionError``), with the same message. Gymnasium re-raises a ``TypeError`` from an env's constructor as
    ``type(error)(message)``, which only a one-message constructor survives."""

    def __init__(self, message: str):
        TypeError.__init__(self, message)
        self.unknown, self.valid = [], []


class AnyText(spaces.Text):
    """Gymnasium's ``Text`` space over every Unicode character: ``contains`` checks the type and length only (what
    command output and model answers hold is any text), and ``sample`` draws from ``SAMPLE_CHARSET``."""

    def __init__(self, max_length: int, *, min_length: int = 0, sample_max_length: int = SAMPLE_MAX_CHARS,
                 seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)
        self.sample_max_length = max(min_length, min(sample_max_length, max_length))

    def contains(self, x: Any) -> bool:
        """True for any ``str`` of ``min_length`` to ``max_length`` characters."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random text of at most ``sample_max_length`` characters of ``SAMPLE_CHARSET`` (``mask`` and
        ``probability`` as Gymnasium's ``Text`` takes them)."""
        if mask is None and probability is None:
            length = int(self.np_random.integers(self.min_length, self.sample_max_length + 1))
            mask = (length, None)
        return super().sample(mask=mask, probability=probability)

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AnyText) and self.min_length == other.min_length
                and self.max_length == other.max_length)


class MLGymRegistryEnv(gymnasium.Env[str, str]):
    """A task of the registry as a Gymnasium env of text actions and text observations.

    Args:
        task: a task name (as ``registry.make`` takes it), a ``TaskSpec`` or its ``to_dict()``.
        render_mode: ``"ansi"`` (``render()`` returns the latest turn as text), ``"human"`` (``reset`` and ``step``
            print it) or None.
        **overrides: ``registry.make``'s keyword arguments (``max_steps=``, ``parser=``, ``seed``-free backend
            options, ...), passed on unchanged.

    ``reset(seed=...)`` returns the task's first user message and an ``info`` with ``system`` (the system message) and
    ``task``. ``step(answer)`` returns the next user message, the chain's reward (a ``float``), ``terminated``,
    ``truncated`` and an ``info`` holding the backend's (``exit_status``, ``score``, ``submission``,
    ``evaluation_status``, ``evaluations``, ...) plus ``thought``, ``action`` (the parsed command, ``""`` when the
    answer held none), ``output`` (what the command printed), ``format_error`` (the message of an answer without a
    usable command, ``""`` for a usable one, as ``TurnFacts.format_error``) and ``infra_error``. A step whose
    evaluation failed for a reason that is not the agent's (``infra_error``) is never paid: its reward is ``UNPAID``
    (NaN), whatever the reward assigner made of it. ``chain`` is the TorchRL env underneath; ``messages`` the
    conversation the policy sees.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(self, task: Any, render_mode: str | None = None, **overrides: Any):
        from ..registry import registry

        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}; choose one of {self.metadata['render_modes']} or None")
        self.render_mode = render_mode
        self.task = task
        try:
            self.chain = registry.make(task, **overrides)
        except TypeError as exc:
            if isinstance(exc, MLGymRegistryError):
                raise GymOverrideError(str(exc)) from exc
            raise
        self.base, self.layout = env_parts(self.chain)
        self.action_space = AnyText(MAX_ACTION_CHARS)
        self.observation_space = AnyText(MAX_OBSERVATION_CHARS)
        self._td: Any = None
        self._latest: list[dict[str, str]] = []
        """The messages of the latest turn, which ``render`` shows."""

    # -- Gymnasium API -----------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; ``seed`` starts the seed's stream, as ``env.set_seed`` does on the TorchRL env."""
        super().reset(seed=seed, options=options)
        if seed is not None:
            self.chain.set_seed(seed)
        td = self.chain.reset()
        self._td = td
        messages = conversation(td, self.layout)
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        info = {"task": self.base.task.spec.id, "system": system, **new_info(), EVALUATION_STATUS_KEY: "",
                EVALUATIONS_KEY: [], INFRA_ERROR_KEY: False}
        self._show_from(0)
        return text_at(td, self.layout.message), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send a model's answer ``action``; what comes back is described in the class docstring."""
        if self._td is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        if not isinstance(action, str):
            raise TypeError(f"an action is a model's answer, a str; got {type(action).__name__}")
        shown_before = self._conversation_length()
        self._td.set(self.layout.response, action)
        after = self.chain.step(self._td)["next"]
        thought, command, _, _ = turn_facts(after, self.layout)
        format_error = facts_at(after, self.layout.turn).format_error
        info = self._step_info(thought, command, text_at(after, self.layout.observation), format_error)
        reward = UNPAID if info[INFRA_ERROR_KEY] else float(after.get(self.layout.reward).sum())
        terminated, truncated = bool(after.get("terminated").any()), bool(after.get("truncated").any())
        # the next root, as the episode loop takes it (step_mdp cannot carry the growing History)
        self._td = after.exclude(*self.chain.reward_keys, *self.chain.done_keys)
        self._show_from(shown_before)
        return text_at(after, self.layout.message), reward, terminated, truncated, info

    def render(self) -> str | None:
        """The latest turn as text (``"ansi"``), printed (``"human"``); None without a render mode."""
        if self.render_mode is None:
            gymnasium.logger.warn("render() without a render_mode: pass render_mode='ansi' or 'human' to make()")
            return None
        from ..records.conversation import format_conversation

        text = format_conversation(self._latest)
        if self.render_mode == "ansi":
            return text
        from ..terminal import printable

        print(printable(text), file=sys.stdout, flush=True)
        return None

    def close(self) -> None:
        """Close the TorchRL env and its backend (sandbox, processes, files); closing twice is allowed."""
        chain = self.__dict__.get("chain")
        if chain is not None:
            chain.close(raise_if_closed=False)
        self._td = None

    # -- helpers -----------------------------------------------------------------------------------------------
    @property
    def messages(self) -> list[dict[str, str]]:
        """The conversation the policy sees, as ``{"role", "content"}`` dicts (empty before the first reset)."""
        return [] if self._td is None else conversation(self._td, self.layout)

    @property
    def history(self) -> Any:
        """The conversation as the TorchRL ``History`` the chain keeps (None before the first reset)."""
        return None if self._td is None else self._td.get(self.layout.stored_history)

    def _step_info(self, thought: str, command: str, output: str, format_error: str) -> dict[str, Any]:
        info = copy.deepcopy(self.base.last_info) if self.base.last_info is not None else new_info()
        info.setdefault(EVALUATION_STATUS_KEY, "")
        info[EVALUATIONS_KEY] = list(self.base.evaluations)
        info[INFRA_ERROR_KEY] = info[EVALUATION_STATUS_KEY] == INFRA_ERROR
        info.update(task=self.base.task.spec.id, thought=thought, action=command, output=output,
                    format_error=format_error)
        return info

    def _conversation_length(self) -> int:
        """How many messages the whole conversation holds so far (also those a history processor hides)."""
        from ..transforms.history import message_count

        history = self.history
        return 0 if history is None else message_count(history)

    def _show_from(self, start: int) -> None:
        """Keep the messages from ``start`` on as the latest turn (read alone: a step costs the same at any length),
        and print them in ``"human"`` mode."""
        from ..transforms.history import as_dicts

        history = self.history
        self._latest = [] if history is None else as_dicts(history, start)
        if self.render_mode == "human":
            self.render()
