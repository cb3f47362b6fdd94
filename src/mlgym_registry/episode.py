"""The episode loop shared by ``run`` and ``replay``: a policy talks to an env built by ``registry.make``.

Each turn the policy gets the conversation from the env's ``History``, its response goes into the env's response key,
and the step's observation, reward and the backend's ``info`` come back. Every turn is recorded (through an optional
``TrajectoryWriter``, saved as it goes) and reported to an optional callback, so a caller can show it live.

The env itself ends every episode: like MLGym's agent, it turns the third format error in a row into the
``exit_format`` action (the backend then autosubmits), and it caps the turns. A turn whose response held no command is
recorded as a step with an empty action and the parser's message as its observation, so every response the policy
gave appears in the ``.traj``; the turn that ended the episode on a format error is recorded as MLGym records it, with
the action ``exit_format``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import FormatError
from .policies.base import Policy, PolicyExhausted
from .specs import TaskSpec
from .trajectories import Step, TrajectoryWriter
from .validation import check_option

EXIT_FORMAT_THOUGHT = "Exit due to format error"
"""The thought MLGym's agent records on the step that ends an episode after repeated format errors."""


@dataclass
class Turn:
    """One turn of an episode, as shown to the user and written to the ``.traj``."""

    index: int
    response: str
    thought: str
    action: str
    observation: str
    reward: float
    done: bool
    state: str
    execution_time: float
    format_error: bool = False
    info: dict[str, Any] | None = None

    def step(self) -> Step:
        """The ``.traj`` entry of this turn."""
        return Step(action=self.action, observation=self.observation, response=self.response, state=self.state,
                    thought=self.thought, execution_time=self.execution_time)


@dataclass
class EpisodeResult:
    """What an episode produced: its turns, the backend's final ``info`` and the score against the baseline."""

    spec: TaskSpec
    turns: list[Turn] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    stop_reason: str = ""

    @property
    def total_reward(self) -> float:
        """The sum of the env's rewards over the episode."""
        return sum(turn.reward for turn in self.turns)

    @property
    def score(self) -> dict[str, float] | None:
        """The last metric dict the backend recorded (the final submission's, when the episode ended with one)."""
        scores = self.info.get("score") or []
        return dict(scores[-1]) if scores else None

    @property
    def baseline(self) -> dict[str, float] | None:
        """The task's baseline metric dict."""
        return self.spec.baseline

    @property
    def metric(self) -> str | None:
        """The metric the score is judged on."""
        from .components.rewards import ScoreError, priority_metric

        metrics = self.score or self.baseline
        if not metrics:
            return None
        try:
            return priority_metric(metrics, self.spec)
        except ScoreError:
            return None

    @property
    def improvement(self) -> float | None:
        """Score minus baseline on the priority metric (positive is better, whatever the metric's direction)."""
        from .components.rewards import metric_delta

        if self.score is None or self.metric is None or self.metric not in self.score:
            return None
        return metric_delta(self.score, self.baseline, self.spec)

    def summary(self) -> str:
        """One line: exit status, score and baseline."""
        status = self.info.get("exit_status") or "not finished"
        metric = self.metric
        if self.score is None or metric is None:
            return f"exit status: {status}; no score (baseline: {self.baseline})"
        score = self.score.get(metric)
        base = (self.baseline or {}).get(metric)
        verdict = ""
        if self.improvement is not None and base is not None:
            verdict = " (above the baseline)" if self.improvement > 0 else " (not above the baseline)"
        return f"exit status: {status}; {metric}: {score:.4f} vs baseline {base if base is None else f'{base:.4f}'}" \
               f"{verdict}"


def env_parts(env: Any) -> tuple[Any, Any]:
    """The ``BackendEnv`` at the bottom of ``env`` and its key layout."""
    base = getattr(env, "base_env", env)
    return base, base.layout


