"""``BackendEnv``: the TorchRL env at the bottom of the chain, stepping an MLGym-contract backend with text actions."""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, NonTensor, Unbounded
from torchrl.envs import EnvBase

from .. import seeding
from ..backends.protocol import (
    EVALUATION_OK,
    EVALUATION_STATUS_KEY,
    EVALUATIONS_KEY,
    INFRA_ERROR,
    Backend,
    ToolSet,
    infer_evaluation_status,
    new_info,
)
from ..scores import STOP_REASON_KEY
from ..specs import ResolvedTask
from .episode_rules import MAX_FORMAT_ERRORS
from .layout import Layout, set_spec

INFRA_ERROR_KEY = "infra_error"
"""The tensordict flag (shape ``(1,)``, beside ``done``) set on a step whose evaluation failed for a reason that is
not the agent's: its reward is 0 and is no outcome of the agent's; mask it out of training. ``evaluation_status``
beside it says how the step's evaluation ended (``""`` when it evaluated nothing)."""

EVALUATION_ERROR_KEY = "evaluation_error"
"""The ``info`` key that says why the env counted a step's scored evaluation as an ``infra_error`` (its metrics do
not hold the metric the task is rewarded on: the task's metric names do not match its evaluator's)."""

MAX_STEPS_EXIT = "autosubmission (max_steps)"
"""MLGym's ``exit_status`` when the episode ran out of steps."""



def task_fields(backend: Backend) -> dict[str, Any]:
    """The task fields templates are formatted with: ``backend.task.args`` as a dict."""
    args = getattr(getattr(backend, "task", None), "args", None)
    if args is None:
        return {}
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return dataclasses.asdict(args)
    if isinstance(args, dict):
        return dict(args)
    return dict(vars(args))


def _close_quietly(holder: list) -> None:
    backend = holder[0] if holder else None
    holder.clear()
    if backend is not None:
        backend.close()


