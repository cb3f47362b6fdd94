"""Drives an RL evaluation from the evaluator's side: the environment steps here, the agent's policy only answers.

The evaluator's process owns the environment, its seeds and its state, and keeps the score. Each step, it sends the
batch of observations to the agent's policy (``act``: with the local backend, a function of the agent's process,
reached over the evaluation's channel) and gets back one batch of actions, which it checks before the environment
takes them: the agent's code never sees the environment's state nor the rewards, and cannot print a score.

Standard library and numpy only, so that any task's evaluator can use it (ours for MLGym's gymnax tasks, a test's
numpy environment).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SEED_VARIABLE = "MLGYM_REGISTRY_EVAL_SEED"
"""The evaluation seed: the backend derives it from the run's seed with a key the agent never sees and sets it in the
evaluator's process only (``mlgym_registry.seeding``; this file runs in the evaluator's process, so it names the
variable rather than importing the package)."""


def evaluation_seed() -> int | None:
    """The integer in ``SEED_VARIABLE``, or None when it is unset (an evaluation run by hand)."""
    value = os.environ.get(SEED_VARIABLE, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise fail(f"{SEED_VARIABLE} must be an integer, got {value!r}") from None


def rollout_seeds(count: int) -> list[int]:
    """The seeds of an evaluation's ``count`` rollouts, each a 32-bit integer (what ``jax.random.PRNGKey`` takes):
    drawn from the evaluation seed, so that a run's seed reproduces them and nothing the agent can read or guess
    does (fixed seeds would let the agent replay the test episodes offline); from fresh randomness without one."""
    seed = evaluation_seed()
    sequence = np.random.SeedSequence(None if seed is None else seed % 2**64)
    return [int(value) for value in sequence.generate_state(count, dtype=np.uint32)]


class PolicyFailure(Exception):
    """The agent's policy answered with something the environment cannot take (its message says what and why)."""


@dataclass(frozen=True)
class ActionSpace:
    """What one environment takes as an action: ``discrete`` actions are integers in ``[0, n)`` (``shape`` ``()``);
    continuous ones are finite float32 arrays of ``shape`` (the environment clips them as it does in training)."""

    shape: tuple[int, ...] = ()
    n: int | None = None

    @property
    def discrete(self) -> bool:
        return self.n is not None

    def describe(self) -> str:
        if self.discrete:
            return f"an integer in [0, {self.n})"
        return f"a finite float32 array of shape {self.shape}"


def wire(obs) -> tuple[bytes, tuple[int, ...], str]:
    """A batch of observations as it crosses to the agent's process: its bytes, shape and numpy dtype string."""
    array = np.ascontiguousarray(np.asarray(obs))
    return array.tobytes(), tuple(int(n) for n in array.shape), array.dtype.str


def unwire(data: bytes, shape, dtype: str) -> np.ndarray:
    """The inverse of ``wire`` (on the agent's side)."""
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape))


def checked_actions(answer, space: ActionSpace, num_envs: int) -> np.ndarray:
    """The policy's answer as the batch of actions the environment takes; ``PolicyFailure`` when it is not one
    action per environment of the right kind."""
    expected = (num_envs, *space.shape)
    try:
        actions = np.asarray(answer)
    except Exception as exc:  # noqa: BLE001 - ragged lists and the like: the answer is not an array
        raise PolicyFailure(f"the policy answered with something that is not an array of actions ({exc})") from None
    if actions.shape != expected:
        raise PolicyFailure(f"the policy answered with actions of shape {actions.shape}; this evaluation needs "
                            f"{expected}: one action per environment, each {space.describe()}")
    if space.discrete:
        if actions.dtype.kind not in "iu":
            raise PolicyFailure(f"the policy answered with actions of type {actions.dtype}; each must be "
                                f"{space.describe()}")
        if actions.size and (actions.min() < 0 or actions.max() >= space.n):
            raise PolicyFailure(f"the policy answered with an action outside [0, {space.n}) "
                                f"({int(actions.min())}..{int(actions.max())})")
        return actions.astype(np.int32)
    if actions.dtype.kind not in "iuf":
        raise PolicyFailure(f"the policy answered with actions of type {actions.dtype}; each must be "
                            f"{space.describe()}")
    actions = actions.astype(np.float32)
    if not np.isfinite(actions).all():
        raise PolicyFailure("the policy answered with an action that is not a finite float32 (NaN, infinite, or "
                            "beyond float32's range)")
    return actions


Step = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Takes a batch of actions; the batch of next observations, rewards and done flags."""


def rollout(obs, step: Step, act: Callable, *, space: ActionSpace, num_envs: int, max_frames: int) -> np.ndarray:
    """Each environment's return over ``max_frames`` steps from the observations ``obs``: its rewards up to and
    including the step that ended its first episode (MLGym's evaluators mask the rest). One call of ``act`` per
    step, with the whole batch of observations (``wire``); it stops early once every episode has ended, since
    later rewards count for nothing."""
    returns = np.zeros(num_envs, dtype=np.float64)
    valid = np.ones(num_envs, dtype=np.float64)
    for _ in range(max_frames):
        if not valid.any():
            break
        actions = checked_actions(act(*wire(obs)), space, num_envs)
        obs, reward, done = step(actions)
        reward = np.asarray(reward, dtype=np.float64).reshape(num_envs)
        if not np.isfinite(reward).all():
            raise PolicyFailure("the environment's reward is not finite after the policy's actions (actions so "
                                "large that their penalty overflows)")
        returns += reward * valid
        valid = valid * (1.0 - np.asarray(done, dtype=np.float64).reshape(num_envs))
    return returns


def metrics(returns: list[np.ndarray]) -> dict[str, float]:
    """MLGym's RL metrics: the mean and standard deviation of the returns of every environment, seed and
    checkpoint."""
    values = np.concatenate([np.asarray(r, dtype=np.float64).reshape(-1) for r in returns])
    return {"Reward Mean": float(np.mean(values)), "Reward Std": float(np.std(values))}


def fail(message: str) -> SystemExit:
    """The exit of an evaluation that cannot score the agent's work, saying why (its status is the agent's)."""
    print(f"Evaluation failed: {message}", file=sys.stderr)
    return SystemExit(1)