def conversation(td: Any, layout: Any) -> list[dict[str, str]]:
    """The ``{"role", "content"}`` messages of the env's ``History`` in ``td``."""
    from .transforms.history import as_dicts

    return as_dicts(td.get(layout.history))


def text_at(td: Any, key: Any) -> str:
    """The string stored at ``key`` in ``td`` ('' when absent or None), unwrapping TorchRL's non-tensor containers."""
    value = td.get(key, None)
    while value is not None and not isinstance(value, str) and hasattr(value, "data"):
        value = value.data
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return "" if value is None else str(value)


def parse_turn(parser: Callable[[str], tuple[str, str]], response: str, after: Any, observation_key: Any):
    """``(thought, action, observation, format_error)`` of a stepped turn; a format error's message is shown, unless
    the env sent ``exit_format`` for it instead of a retry: then the backend's observation is."""
    try:
        thought, action = parser(response)
    except FormatError as exc:
        retried = after.get("retry", None)
        if retried is not None and not bool(retried.any()):
            return EXIT_FORMAT_THOUGHT, "exit_format", text_at(after, observation_key), True
        return response, "", str(exc), True
    return thought, action, text_at(after, observation_key), False


def run_episode(
    env: Any,
    policy: Policy,
    *,
    spec: TaskSpec | None = None,
    writer: TrajectoryWriter | None = None,
    on_turn: Callable[[Turn], None] | None = None,
    seed: int | None = None,
    max_turns: int | None = None,
) -> EpisodeResult:
    """Play one episode of ``env`` with ``policy`` and return its turns and score.

    ``writer`` records the episode as it goes; ``on_turn`` is called after every turn; ``max_turns`` stops the loop
    earlier than the env's own cap. The env is reset here but not closed: the caller owns it. A ``seed`` that is not
    an integer >= 0 raises ``InvalidOptionError`` before the env is touched.
    """
    check_option("seed", seed)
    base, layout = env_parts(env)
    if seed is not None:
        env.set_seed(seed)
    td = env.reset()
    spec = spec or base.task.spec  # after the reset: a multi-task env has just picked its task
    parser = base.task.parser
    messages = conversation(td, layout)
    if writer is not None:
        for message in messages:
            (writer.system if message["role"] == "system" else writer.user)(message["content"])
    policy.reset(spec)
    result = EpisodeResult(spec)
    max_turns = max_turns or base.max_turns
    while len(result.turns) < max_turns:
        state = text_at(td, layout.state)
        try:
            response = policy(messages)
        except PolicyExhausted as exc:
            result.stop_reason = str(exc)
            break
        started = time.monotonic()
        td.set(layout.response, response)
        td = env.step(td)
        elapsed = time.monotonic() - started
        after = td["next"]
        thought, action, observation, format_error = parse_turn(parser, response, after, layout.observation)
        info = base.last_info
        if info is not None:
            result.info = dict(info)
        turn = Turn(
            index=len(result.turns),
            response=response,
            thought=thought,
            action=action,
            observation=observation,
            reward=float(after.get(layout.reward).sum()),
            done=bool(after.get("done").any()),
            state=state,
            execution_time=elapsed,
            format_error=format_error,
            info=None if info is None else dict(info),
        )
        result.turns.append(turn)
        messages = conversation(after, layout)
        if writer is not None:
            writer.step(turn.step(), info=result.info)
            if not turn.done and messages and messages[-1]["role"] == "user":
                writer.user(messages[-1]["content"])
        if on_turn is not None:
            on_turn(turn)
        if turn.done:
            result.finished = True
            if base.stop_reason is not None:
                result.stop_reason = f"the env ended the episode ({base.stop_reason}: {base.max_turns} turns)"
            break
        # the next root is the step's output, minus what belongs to the transition (step_mdp cannot carry the
        # growing History: its lazy stacks differ in length from step to step)
        td = after.exclude(*env.reward_keys, *env.done_keys)
    else:
        result.stop_reason = f"stopped after {max_turns} turns"
    if writer is not None:
        writer.finish(result.info)
    return result
