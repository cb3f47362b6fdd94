"""Our evaluator of MLGym's gymnax tasks (rlBreakoutMinAtar, rlMetaMazeMisc, rlMountainCarContinuous...): MLGym's
evaluation, with the agent's network kept out of this process.

MLGym's own evaluate.py imports the agent's ``src/networks.py`` and traces it inside ``jax.lax.scan``; here the
environment steps in this (the evaluator's) process and the agent's network runs in the agent's: ``rl_policy`` is
the agent's side, which loads ``config.yaml``, ``src/networks.py`` and a checkpoint there and answers each step's
batch of observations with a batch of actions (``rl_driver``). What MLGym's evaluation fixes is kept: the
checkpoints ``checkpoints/<config stem>*.pkl`` (exactly 5), 5 rollout seeds with their environments reset and
stepped from ``jax.random.PRNGKey(seed)`` as MLGym splits it, 256 environments per seed (the description says 64;
MLGym's code, which scored the published baselines, runs 256), the task's number of frames, and the metrics "Reward
Mean" and "Reward Std" over every checkpoint, seed and environment. One change: MLGym's seeds are 0 to 4 in every
evaluation, so the agent, whose interpreter has jax and gymnax, could replay the test episodes offline; ours are
drawn from the evaluation seed (``rl_driver.rollout_seeds``), the same for every checkpoint of one evaluation.
Published baselines were scored on MLGym's seeds, so a score here differs from them by the noise of the episodes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import rl_driver

ROLLOUTS = 5
"""Rollout seeds per checkpoint (MLGym's 5)."""
NUM_ENVS = 256
CHECKPOINTS = 5


def action_space(env, env_params) -> rl_driver.ActionSpace:
    """The driver's view of a gymnax environment's action space."""
    space = env.action_space(env_params)
    n = getattr(space, "n", None)
    if n is not None:
        return rl_driver.ActionSpace(shape=(), n=int(n))
    return rl_driver.ActionSpace(shape=tuple(int(x) for x in space.shape))


def checkpoint_files(config_fname: str) -> list[Path]:
    """The checkpoints MLGym's evaluation scores: ``checkpoints/<config stem>*.pkl``, exactly ``CHECKPOINTS``."""
    stem = Path(config_fname).stem
    found = sorted(Path("./checkpoints").glob(f"{stem}*.pkl"))
    if len(found) != CHECKPOINTS:
        raise rl_driver.fail(f"expected {CHECKPOINTS} checkpoint files checkpoints/{stem}*.pkl (one per training "
                             f"seed, as src/train.py saves them), found {len(found)}")
    return found


def main(env_name: str, max_frames: int) -> None:
    """Score the agent's checkpoints on the gymnax environment ``env_name``; print MLGym's metrics as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("-config_fname", "--config_fname", type=str, default="./src/config.yaml")
    args, _ = parser.parse_known_args()

    import gymnax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import rl_policy  # the agent's side: with the local backend, its functions run in the agent's process

    env, env_params = gymnax.make(env_name)
    space = action_space(env, env_params)
    reset_batch = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step_batch = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    load, act = rl_policy.load, rl_policy.act
    returns = []
    seeds = rl_driver.rollout_seeds(ROLLOUTS)  # before the checkpoints are loaded: an error names no agent's file
    for checkpoint in checkpoint_files(args.config_fname):
        load(args.config_fname, str(checkpoint))
        for index, seed in enumerate(seeds):
            rng = jax.random.PRNGKey(seed)
            obs, state = reset_batch(jax.random.split(rng, NUM_ENVS), env_params)
            carry = {"rng": rng, "state": state}

            def step(actions, carry=carry):
                rng, _ = jax.random.split(carry["rng"])  # MLGym's key for sampling actions: the agent samples its own
                rng, rng_step = jax.random.split(rng)
                obs, state, reward, done, _ = step_batch(
                    jax.random.split(rng_step, NUM_ENVS), carry["state"], jnp.asarray(actions), env_params)
                carry["rng"], carry["state"] = rng, state
                return np.asarray(obs), np.asarray(reward), np.asarray(done)

            try:
                returns.append(rl_driver.rollout(np.asarray(obs), step, act, space=space, num_envs=NUM_ENVS,
                                                 max_frames=max_frames))
            except rl_driver.PolicyFailure as exc:
                raise rl_driver.fail(f"{exc} (checkpoint {checkpoint}, rollout {index})") from None
    print(json.dumps(rl_driver.metrics(returns)))
