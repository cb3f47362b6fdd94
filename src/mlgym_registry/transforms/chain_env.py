"""``ChainEnv``: the env ``registry.make`` returns, TorchRL's ``TransformedEnv`` with guards of ours."""

from __future__ import annotations

import os
from typing import Any

from tensordict import TensorDictBase
from torchrl.envs import TransformedEnv

from . import pool_wire
from .base import refuse_stepped
from .pools import (
    adopt_pool,
    called_by_pool,
    constructing_pool,
    for_parallel,
    for_pool,
    parallel_worker,
)


def _for_caller(out: TensorDictBase, env: ChainEnv) -> TensorDictBase:
    """``out`` as the caller of the ``ChainEnv`` method calling this needs it: a ``PoolOutput`` of ``env`` for an
    ``AsyncEnvPool``, a ``ParallelOutput`` (conversations dense when it consolidates) for a ``ParallelEnv`` worker,
    else ``out`` itself."""
    if called_by_pool(3):
        return for_pool(out, env.pool_token)
    consolidating = parallel_worker(3)
    return out if consolidating is None else for_parallel(out, consolidating)


class ChainEnv(TransformedEnv):
    """TorchRL's ``TransformedEnv`` over the chain, with three additions.

    - A tensordict that was already stepped is refused before anything runs (``EnvMisuseError`` naming
      ``env.step_mdp``): without it the backend runs the command, and tensordict then fails with an error about lazy
      batch sizes.
    - It is a context manager: ``with registry.make(...) as env:`` closes it, and its backend, on the way out.
    - In TorchRL's ``AsyncEnvPool`` (``transforms/pools.py``): what the env returns to the pool stacks with the pool's
      default ``stack="dense"`` whatever each env's conversation length, a threading pool closes its envs, and a
      multiprocessing pool's queues carry only the messages the other end lacks (``transforms/pool_wire.py``).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        pool = constructing_pool()
        if pool is not None:
            adopt_pool(pool)

    @property
    def pool_token(self) -> str:
        """Names this env's outputs on a multiprocessing pool's queues (``pools.PoolOutput``), and the process the
        env lives in (a copy of the env sent to another process gets a name of its own there)."""
        token = self.__dict__.get("_pool_token")
        if token is None or not token.startswith(f"{os.getpid()}:"):
            token = self.__dict__["_pool_token"] = pool_wire.new_token()
        return token

    def fork(self, n: int = 1) -> list[ChainEnv]:
        """``n`` independent envs in exactly this one's state after its last step (``transforms/forking.py``): the
        workspace's files (shared copy-on-write), the shell's working directory and exported variables, every count
        of the chain, the episode's seeds. Step each from a clone of the tensordict you hold; each closes on its own.
        Refused while the agent's background processes run (docs/training.md, "Branching an episode")."""
        from .forking import fork_env

        return fork_env(self, n)

    def fork_point(self) -> Any:
        """This env's state as a picklable ``transforms.forking.ChainForkPoint``: calling it makes a child, in this
        process or in a worker (``AsyncEnvPool([point] * n, backend="multiprocessing")``); ``point.close()`` once the
        children are made."""
        from .forking import fork_point

        return fork_point(self)

    def __enter__(self) -> ChainEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """``with registry.make(...) as env:`` closes the env (and its backend) on the way out."""
        self.close(raise_if_closed=False)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``TransformedEnv.step``, after checking that ``tensordict`` is a step's input, not its output."""
        refuse_stepped(tensordict)
        return _for_caller(super().step(tensordict), self)

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """``TransformedEnv.reset``."""
        return _for_caller(super().reset(tensordict, **kwargs), self)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """``TransformedEnv.step_and_maybe_reset``."""
        out, following = super().step_and_maybe_reset(tensordict)
        return _for_caller(out, self), _for_caller(following, self)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        return _for_caller(super()._reset(tensordict, **kwargs), self)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return _for_caller(super()._step(tensordict), self)
