"""A verifiers face: the registry's tasks as verifiers environments, for ``vf-eval``, prime-rl and verifiers' own loops.

``load_environment(task=..., **options)`` returns a ``vf.MultiTurnEnv`` whose every rollout plays one episode of the
env ``registry.make(task, **options)`` builds, through ``gymnasium.MLGymRegistryEnv``: the same components, sandbox,
format-error rule, rewards, statuses and seeding. verifiers finds it by module name, as it finds every environment
module (``vf.load_environment(ENV_ID, task="blotto")``, ``vf-eval mlgym_registry.faces.verifiers -a '{...}'``).

A rollout starts the env (in ``setup_state``): the prompt is the env's system message and first user message; each
model reply is stepped through the env and the messages the env answers it with (a ``user`` message, or ``tool``
messages for a tool-calling parser) are the next ones; the rollout ends when the episode does. Its reward is the sum
of the env's rewards, and the episode's statuses are in ``state["mlgym"]`` and the output's ``info["mlgym"]``. An
evaluation that failed for a reason not the agent's (``infra_error``) is never paid: the rollout ends there as
verifiers' infrastructure failure (``vf.InfraError`` in ``state["error"]``, retried under ``max_retries``), and its
reward is NaN. The env is closed when the rollout ends, errs or is cancelled. Needs the ``[verifiers]`` extra
(docs/verifiers.md).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import verifiers as vf
from datasets import Dataset
from verifiers.utils.message_utils import normalize_messages

from ..backends.protocol import EVALUATION_STATUS_KEY, EVALUATIONS_KEY, INFRA_ERROR
from ..components.tool_calling import (
    ToolCall,
    follow_up_roles,
    parser_tools,
    response_text,
    structured_messages,
)
from ..errors import BackendUnavailable
from ..policies.base import fenced
from ..policies.openai import EXIT_CONTEXT_THOUGHT, EXIT_COST_THOUGHT
from ..transforms.history import as_dicts
from .gymnasium import MLGymRegistryEnv

ENV_ID = "mlgym_registry.faces.verifiers"
"""The id verifiers loads this face by: ``vf.load_environment`` and ``vf-eval`` import the module of that name and
call its ``load_environment``."""

DEFAULT_EPISODES = 100
"""Rows of the dataset: episode ``k`` plays seed ``seed + k``."""

STATE_KEY = "mlgym"
"""Where a rollout's state and its output's ``info`` hold the episode's outcome (``state_columns=["mlgym"]`` too)."""

RUNNER_KEY = "mlgym_episode"
"""Where a rollout's state holds its ``Episode`` (not serializable: never a state column)."""

EXITS = {
    "prompt_too_long": fenced(EXIT_CONTEXT_THOUGHT, "exit_context"),
    "max_total_completion_tokens_reached": fenced(EXIT_COST_THOUGHT, "exit_cost"),
}
"""verifiers' stop conditions that are MLGym's made-up exits, and the answer that sends each (the ``openai`` policy's):
the env autosubmits, evaluates and pays the workspace as MLGym does when the context or the budget runs out."""

STEP_FACTS = ("action", "format_error", "exit_status", EVALUATION_STATUS_KEY)
"""What of a step's ``info`` each trajectory step keeps in ``extras["mlgym"]``, beside its ``reward``."""

