"""The TRL face: ``GRPOTrainer(environment_factory=environment_factory("prisonersDilemma"))``.

TRL 1.13's ``environment_factory`` contract, and how it is met here:

- TRL calls the factory with no arguments, once to probe and then whenever a batch needs one more instance; it
  pools the instances and starts each rollout with ``reset(**row)`` (every column of the dataset row). The factory
  is a class; each instance lazily builds, on its first reset, the env ``registry.make`` builds (through
  ``gymnasium.MLGymRegistryEnv``, as the OpenEnv face does: the same task spec, components, local sandboxed backend,
  rewards and seeding) and keeps it for every later episode.
- ``reset`` returns the text TRL appends to the row's last user message: the task's system message (it states the
  reply format), a line on the tool, and the task's first user message. So any dataset works, and
  ``dataset()`` makes one of empty user prompts and episode seeds.
- Every public method other than ``reset`` and ``get_reward`` is a tool: the only one is ``act(response)``, whose
  argument is the model's whole reply (a discussion and one fenced command), which the task's own parser and isolator
  take apart exactly as in the chain (format errors included). After the episode has ended, ``act`` says so and runs
  nothing.
- ``get_reward()`` is the sum of the chain's rewards over the episode's steps (the reward assigner's, plus
  ``reward_wrong_format`` when set). TRL calls it once the rollout is over; an episode still running then (the model
  replied without a tool call, or ran into ``max_tool_calling_iterations`` or ``max_completion_length``) ends there
  as the agent's forfeit, sent through the task's parser and paid as the chain pays a forfeit (the floor under the
  default rewards): stopping early never pays more than trying. An episode with an evaluation that failed for a
  reason not the agent's (``infra_error``) is never paid: ``get_reward`` returns None, which TRL takes as "no reward
  for this rollout" (an unscorable rollout: left out of its group's baseline, advantage 0).
- TRL never closes its envs: each instance's sandbox is released by a ``weakref.finalize`` when the instance is
  garbage-collected or the interpreter exits.

With ``url=``, an instance plays one session of a served task (``mlgym-registry serve``) over ``client.connect``
instead, with the same messages and rewards; the finalizer closes the session. See docs/trl.md.
"""

from __future__ import annotations

import math
import re
import weakref
from typing import Any

from ..backends.protocol import EVALUATION_STATUS_KEY, INFRA_ERROR
from ..errors import MLGymRegistryError

TOOL_NOTE = ("Send each reply, written as described above, as the `response` argument of the `act` tool; "
             "what it returns is the next message.")
"""The line between the system message and the first user message in what ``reset`` returns."""

EPISODE_OVER = ("The episode is over ({status}); act() runs nothing more. Stop calling tools and end your reply.")
"""What ``act`` returns once the episode has ended."""


def _release(holder: dict[str, Any]) -> None:
    """Close the env in ``holder`` (a finalizer's callback: it holds no reference to the instance)."""
    env = holder.pop("env", None)
    if env is not None:
        env.close()


