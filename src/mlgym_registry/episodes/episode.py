"""The episode loop shared by ``run`` and ``replay``: a policy talks to an env built by ``registry.make``.

Each turn the policy gets the conversation from the env's ``History``, its response goes into the env's response key,
and the step's observation, reward and the backend's ``info`` come back. Every turn is recorded (through an optional
``EpisodeRecorder``: a ``TrajectoryWriter``, saved as it goes, or a worker's ``CallRecorder``) and reported to an
optional callback, so a caller can show it live.

The env itself ends every episode: like MLGym's agent, it turns the third format error in a row into the
``exit_format`` action (the backend then autosubmits), and it caps the turns. A turn whose response held no command is
recorded as a step with an empty action and the parser's message as its observation, so every response the policy
gave appears in the ``.traj``; the turn that ended the episode on a format error is recorded as MLGym records it, with
the action ``exit_format``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ComponentOutputError
from ..options import check_option
from ..policies.base import Policy, PolicyExhausted
from ..records.recorder import EpisodeRecorder
from ..records.trajectories import Step, TurnTokens
from ..specs import TaskSpec
from ..tool_language import EXIT_FORMAT
from ..transforms.turn_facts import TurnFacts


@dataclass
class Turn(TurnTokens):
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
                    thought=self.thought, execution_time=self.execution_time, prompt_tokens=self.prompt_tokens,
                    response_tokens=self.response_tokens, log_probs=self.log_probs,
                    policy_version=self.policy_version, outcome=self.outcome, masked=self.masked, call=self.call)


@dataclass
class EpisodeResult:
    """What an episode produced: its turns, the backend's final ``info`` and the score against the baseline."""

    spec: TaskSpec
    turns: list[Turn] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    stop_reason: str = ""
    failure: str = ""
    """Why the episode could not go on (its worker died, the env raised), or '' when nothing failed."""
    worker: dict[str, Any] = field(default_factory=dict)
    """Where a remote episode was played (``node_id``, ``host``, ``pid`` of its Ray actor); empty otherwise."""

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
        from ..scores import ScoreError, priority_metric

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
        from ..scores import find_metric, metric_delta

        if self.score is None or self.metric is None or find_metric(self.metric, self.score) is None:
            return None
        return metric_delta(self.score, self.baseline, self.spec)

    @property
    def infra_errors(self) -> int:
        """How many of the episode's evaluations failed for reasons that are not the agent's (``infra_error``)."""
        from ..backends.protocol import infra_errors

        return infra_errors(self.info)

    def summary(self) -> str:
        """One line: exit status, score and baseline (and any evaluation the infrastructure failed)."""
        if self.failure:
            return f"failed after {len(self.turns)} turns: {self.failure}"
        if self.infra_errors:
            return f"{self._summary()}; WARNING: {self.infra_errors} evaluation(s) failed for reasons that are not " \
                   "the agent's (infra_error: not paid, not the agent's outcome)"
        return self._summary()

    def _summary(self) -> str:
        status = self.info.get("exit_status") or "not finished"
        metric = self.metric
        if self.score is None or metric is None:
            return f"exit status: {status}; no score (baseline: {self.baseline})"
        from ..scores import find_metric

        score = self.score.get(find_metric(metric, self.score) or metric)
        base = (self.baseline or {}).get(find_metric(metric, self.baseline or {}) or metric)
        if score is None:
            return f"exit status: {status}; the score {self.score} lacks the task's metric {metric!r} (baseline: " \
                   f"{self.baseline})"
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
    from ..transforms.history import as_dicts

    return as_dicts(td.get(layout.history))


def text_at(td: Any, key: Any) -> str:
    """The string stored at ``key`` in ``td`` ('' when absent or None), unwrapping TorchRL's non-tensor containers."""
    value = _unwrapped(td.get(key, None), str)
    return "" if value is None else str(value)


def _unwrapped(value: Any, kind: type) -> Any:
    """``value`` out of TorchRL's non-tensor containers (``NonTensorData``, a one-item stack), down to a ``kind``."""
    while value is not None and not isinstance(value, kind) and hasattr(value, "data"):
        value = value.data
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value


def facts_at(td: Any, key: Any) -> TurnFacts:
    """The ``TurnFacts`` stored at ``key`` in ``td``, unwrapping TorchRL's non-tensor containers."""
    return _unwrapped(td.get(key), TurnFacts)


def turn_facts(after: Any, layout: Any) -> tuple[str, str, str, bool]:
    """``(thought, action, observation, format_error)`` of a stepped turn, read from the facts the chain's action
    isolator wrote into the step's output ``after`` (the reply is parsed once, there). A format error's message is
    its observation, unless the env sent ``exit_format`` for it instead of a retry: then the backend's observation
    is. A reply the parser reads but the isolator refuses (an ``edit`` that never ends) is a format error too."""
    facts = facts_at(after, layout.turn)
    thought, action, error = facts.thought, facts.action, facts.format_error
    if error and action != EXIT_FORMAT:
        return thought, action, error, True
    return thought, action, text_at(after, layout.observation), bool(error)