class Episode:
    """One rollout's env, driven on a thread of its own: the event loop never waits on the sandbox, and the env's
    calls never overlap, so a ``close`` queued behind a running step (after a cancellation) runs when the step ends.

    ``outcome`` is the JSON-safe summary the rollout reports (reward, statuses, counts), kept up to date each step.
    """

    def __init__(self, task: str, options: Mapping[str, Any], seed: int | None):
        self.task, self.options, self.seed = task, dict(options), seed
        self.env: MLGymRegistryEnv | None = None
        self.conversation: list[dict[str, Any]] | None = None
        """The env's whole conversation, kept when the episode ends (for ``render_completion``)."""
        self.exited = False
        """Whether the face sent one of ``EXITS`` itself."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlgym-verifiers")
        self.outcome: dict[str, Any] = {
            "task": task, "seed": seed, "reward": 0.0, "steps": 0, "format_errors": 0, "exit_status": "",
            EVALUATIONS_KEY: [], "score": [], "submission": None, "infra_error": False, "terminated": False,
            "truncated": False,
        }

    @property
    def done(self) -> bool:
        return self.outcome["terminated"] or self.outcome["truncated"]

    @property
    def shows_a_view(self) -> bool:
        """Whether a history processor shows the policy less than the whole conversation."""
        return self.env is not None and self.env.base.task.spec.history != "full"

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on the episode's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def start(self) -> list[dict[str, Any]]:
        """Build the env and reset it; the messages it starts with (on the episode's thread)."""
        self.env = MLGymRegistryEnv(self.task, **self.options)
        self.env.reset(seed=self.seed)
        return structured_messages(self.env.messages, json_arguments=True)

    def step(self, answer: str) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
        """Step ``answer``; its reward, its facts and the messages that answer it (on the episode's thread)."""
        assert self.env is not None
        _, reward, terminated, truncated, info = self.env.step(answer)
        self._record(reward, terminated, truncated, info)
        facts = {key: info.get(key) for key in STEP_FACTS}
        return reward, facts, self._answer_to(answer)

    def _answer_to(self, answer: str) -> list[dict[str, Any]]:
        """The messages the env answered ``answer`` with, from the tail of its history: converting the whole
        conversation would cost a step time that grows with the episode."""
        assert self.env is not None
        history = self.env.history
        tail = as_dicts(history[..., -(len(follow_up_roles(self.env.base.task.parser, answer)) + 1):])
        if not any(message["role"] == "assistant" for message in tail):
            tail = as_dicts(history)
        return follow_ups(tail)

    def view(self) -> list[dict[str, Any]]:
        """What the env's history processor shows the policy now (on the episode's thread)."""
        assert self.env is not None
        return structured_messages(self.env.messages, json_arguments=True)

    def finish(self) -> None:
        """Keep the whole conversation where the completion needs it, then close the env (on the episode's thread)."""
        if self.env is None:
            return
        try:
            if (self.exited or self.shows_a_view) and self.env.history is not None:
                self.conversation = structured_messages(as_dicts(self.env.history), json_arguments=True)
        finally:
            self.env.close()

    async def close(self) -> None:
        """Close the env once every call queued before has run; the close runs even if this await is cancelled."""
        closing = asyncio.get_running_loop().run_in_executor(self._executor, self.finish)
        self._executor.shutdown(wait=False)
        await closing

    def _record(self, reward: float, terminated: bool, truncated: bool, info: Mapping[str, Any]) -> None:
        outcome = self.outcome
        outcome["reward"] += reward
        outcome["steps"] += 1
        outcome["format_errors"] += int(bool(info.get("format_error")))
        outcome["exit_status"] = info.get("exit_status") or ""
        outcome[EVALUATIONS_KEY] = list(info.get(EVALUATIONS_KEY) or [])
        outcome["score"] = jsonable(info.get("score") or [])
        outcome["submission"] = jsonable(info.get("submission"))
        outcome["infra_error"] = "infra_error" in outcome[EVALUATIONS_KEY]
        outcome["terminated"], outcome["truncated"] = terminated, truncated


def follow_ups(conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages after the last assistant turn, structured as chat APIs take them (``tool`` messages carry the id
    of the call they answer)."""
    last = max((i for i, m in enumerate(conversation) if m["role"] == "assistant"), default=-1)
    return structured_messages(conversation[max(last, 0):], json_arguments=True)[1 if last >= 0 else 0:]


def reply_text(message: Any) -> str:
    """A model's reply as the env reads an answer: its text, then its tool calls in their text form."""
    content = message.content
    if isinstance(content, list):
        content = "".join(getattr(part, "text", None) or (part.get("text", "") if isinstance(part, dict) else "")
                          for part in content)
    calls = [ToolCall(call.name, call.arguments, call.id) for call in (message.tool_calls or [])]
    return response_text(content, calls) if calls else (content or "")


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON holds it, for results files: non-finite floats and objects JSON lacks as strings."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)


def mlgym_reward(state: vf.State) -> float:
    """The rollout's reward: the sum of the env's rewards over its steps; NaN (never paid) when an evaluation of the
    episode was an ``infra_error``."""
    outcome = state.get(STATE_KEY, {})
    return math.nan if outcome.get("infra_error") else float(outcome.get("reward", 0.0))


def infra_error(state: vf.State) -> float:
    """1.0 when an evaluation of the episode failed for reasons not the agent's (the env paid it 0): leave it out."""
    return float(bool(state.get(STATE_KEY, {}).get("infra_error")))


def format_errors(state: vf.State) -> float:
    """How many replies held no usable command."""
    return float(state.get(STATE_KEY, {}).get("format_errors", 0))


class MLGymRubric(vf.Rubric):
    """The env's reward (``mlgym_reward``, weight 1) and two metrics: ``infra_error`` and ``format_errors``."""

    def __init__(self, **kwargs: Any):
        super().__init__(funcs=[mlgym_reward], weights=[1.0], **kwargs)
        self.add_metric(infra_error)
        self.add_metric(format_errors)


class MLGymEnv(vf.MultiTurnEnv):
    """A task of the registry as a verifiers multi-turn environment; ``load_environment`` builds it.

    Each dataset row is an episode (``info["mlgym"]`` names its task and seed); each rollout plays it on an env of
    its own. ``max_turns`` stays verifiers' ``-1``: the env ends its episodes itself (``max_steps``, and its own
    ``max_turns`` among ``options``).
    """

    def __init__(self, task: str, options: Mapping[str, Any], *, episodes: int, seed: int | None,
                 tool_defs: list[dict[str, Any]] | None, env_args: dict[str, Any], **kwargs: Any):
        # prefixed: verifiers' own classes speak of tasks and seeds of their own
        self.mlgym_task, self.mlgym_options, self.mlgym_seed = task, dict(options), seed
        rows = _Rows(task, options, episodes, seed)
        super().__init__(dataset=rows, eval_dataset=rows, rubric=MLGymRubric(), tool_defs=tool_defs,
                         env_id=ENV_ID, env_args=env_args, max_turns=-1, **kwargs)

    # -- the rollout -------------------------------------------------------------------------------------------
    async def setup_state(self, state: vf.State) -> vf.State:
        """Start the rollout's env; its first messages become the prompt."""
        row = (state.get("info") or {}).get(STATE_KEY) or {}
        episode = Episode(str(row.get("task", self.mlgym_task)), self.mlgym_options, row.get("seed", self.mlgym_seed))
        state[RUNNER_KEY], state[STATE_KEY] = episode, episode.outcome
        try:
            state["prompt"] = normalize_messages(await episode.run(episode.start), field_name="prompt")
        except Exception as exc:
            raise env_error(exc, "starting") from exc
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        """Step the model's last reply through the env; the messages the env answers it with."""
        episode: Episode = state[RUNNER_KEY]
        try:
            reward, facts, answer = await episode.run(episode.step, reply_text(messages[-1]))
        except Exception as exc:
            raise env_error(exc, "stepping") from exc
        turn = state["trajectory"][-1]
        turn["reward"] = reward  # NaN for an infra_error step (the Gymnasium face's: never paid)
        turn["extras"][STATE_KEY] = {"reward": reward, **facts}
        response = normalize_messages(answer, field_name="env_response")
        unpaid = facts[EVALUATION_STATUS_KEY] == INFRA_ERROR
        if unpaid:  # the episode's outcome is no longer the agent's: end it as the machine's failure, unpaid
            state["error"] = infra_failure(facts)
        if episode.done or unpaid:
            state["final_env_response"] = response
        return response

    async def get_prompt_messages(self, state: vf.State) -> vf.Messages:
        """verifiers' whole conversation, or what the env's history processor shows when it has one."""
        messages = await super().get_prompt_messages(state)
        episode: Episode | None = state.get(RUNNER_KEY)
        if episode is None or not state["trajectory"] or episode.done or not episode.shows_a_view:
            return messages
        return normalize_messages(await episode.run(episode.view), field_name="prompt")

    async def render_completion(self, state: vf.State) -> None:
        """verifiers' own rendering, unless the env's conversation differs from it (a history processor's view, an
        exit the face sent): then the env's whole conversation after the prompt."""
        episode: Episode | None = state.get(RUNNER_KEY)
        if episode is None or episode.conversation is None or not (episode.exited or episode.shows_a_view):
            await super().render_completion(state)
            return
        state["completion"] = normalize_messages(episode.conversation[len(state["prompt"]):], field_name="completion")

    @vf.stop(priority=50)
    async def episode_terminated(self, state: vf.State) -> bool:
        """The env ended the episode (submit, skip, forfeit, an ``exit_*``)."""
        return bool(state.get(STATE_KEY, {}).get("terminated"))

    @vf.stop(priority=50)
    async def episode_truncated(self, state: vf.State) -> bool:
        """The env's steps or turns ran out (the max-steps autosubmission is evaluated and paid)."""
        return bool(state.get(STATE_KEY, {}).get("truncated"))

    @vf.cleanup(priority=150)
    async def end_episode(self, state: vf.State) -> None:
        """Send MLGym's exit when verifiers stopped for the context or the budget, then close the env, whatever
        happened (an error, a timeout, a cancellation); the outcome goes into ``info["mlgym"]``. Runs before
        verifiers renders the completion."""
        episode: Episode | None = state.get(RUNNER_KEY)
        if episode is None:
            return
        try:
            exit_answer = EXITS.get(state.get("stop_condition") or "")
            if exit_answer and episode.env is not None and not episode.done and state.get("error") is None:
                await self._send_exit(episode, exit_answer, state)
        finally:
            await episode.close()
            info = state.get("info")
            if isinstance(info, dict):
                info[STATE_KEY] = {**(info.get(STATE_KEY) or {}), **episode.outcome}

    async def _send_exit(self, episode: Episode, answer: str, state: vf.State) -> None:
        try:
            reward, facts, response = await episode.run(episode.step, answer)
        except Exception as exc:
            state["error"] = env_error(exc, "exiting")
            return
        episode.exited = True
        if facts[EVALUATION_STATUS_KEY] == INFRA_ERROR:
            state["error"] = infra_failure(facts)
        state["final_env_response"] = normalize_messages(response, field_name="final_env_response")


class _Rows:
    """The dataset, built when verifiers first asks for it: one row per episode, its prompt the env's own first
    messages (the same for every seed: a seed never reaches the agent), from one reset."""

    def __init__(self, task: str, options: Mapping[str, Any], episodes: int, seed: int | None):
        self.task, self.options, self.episodes, self.seed = task, dict(options), episodes, seed
        self._built: Dataset | None = None

    def __call__(self) -> Dataset:
        """The rows (built once: the train and the eval dataset are the same)."""
        if self._built is None:
            env = MLGymRegistryEnv(self.task, **self.options)
            try:
                env.reset(seed=self.seed)
                prompt = structured_messages(env.messages, json_arguments=True)
            finally:
                env.close()
            self._built = Dataset.from_list([
                {"prompt": prompt, "answer": "", "example_id": k,
                 "info": {STATE_KEY: {"task": self.task, "seed": None if self.seed is None else self.seed + k}}}
                for k in range(self.episodes)])
        return self._built


def env_error(exc: BaseException, doing: str) -> vf.Error:
    """A failure of the env as verifiers records it in ``state["error"]``: a sandbox or backend that could not run
    is a ``vf.SandboxError`` (an infrastructure error, retried under ``max_retries``), anything else a ``vf.Error``."""
    message = f"mlgym-registry env failed {doing} the episode: {type(exc).__name__}: {exc}"
    if isinstance(exc, (BackendUnavailable, OSError, TimeoutError)):
        return vf.SandboxError(message)
    return vf.Error(message)


def infra_failure(facts: Mapping[str, Any]) -> vf.InfraError:
    """The error a rollout ends with when a step's evaluation was an ``infra_error`` (``facts``: the step's
    ``STEP_FACTS``): verifiers' infrastructure failure, retried under ``max_retries``."""
    return vf.InfraError("an evaluation of the episode failed for a reason that is not the agent's (infra_error, "
                         f"never paid) on {facts.get('action') or 'a step'!r}")


def tool_definitions(parser: Any) -> list[dict[str, Any]] | None:
    """A tool-calling parser's tools as verifiers declares them (``name``, ``description``, ``parameters``)."""
    tools = parser_tools(parser) if getattr(parser, "native_tools", False) else None
    if not tools:
        return None
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "parameters": t["function"].get("parameters", {"type": "object", "properties": {}})} for t in tools]


