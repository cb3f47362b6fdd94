"""Which of TorchRL's pools or worker loops drives an env, told once as it is built (``interop/torchrl/drivers.py``):
nothing in this process, a threading pool's envs by the pool that builds them, and envs built before a pool once
``drive_by_pool`` says so. The worker loops' side (a multiprocessing pool's, a ``ParallelEnv``'s) is played in
test_pools.py and test_pool_wire.py."""

from __future__ import annotations

import torch

from mlgym_registry import registry
from mlgym_registry.interop.torchrl.drivers import drive_by_pool, env_token, worker_loop
from mlgym_registry.interop.torchrl.pools import PoolOutput

TASK = "prisonersDilemma"
COMMAND = "DISCUSSION\nLook around.\n```\nls\n```"


def test_this_process_runs_no_worker_loop_and_its_envs_are_left_alone():
    assert worker_loop() is None
    with registry.make(TASK) as env:
        assert not isinstance(env.reset(), PoolOutput)
        assert env_token(env) == env_token(env)


def test_a_threading_pools_envs_hand_it_pool_outputs():
    from torchrl.envs import AsyncEnvPool

    pool = AsyncEnvPool([lambda: registry.make(TASK)] * 2, backend="threading")
    try:
        assert not pool.is_closed  # adopted as its setup built the envs
        assert isinstance(pool.envs[0].reset(), PoolOutput)
    finally:
        pool.close()
    assert all(env.is_closed for env in pool.envs)


def test_envs_built_before_a_threading_pool_are_driven_by_it_once_told():
    from torchrl.envs import AsyncEnvPool

    envs = [registry.make(TASK, max_turns=10) for _ in range(2)]
    pool = AsyncEnvPool(envs, backend="threading")
    drive_by_pool(pool)
    try:
        td = pool.reset()
        pool.async_step_and_maybe_reset_send(td[:1].set(("text", "response"), [[COMMAND]]))  # env 0 only
        _, ahead = pool.async_step_and_maybe_reset_recv(min_get=1)
        td = torch.stack([ahead[0], td[1]])  # conversations of different lengths, stacked densely by default
        assert [td["history", "prompt"][i].batch_size[-1] for i in range(2)] == [4, 2]
    finally:
        pool.close()
    assert pool.is_closed and all(env.is_closed for env in envs)
