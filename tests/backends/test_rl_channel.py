"""RL tasks on the local backend: the evaluator steps the environment, the agent's policy answers from its own
process, one call per step with the batch of observations (``tasks/data/rl/rl_driver.py``).

End to end through ``registry.make`` on the real sandbox with ``tests/rl_toy.py``'s numpy task (CI has no jax); the
driver's checks of a policy's answers directly; and, where gymnax is importable, a real gymnax environment through the
driver.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest
from rl_toy import RL_DATA, toy_spec

from mlgym_registry import registry
from mlgym_registry.policies.base import fenced

sys.path.insert(0, str(RL_DATA))
import rl_driver  # noqa: E402 - the evaluator-side file, as the task's evaluator imports it


def play(env, commands):
    td = env.reset()
    for command in commands:
        td.set(env.base_env.layout.response, fenced("Next.", command))
        td = env.step_mdp(env.step(td))
    return env.base_env.last_info


def test_a_trained_policy_is_scored_through_the_channel_by_validate_and_submit(tmp_path):
    env = registry.make(toy_spec(tmp_path / "task"), batch_size=())
    try:
        info = play(env, ["python src/train.py", "validate", "submit"])
    finally:
        env.close()
    assert info["evaluation_status"] == "ok", info
    first, last = info["score"]
    assert first == last and 0.9 < first["Reward Mean"] <= 1.0 and set(first) == {"Reward Mean", "Reward Std"}


def test_no_checkpoints_is_the_agents_failure_naming_them(tmp_path):
    env = registry.make(toy_spec(tmp_path / "task"), batch_size=())
    try:
        info = play(env, ["validate"])
    finally:
        env.close()
    assert info["evaluation_status"] == "agent_error" and not info["score"], info


@pytest.mark.parametrize("answer, words", [
    ([0, 1, 2, 3], "outside [0, 3)"),
    ([0, 1, -1, 2], "outside [0, 3)"),
    ([0.0, 1.0, 2.0, 1.0], "of type float64"),
    ([[0], [1], [2], [1]], "shape (4, 1)"),
    ([True, False, True, False], "of type bool"),
])
def test_discrete_actions_must_be_integers_of_the_space(answer, words):
    with pytest.raises(rl_driver.PolicyFailure, match=re.escape(words)):
        rl_driver.checked_actions(answer, rl_driver.ActionSpace(n=3), 4)


def test_rollout_masks_rewards_after_an_episode_ends_and_stops_when_all_ended():
    calls = []

    def act(data, shape, dtype):
        calls.append(rl_driver.unwire(data, shape, dtype).copy())
        return [0, 0]

    rewards = iter([([1.0, 1.0], [False, True]), ([1.0, 5.0], [True, False]), ([9.0, 9.0], [False, False])])

    def step(actions):
        reward, done = next(rewards)
        return np.full((2, 3), len(calls), np.uint8), np.array(reward), np.array(done)

    returns = rl_driver.rollout(np.zeros((2, 3), np.uint8), step, act, space=rl_driver.ActionSpace(n=1), num_envs=2,
                                max_frames=10)
    assert returns.tolist() == [2.0, 1.0] and len(calls) == 2 and calls[1].tolist() == [[1, 1, 1]] * 2
    assert rl_driver.metrics([returns]) == {"Reward Mean": 1.5, "Reward Std": 0.5}


@pytest.mark.skipif(importlib.util.find_spec("gymnax") is None, reason="gymnax (and jax) are not installed")
def test_a_real_gymnax_environment_through_the_driver():
    import gymnax
    import jax

    sys.path.insert(0, str(RL_DATA))
    import rl_gymnax

    env, params = gymnax.make("MountainCarContinuous-v0")
    space = rl_gymnax.action_space(env, params)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.PRNGKey(0), 8), params)
    holder = {"state": state, "rng": jax.random.PRNGKey(1)}

    def step(actions):
        holder["rng"], key = jax.random.split(holder["rng"])
        obs, holder["state"], reward, done, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(key, 8), holder["state"], actions, params)
        return np.asarray(obs), np.asarray(reward), np.asarray(done)

    returns = rl_driver.rollout(np.asarray(obs), step, lambda *wire: [[0.5]] * 8, space=space, num_envs=8,
                                max_frames=50)
    assert returns.shape == (8,) and np.allclose(returns, -0.1 * 0.25 * 50)