class EpisodePlayer:
    """One episode of ``env`` played by ``policy``, a turn at a time: ``start()``, then ``play_turn()`` until it
    returns ``None``; ``result`` holds what happened so far.

    ``run_episode`` plays a whole episode with it; a remote worker (``ray_episodes``) plays one turn per call so that
    each turn reaches the driver as soon as it is played. ``writer`` records the episode as it goes (an
    ``EpisodeRecorder``: every engine records through the same calls); ``on_turn`` is called after every turn.
    The env is reset by ``start`` but not closed: the caller owns it.
    """

    def __init__(self, env: Any, policy: Policy, *, spec: TaskSpec | None = None,
                 writer: EpisodeRecorder | None = None,
                 on_turn: Callable[[Turn], None] | None = None, seed: int | None = None,
                 max_turns: int | None = None):
        check_option("seed", seed)
        self.env, self.policy, self.writer, self.on_turn, self.seed = env, policy, writer, on_turn, seed
        self.base, self.layout = env_parts(env)
        self.spec = spec
        self.max_turns = max_turns
        self.result: EpisodeResult | None = None
        self._td: Any = None
        self._messages: list[dict[str, str]] = []
        self._over = False

    def start(self) -> EpisodeResult:
        """Reset the env (seeded when a seed was given) and record the first prompt.

        A recorded episode without a seed gets a fresh one, recorded with it (``provenance``), so that the run can
        be played again as it was."""
        if self.seed is None and self.writer is not None:
            self.seed = secrets.randbelow(1 << 31)
        if self.seed is not None:
            self.env.set_seed(self.seed)
        self._td = self.env.reset()
        self.spec = self.spec or self.base.task.spec  # after the reset: a multi-task env has just picked its task
        self._messages = conversation(self._td, self.layout)
        if self.writer is not None and self.writer.provenance is None:
            from ..records.provenance import provenance_record

            self.writer.provenance = provenance_record(self.spec, self.policy, self.seed)
        if self.writer is not None:
            with self.writer.batch():
                for message in self._messages:
                    (self.writer.system if message["role"] == "system" else self.writer.user)(message["content"])
        self.policy.reset(self.spec)
        self.result = EpisodeResult(self.spec)
        self.max_turns = self.max_turns or self.base.max_turns
        return self.result

    def play_turn(self) -> Turn | None:
        """Play the next turn and return it; ``None`` once the episode is over (then ``result`` is final)."""
        if self._over:
            return None
        result, layout = self.result, self.layout
        if len(result.turns) >= self.max_turns:
            result.stop_reason = f"stopped after {self.max_turns} turns"
            return self._end()
        state = text_at(self._td, layout.state)
        try:
            response = self.policy(self._messages)
        except PolicyExhausted as exc:
            result.stop_reason = str(exc)
            return self._end()
        except Exception as exc:  # recorded as failed, files kept valid; the caller decides what to do with it
            self._fail(f"{type(exc).__name__}: {exc}")
            raise
        import torch

        from ..transforms.context_policy import MASKED_KEY, outcome_of
        from ..transforms.layout import set_entry

        last_generation = getattr(self.policy, "last_generation", None)
        generation = last_generation() if callable(last_generation) else None
        version = self._policy_version(generation)
        last_call = getattr(self.policy, "last_call", None)
        call = last_call() if callable(last_call) else None
        started = time.monotonic()
        self._td.set(layout.response, response)
        if generation is not None and layout.tokens_response is not None:
            # the sampled ids go with the text, so the env judges the reply by them (a reply cut by max_new_tokens)
            set_entry(self._td, layout.tokens_response,
                      torch.tensor(generation.response_tokens, dtype=torch.long).expand(*self._td.batch_size, -1))
        turns_before = self.base.turns
        try:
            td = self.env.step(self._td)
        except ComponentOutputError as exc:
            stepped = self.base.turns > turns_before
            self._record_failed_step(response, state, time.monotonic() - started, stepped, exc)
            raise
        elapsed = time.monotonic() - started
        after = td["next"]
        thought, action, observation, format_error = turn_facts(after, layout)
        info = self._with_model_stats(self.base.last_info)
        if info is not None:  # the episode's outcome counts so far go on with the newest info
            result.info = {**dict(info), **({"outcomes": result.info["outcomes"]} if "outcomes" in result.info else {})}
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
            prompt_tokens=None if generation is None else list(generation.prompt_tokens),
            response_tokens=None if generation is None else list(generation.response_tokens),
            log_probs=None if generation is None or generation.log_probs is None else list(generation.log_probs),
            policy_version=version,
            outcome=outcome_of(after),
            masked=bool(after.get(MASKED_KEY, torch.zeros(1, dtype=torch.bool)).any()),
            call=call,
        )
        if turn.outcome:
            outcomes = result.info.setdefault("outcomes", {})
            for name in turn.outcome.split("+"):
                outcomes[name] = outcomes.get(name, 0) + 1
            if turn.info is not None:
                turn.info["outcomes"] = dict(outcomes)
        result.turns.append(turn)
        self._messages = conversation(after, layout)
        if self.writer is not None:
            with self.writer.batch():
                self.writer.step(turn.step(), info=result.info)
                if not turn.done and self._messages and self._messages[-1]["role"] == "user":
                    self.writer.user(self._messages[-1]["content"])
                elif not turn.done and self._messages and self._messages[-1]["role"] == "tool":  # native tool calls
                    from ..components.tool_calling import trailing_tool_messages

                    for message in trailing_tool_messages(self._messages):
                        self.writer.tool(message["content"], message["tool_call_id"])
        if self.on_turn is not None:
            self.on_turn(turn)
        if turn.done:
            result.finished = True
            if self.base.stop_reason == "max_turns":
                result.stop_reason = f"the env ended the episode ({self.base.stop_reason}: {self.base.max_turns} turns)"
            elif self.base.stop_reason is not None:
                result.stop_reason = f"the env ended the episode ({self.base.stop_reason}, the context policy)"
            self._end()
            return turn
        # the next root is the step's output, minus what belongs to the transition (step_mdp cannot carry the
        # growing History: its lazy stacks differ in length from step to step)
        self._td = after.exclude(*self.env.reward_keys, *self.env.done_keys)
        return turn

    def _record_failed_step(self, response: str, state: str, elapsed: float, stepped: bool,
                            error: ComponentOutputError) -> None:
        """Record the turn whose step a component failed, then end the episode as failed with the component's error:
        the ``.traj`` keeps the step (the backend's observation and info when it had stepped, e.g. a reward that
        raised on the submission) before the error surfaces."""
        try:
            thought, action = self.base.task.parser(response)
        except Exception:  # noqa: BLE001 - the parser may be the component that failed
            thought, action = response, ""
        info = dict(self.base.last_info or {}) if stepped else None
        observation = self.base.last_observation if stepped else ""
        turn = Turn(index=len(self.result.turns), response=response, thought=thought, action=action,
                    observation=observation, reward=0.0, done=stepped and self.base.ended is not None, state=state,
                    execution_time=elapsed, info=info)
        self.result.turns.append(turn)
        if info is not None:
            self.result.info = info
        if self.writer is not None:
            self.writer.step(turn.step(), info=self.result.info)
        self._fail(str(error))

    def _policy_version(self, generation: Any) -> int | None:
        """The version of the policy that gave this turn: its generation's, the env's ``policy_version`` (TorchRL's
        ``PolicyVersion`` transform), or the policy's ``version``."""
        if generation is not None and generation.policy_version is not None:
            return generation.policy_version
        import torch

        version = self._td.get("policy_version", None)
        if isinstance(version, torch.Tensor):
            return int(version.reshape(-1)[0])
        return getattr(self.policy, "version", None)

    def _end(self) -> None:
        self._over = True
        if self.writer is not None:
            self.writer.finish(self.result.info)

    def _fail(self, reason: str) -> None:
        """End the episode as failed: the writer records why, beside the policy's usage so far."""
        self._over = True
        self.result.failure = reason
        self.result.info = self._with_model_stats(self.result.info) or {}
        if self.writer is not None:
            self.writer.fail(reason, info=self.result.info)

    def _with_model_stats(self, info: dict[str, Any] | None) -> dict[str, Any] | None:
        """``info`` with the policy's usage as ``info["model_stats"]`` (MLGym's place for it), when it keeps any."""
        stats = getattr(self.policy, "stats", None)
        stats = stats() if stats is not None else None
        if stats is None:
            return info
        return {**(info or {}), "model_stats": stats}


def run_episode(
    env: Any,
    policy: Policy,
    *,
    spec: TaskSpec | None = None,
    writer: EpisodeRecorder | None = None,
    on_turn: Callable[[Turn], None] | None = None,
    seed: int | None = None,
    max_turns: int | None = None,
) -> EpisodeResult:
    """Play one episode of ``env`` with ``policy`` and return its turns and score.

    ``writer`` records the episode as it goes; ``on_turn`` is called after every turn; ``max_turns`` stops the loop
    earlier than the env's own cap. The env is reset here but not closed: the caller owns it. A ``seed`` that is not
    an integer >= 0 raises ``InvalidOptionError`` before the env is touched.
    """
    player = EpisodePlayer(env, policy, spec=spec, writer=writer, on_turn=on_turn, seed=seed, max_turns=max_turns)
    result = player.start()
    while player.play_turn() is not None:
        pass
    return result