def load_environment(task: str = "prisonersDilemma", episodes: int = DEFAULT_EPISODES, seed: int | None = 0,
                     **options: Any) -> MLGymEnv:
    """A verifiers environment playing ``task``; ``options`` are ``registry.make``'s (``max_steps``, ``parser``,
    ``template``, ``reward``, ``history``, backend options ...), checked here.

    ``episodes`` rows, episode ``k`` seeded ``seed + k`` (the rollouts of one row share its seed, so a group plays the
    same evaluation seeds; ``seed=None``: unseeded). Call it on the main thread: verifiers' ``Environment`` installs
    its own SIGINT and SIGTERM handlers.
    """
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise ValueError(f"episodes must be an integer >= 1, got {episodes!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    probe = MLGymRegistryEnv(task, **options)  # refuses unknown options now, not in every rollout
    try:
        tools = tool_definitions(probe.base.task.parser)
    finally:
        probe.close()
    env_args = {"task": task, "episodes": episodes, "seed": seed, **{k: _arg(v) for k, v in options.items()}}
    return MLGymEnv(task, options, episodes=episodes, seed=seed, tool_defs=tools, env_args=env_args)


def _arg(value: Any) -> Any:
    """An option as the results' metadata records it (JSON, else its repr)."""
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return repr(value)


__all__ = ["ENV_ID", "Episode", "MLGymEnv", "MLGymRubric", "load_environment"]