class BackendEnv(EnvBase):
    """Steps a backend (``backends/protocol.py``) with the isolated action; the transforms do everything else.

    - ``reset`` resets the backend (swapping to the sampled task's backend when the task sampler wrote ``task``) and
      returns an empty ``observation``.
    - ``step`` hands the backend the action the isolator wrote, unless the isolator flagged ``retry``: then the
      backend is not stepped at all (retry skip, stage 1 of the chain) and the observation stays empty.
    - ``last_info`` is the ``info`` of the last step (None only after a reset), so the reward stage reads the score
      of that very step: the backend's, or on a skipped step the episode's as it stood (its scores so far,
      ``exit_status`` and ``evaluation_status`` empty: nothing ran).
    - Every episode ends: the action isolator turns the ``max_format_errors``-th format error in a row into MLGym's
      ``exit_format`` action (the backend autosubmits), and the ``max_turns``-th turn, format errors included,
      ends the episode as truncated when nothing else has (``stop_reason`` says so, and so does
      ``last_info["stop_reason"]``, for the reward).

    The backend is made on the first reset and closed by ``close()`` and when the env is garbage-collected.
    """

    batch_locked = True

    def __init__(
        self,
        tasks: Sequence[ResolvedTask],
        layout: Layout,
        *,
        device: torch.device | str | None = None,
        max_format_errors: int | None = MAX_FORMAT_ERRORS,
        max_turns: int | None = None,
    ):
        if not tasks:
            raise ValueError("BackendEnv needs at least one resolved task")
        super().__init__(device=device, batch_size=torch.Size(()))
        self.layout = layout
        self.tasks: dict[str, ResolvedTask] = {}
        for item in tasks:
            if item.spec.id in self.tasks:
                raise ValueError(f"task {item.spec.id!r} was given twice")
            self.tasks[item.spec.id] = item
        self.task_name: str = next(iter(self.tasks))
        self.tools: ToolSet | None = None
        self.fields: dict[str, Any] | None = None
        self.last_info: dict[str, Any] | None = None
        self.last_observation = ""
        """The observation of the last backend step (what the episode loop records when a component fails after it)."""
        self.task_rng = np.random.default_rng()
        self.max_format_errors = max_format_errors
        self._max_turns = max_turns
        self.format_errors = 0
        """Format errors in a row so far (the action isolator counts them)."""
        self.turns = 0
        """Turns of the current episode so far, format errors included."""
        self.stop_reason: str | None = None
        """Why the env (not the backend) ended the episode: ``"max_turns"``, else None."""
        self.evaluations: list[str] = []
        """The status of each evaluation of the current episode (``backends.protocol.EVALUATION_STATUSES``)."""
        self.ended: str | None = None
        """How and when the current episode ended (a further step raises ``EnvMisuseError``), or None."""
        self._scores_seen = 0
        self._seed: int | None = None
        self._stream: tuple[int, int] | None = None
        """``(seed, episode)``: the episode the last reset played of the stream ``set_seed(seed)`` started."""
        self._backend_in_stream = False
        """Whether the current backend was reset within ``_stream`` (a backend swapped in mid-stream was not)."""
        self._backend_holder: list = []
        self._finalizer = weakref.finalize(self, _close_quietly, self._backend_holder)
        self._make_specs()

    # -- specs ---------------------------------------------------------------------------------------------------
    def _make_specs(self) -> None:
        device = self.device
        text = NonTensor(example_data="a string", shape=(), device=device)
        action_spec = Composite(shape=(), device=device)
        set_spec(action_spec, self.layout.response, text.clone())
        self.full_action_spec = action_spec
        observation_spec = Composite(shape=(), device=device)
        set_spec(observation_spec, self.layout.observation, text.clone())
        observation_spec[EVALUATION_STATUS_KEY] = NonTensor(example_data="ok", shape=(), device=device)
        observation_spec[INFRA_ERROR_KEY] = Categorical(2, shape=(1,), dtype=torch.bool, device=device)
        self.full_observation_spec = observation_spec
        self.full_reward_spec = Composite(
            {self.layout.reward: Unbounded(shape=self.layout.reward_shape, dtype=torch.float32, device=device)},
            shape=(),
            device=device,
        )
        flag = Categorical(2, shape=(1,), dtype=torch.bool, device=device)
        self.full_done_spec = Composite(
            done=flag.clone(), terminated=flag.clone(), truncated=flag.clone(), shape=(), device=device
        )

    # -- the current task and backend ----------------------------------------------------------------------------
    @property
    def task(self) -> ResolvedTask:
        """The resolved task the env currently runs."""
        return self.tasks[self.task_name]

    @property
    def backend(self) -> Backend:
        """The current backend (made on first use)."""
        if not self._backend_holder:
            try:
                backend = self.task.make_backend()
            except AttributeError as exc:
                # inside a property, an AttributeError would surface as "BackendEnv has no attribute 'backend'"
                raise RuntimeError(f"making the {self.task.spec.backend!r} backend failed: {exc!r}") from exc
            self._backend_holder.append(backend)
        return self._backend_holder[0]

    @property
    def max_turns(self) -> int:
        """The cap on an episode's turns: the ``max_turns`` option, else one more than the most turns the episode
        can take when every backend step follows the most format errors the env lets pass."""
        if self._max_turns is not None:
            return self._max_turns
        per_step = self.max_format_errors or MAX_FORMAT_ERRORS + 1
        return per_step * (self.task.spec.max_steps + 1) + 1

    @property
    def has_backend(self) -> bool:
        """True once a backend has been made (and not closed)."""
        return bool(self._backend_holder)

    @property
    def is_closed(self) -> bool:
        """True exactly when nothing of the env is running: before the first reset, and after ``close()``.

        TorchRL's collectors and pools call ``close()`` only on an env that is not closed, so this turns False as
        soon as a backend (a sandbox, a container) exists; ``EnvBase`` sets a flag instead, True from construction,
        which made ``collector.shutdown()`` leave every sandbox running.
        """
        return not self.__dict__.get("_backend_holder")  # read during EnvBase.__init__, before the holder exists

    @is_closed.setter
    def is_closed(self, value: bool) -> None:
        """``EnvBase`` and ``TransformedEnv`` write the flag; whether a backend exists decides it, so writes are
        ignored (``close()`` releases the backend itself)."""

    def switch_task(self, name: str) -> None:
        """Run ``name`` from the next reset on, closing the previous task's backend."""
        if name not in self.tasks:
            raise KeyError(f"task {name!r} is not one of this env's tasks: {', '.join(self.tasks)}")
        if name != self.task_name:
            _close_quietly(self._backend_holder)
            self._backend_in_stream = False
            self.task_name = name
            self.tools = None

    # -- EnvBase -------------------------------------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        if tensordict is not None and self.layout.task in tensordict.keys(include_nested=True):
            self.switch_task(str(tensordict[self.layout.task]))
        # Gymnasium's seeding: set_seed(s) starts a stream, later resets continue it (the backend counts the episodes);
        # a backend swapped in mid-stream starts from a seed derived from the stream's seed and episode
        seed, self._seed = self._seed, None
        if seed is not None:
            self._stream = (seed, 0)
        elif self._stream is not None:
            self._stream = (self._stream[0], self._stream[1] + 1)
            if not self._backend_in_stream:
                seed = seeding.stream_seed(*self._stream)
        self.backend.reset(seed=seed)
        self._backend_in_stream = self._stream is not None
        self.last_info = None
        self.format_errors = 0
        self.turns = 0
        self.stop_reason = None
        self.evaluations = []
        self._scores_seen = 0
        self.ended = None
        out = TensorDict(batch_size=(), device=self.device)
        out.set(self.layout.observation, "")
        out.set(EVALUATION_STATUS_KEY, "")
        out.set(INFRA_ERROR_KEY, torch.tensor([False], device=self.device))
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.ended is not None:
            from ..errors import EnvMisuseError

            raise EnvMisuseError(
                f"the episode already ended ({self.ended}); call env.reset() before stepping again (TorchRL's "
                "rollout() and collectors reset a finished env for you)"
            )
        retry = bool(tensordict.get(self.layout.retry, False))
        out = TensorDict(batch_size=(), device=self.device)
        done = False
        reward = 0.0
        if retry:
            observation = self.last_observation = ""
            self.last_info = self._info_without_step()
        else:
            action = tensordict[self.layout.action]
            observation, reward, done, info = self.backend.step(str(action))
            self.last_info = dict(info) if info is not None else new_info()
            observation = "" if observation is None else str(observation)
            self.last_observation = observation
            self._record_evaluation(observation, self.last_info)
        status = (self.last_info or {}).get(EVALUATION_STATUS_KEY, "")
        out.set(EVALUATION_STATUS_KEY, status)
        out.set(INFRA_ERROR_KEY, torch.tensor([status == INFRA_ERROR], device=self.device))
        out.set(self.layout.observation, observation)
        out.set(self.layout.reward, torch.full(self.layout.reward_shape, float(reward or 0.0), device=self.device))
        # running out of steps (MLGym autosubmits) is a truncation; any other end (submit, exit_*) terminates
        truncated = bool(done) and (self.last_info or {}).get("exit_status") == MAX_STEPS_EXIT
        self.turns += 1
        if not done and self.turns >= self.max_turns:
            done = truncated = True
            self.stop_reason = "max_turns"
            self.last_info[STOP_REASON_KEY] = self.stop_reason
        if done:
            ended = (self.last_info or {}).get("exit_status") or self.stop_reason or "the backend reported done"
            self.ended = f"{ended}, after {self.turns} turns"
        out.set("done", torch.tensor([bool(done)], device=self.device))
        out.set("terminated", torch.tensor([bool(done) and not truncated], device=self.device))
        out.set("truncated", torch.tensor([truncated], device=self.device))
        return out

    def _info_without_step(self) -> dict[str, Any]:
        """The ``info`` of a step the backend never saw (a reply without a usable command): the episode's as it
        stands, nothing evaluated on it."""
        info = dict(self.last_info) if self.last_info is not None else new_info()
        info["score"] = list(info.get("score") or [])
        info.pop(EVALUATION_ERROR_KEY, None)
        info.update({"exit_status": "", EVALUATION_STATUS_KEY: "", EVALUATIONS_KEY: list(self.evaluations)})
        return info

    def _record_evaluation(self, observation: str, info: dict[str, Any]) -> None:
        """Give ``info`` this step's evaluation status (inferred when the backend does not say) and the statuses of
        the episode's evaluations so far."""
        if not info.get(EVALUATION_STATUS_KEY):
            info[EVALUATION_STATUS_KEY] = infer_evaluation_status(observation, info, self._scores_seen)
        if info[EVALUATION_STATUS_KEY] == EVALUATION_OK:
            self._check_metric_names(info)
        self._scores_seen = len(info.get("score") or [])
        if info[EVALUATION_STATUS_KEY]:
            self.evaluations.append(info[EVALUATION_STATUS_KEY])
        info[EVALUATIONS_KEY] = list(self.evaluations)

    def _check_metric_names(self, info: dict[str, Any]) -> None:
        """Count a scored evaluation whose metrics lack the task's reward metric as an ``infra_error`` (the task's
        fault: its evaluator and its baseline or priority metric name the metric differently), with the reason in
        ``info[EVALUATION_ERROR_KEY]``: never an exception out of ``step``."""
        from ..scores import evaluation_metric_problem, score_entry_metrics

        try:
            metrics = score_entry_metrics((info.get("score") or [])[-1])
        except (IndexError, TypeError, ValueError):
            return
        problem = evaluation_metric_problem(metrics, self.task.spec)
        if problem is not None:
            info[EVALUATION_STATUS_KEY] = INFRA_ERROR
            info[EVALUATION_ERROR_KEY] = problem
            warnings.warn(problem, RuntimeWarning, stacklevel=2)

    def _set_seed(self, seed: int | None) -> None:
        from ..options import check_option

        check_option("seed", seed)  # a refused seed leaves the env's seed as it was
        rng = np.random.default_rng(seed)
        self._seed = seed
        self.task_rng = rng

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the backend (it removes its processes and files) and the env."""
        _close_quietly(self._backend_holder)
        self.tools = None
        super().close(raise_if_closed=raise_if_closed)
