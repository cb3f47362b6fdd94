"""The agent's side of our evaluation of MLGym's gymnax tasks: it runs where the agent's code runs (with the local
backend, the agent's own sandboxed process), never in the evaluator's.

``load`` builds the agent's network as MLGym's evaluation does (``src.helpers.load_config`` of the submitted
``config.yaml``, ``src.networks.get_model_ready`` with its ``train_config``, the checkpoint's ``"network"``
parameters); ``act`` answers one batch of observations with one batch of actions sampled from the network's policy,
as MLGym's evaluation samples them. The evaluator (``rl_gymnax``) steps the environment and keeps the score.
"""

from __future__ import annotations

_POLICY: dict = {}


def load(config_fname: str, checkpoint: str) -> None:
    """Load the network of ``checkpoint`` (a pickle saved by src/train.py) configured by ``config_fname``."""
    import random

    import jax
    from src.helpers import load_config, load_pkl_object
    from src.networks import get_model_ready

    config = load_config(config_fname)
    model, _ = get_model_ready(jax.random.PRNGKey(0), config.train_config)
    params = load_pkl_object(checkpoint)["network"]

    @jax.jit
    def sample(params, obs, key):
        _, pi = model.apply(params, obs, rng=None)
        return pi.sample(seed=key)

    _POLICY.update(sample=sample, params=params, key=jax.random.PRNGKey(random.getrandbits(31)))


def act(data: bytes, shape: list, dtype: str) -> list:
    """Actions for a batch of observations (``rl_driver.wire``'s bytes, shape and dtype), as a list."""
    import jax
    import numpy as np

    if not _POLICY:
        raise RuntimeError("act() before load(): no network is loaded")
    obs = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape))
    _POLICY["key"], key = jax.random.split(_POLICY["key"])
    return np.asarray(_POLICY["sample"](_POLICY["params"], obs, key)).tolist()