class _ServedEnv:
    """A served task (``mlgym-registry serve``, docs/serving.md) behind the few calls of ``MLGymRegistryEnv`` that
    ``MLGymTRLEnv`` makes: one OpenEnv session over ``client.connect``, opened at the first reset."""

    def __init__(self, task: Any, url: str, **connect_options: Any):
        from ..client import connect

        self.task = task
        self.url = url
        self.client = connect(url, **connect_options)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        try:
            result = self.client.reset(task=self.task, seed=seed)
        except RuntimeError as exc:
            if "CAPACITY_REACHED" not in str(exc):
                raise
            raise MLGymRegistryError(
                f"the server at {self.url} holds no session more for this rollout ({exc}): TRL keeps one instance, "
                "and so one session, per rollout running at once (per_device_train_batch_size); start the server "
                "with at least that many --max-sessions (mlgym-registry serve TASK --max-sessions N)") from exc
        return result.observation.message, {"system": result.observation.metadata.get("system", "")}

    def step(self, response: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        from ..client import MlgymAction

        result = self.client.step(MlgymAction(response=response))
        meta = result.observation.metadata or {}
        truncated = bool(meta.get("truncated"))
        terminated = bool(meta.get("terminated", result.done and not truncated))
        reward = math.nan if result.reward is None else float(result.reward)  # None: the server paid nothing
        return result.observation.message, reward, terminated, truncated, meta

    def close(self) -> None:
        self.client.close()


class MLGymTRLEnv:
    """One rollout's environment for TRL's ``GRPOTrainer(environment_factory=...)``; ``environment_factory`` makes
    the subclass of a task. Public: ``reset``, ``act`` (the tool), ``get_reward`` and the read-only ``done``,
    ``exit_status``, ``infra_error``, ``steps`` and ``rewards``."""

    task: Any = None
    """The task, as ``registry.make`` takes it (set by ``environment_factory``)."""

    options: dict[str, Any] = {}  # noqa: RUF012 - set per subclass by environment_factory, never mutated
    """``registry.make``'s keyword arguments, or ``connect``'s with ``url`` (set by ``environment_factory``)."""

    url: str | None = None
    """A server to play the task on (``mlgym-registry serve``); None: in process."""

    def __init__(self) -> None:
        self._holder: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, _release, self._holder)
        self._started = False
        self._done = False
        self._exit_status = ""
        self._rewards: list[float] = []
        self._infra_error = False
        self._forfeit: str | None = None  # the forfeit reply in the parser's format, made at the first forfeit

    # -- TRL's contract ---------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: Any = None, **row: Any) -> str:
        """Start an episode (``seed`` from the dataset row, if any, starts the seed's stream); returns the system
        message, the tool note and the task's first user message, for TRL to append to the row's prompt."""
        if task is not None and task != self.task:
            raise MLGymRegistryError(f"this environment plays {self.task!r}; the row asks for task {task!r} (use a "
                                     "dict of environment_factory(...) per task and an `environment` column)")
        env = self._env()
        first, info = env.reset(seed=None if seed is None else int(seed))
        self._started, self._done, self._exit_status, self._rewards = True, False, "", []
        self._infra_error = False
        return "\n\n".join(part for part in (info["system"].strip(), TOOL_NOTE, first) if part)

    def act(self, response: str) -> str:
        """Send one reply to the task: a short discussion, then exactly one command in a fenced code block.

        Args:
            response: Your whole reply, for example "DISCUSSION\\nFirst look around.\\n```\\nls\\n```". The task's
                parser takes the command from it; a reply without one runs nothing and says how to answer.

        Returns:
            The next message (the command's output and the workspace's state, or a format error), or "episode is over".
        """
        if not self._started:
            raise MLGymRegistryError("act() before reset()")
        if self._done:
            return EPISODE_OVER.format(status=self._exit_status or "ended")
        message, reward, terminated, truncated, info = self._env().step(str(response))
        self._rewards.append(float(reward))
        self._infra_error = self._infra_error or info.get(EVALUATION_STATUS_KEY) == INFRA_ERROR
        self._done = bool(terminated or truncated)
        self._exit_status = info.get("exit_status") or ("truncated" if truncated else "")
        return message

    def get_reward(self) -> float | None:
        """The episode's reward: the sum of the chain's rewards over its steps (0.0 before any reset). An episode
        still running is over for TRL: it ends here as the agent's forfeit, paid as the chain pays one. None for an
        episode with an ``infra_error`` evaluation: its outcome is not the agent's, and TRL leaves it out."""
        if self._started and not self._done:
            self.act(self._forfeit_reply())
        if self._infra_error:
            return None
        return float(sum(self._rewards))

    # -- read-only state (properties are no tools) ------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Whether the episode has ended (submit, autosubmission, forfeit, truncation)."""
        return self._done

    @property
    def exit_status(self) -> str:
        """The backend's ``exit_status`` of the episode's end (``""`` while it runs)."""
        return self._exit_status

    @property
    def infra_error(self) -> bool:
        """Whether an evaluation of the episode failed for a reason not the agent's (``get_reward`` is then None)."""
        return self._infra_error

    @property
    def steps(self) -> int:
        """How many replies ``act`` has sent this episode."""
        return len(self._rewards)

    @property
    def rewards(self) -> list[float]:
        """The chain's reward of each step so far (NaN for an ``infra_error`` step: never paid)."""
        return list(self._rewards)

    # -- private ----------------------------------------------------------------------------------------------
    def _env(self) -> Any:
        env = self._holder.get("env")
        if env is None:
            if not self._finalizer.alive:
                raise MLGymRegistryError("this environment was closed")
            if self.url is not None:
                env = self._holder["env"] = _ServedEnv(self.task, self.url, **self.options)
            else:
                from .gymnasium import MLGymRegistryEnv

                env = self._holder["env"] = MLGymRegistryEnv(self.task, **self.options)
        return env

    def _forfeit_reply(self) -> str:
        """A reply asking for ``exit_forfeit`` in the format of the task's parser (the scripted policy's way): the
        parser ``registry.make`` resolves for this task and options; a served task's as this registry knows it."""
        if self._forfeit is not None:
            return self._forfeit
        from ..policies.scripted import in_format
        from ..registry import registry

        try:
            resolved, _ = registry.resolve(self.task, **({} if self.url is not None else self.options))
            parser = resolved.parser
        except MLGymRegistryError:  # a served task this registry does not know: MLGym's fenced format
            parser = None
        self._forfeit = in_format(parser, "The rollout is over; I stop here.", "exit_forfeit")
        return self._forfeit

    def _close(self) -> None:
        """Release the sandbox now (TRL never calls it; the finalizer does the same at garbage collection)."""
        self._finalizer()


def environment_factory(task: Any = "prisonersDilemma", *, url: str | None = None,
                        **options: Any) -> type[MLGymTRLEnv]:
    """The class TRL's ``GRPOTrainer(environment_factory=...)`` calls to get one environment per rollout.

    Args:
        task: a task name (as ``registry.make`` takes it), a ``TaskSpec`` or its ``to_dict()``; with ``url``, the
            name the server serves it by.
        url: a server's address (``http://host:port``, ``mlgym-registry serve``): each instance plays one session
            there; None (the default) plays the task in process.
        **options: ``registry.make``'s keyword arguments (``max_steps=``, ``reward=``, backend options, ...), or
            with ``url`` those of ``client.connect`` (``token_env=``, ...), passed on when an instance builds its
            env (at its first reset).

    Returns:
        A subclass of ``MLGymTRLEnv`` named after the task (TRL logs ``get_reward`` under the class name).
    """
    if url is None:
        from ..registry import registry

        label = registry.spec(task).id
    else:
        label = str(task)
    name = "mlgym_" + re.sub(r"\W", "_", label)
    return type(name, (MLGymTRLEnv,), {"task": task, "url": url, "options": dict(options), "__module__": __name__,
                                        "__doc__": f"{MLGymTRLEnv.__doc__}\n\nTask: {label}."})


def dataset(num_rows: int = 64, seed: int = 0) -> Any:
    """A ``datasets.Dataset`` for ``GRPOTrainer``: ``num_rows`` rows of an empty user prompt (``reset`` supplies the
    text) and ``seed`` (``seed``, ``seed + 1``, ...): the rollouts of a row share their episode's seed."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}] for _ in range(num_rows)],
                              "seed": list(range(seed, seed + num_rows))})
