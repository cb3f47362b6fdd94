"""``ChainEnv``: the env ``registry.make`` returns, TorchRL's ``TransformedEnv`` with guards of ours."""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from torchrl.envs import TransformedEnv

from .base import refuse_stepped
from .pools import (
    adopt_pool,
    called_by_pool,
    constructing_pool,
    for_parallel,
    for_pool,
    parallel_worker,
)


def _for_caller(out: TensorDictBase) -> TensorDictBase:
    """``out`` as the caller of the ``ChainEnv`` method calling this needs it: a ``PoolOutput`` for an
    ``AsyncEnvPool``, a ``ParallelOutput`` (conversations dense when it consolidates) for a ``ParallelEnv`` worker,
    else ``out`` itself."""
    if called_by_pool(3):
        return for_pool(out)
    consolidating = parallel_worker(3)
    return out if consolidating is None else for_parallel(out, consolidating)


class ChainEnv(TransformedEnv):
    """TorchRL's ``TransformedEnv`` over the chain, with three additions.

    - A tensordict that was already stepped is refused before anything runs (``EnvMisuseError`` naming
      ``env.step_mdp``): without it the backend runs the command, and tensordict then fails with an error about lazy
      batch sizes.
    - It is a context manager: ``with registry.make(...) as env:`` closes it, and its backend, on the way out.
    - In TorchRL's ``AsyncEnvPool`` (``transforms/pools.py``): what the env returns to the pool stacks with the pool's
      default ``stack="dense"`` whatever each env's conversation length, and a threading pool closes its envs.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        pool = constructing_pool()
        if pool is not None:
            adopt_pool(pool)

    def __enter__(self) -> ChainEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """``with registry.make(...) as env:`` closes the env (and its backend) on the way out."""
        self.close(raise_if_closed=False)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``TransformedEnv.step``, after checking that ``tensordict`` is a step's input, not its output."""
        refuse_stepped(tensordict)
        return _for_caller(super().step(tensordict))

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """``TransformedEnv.reset``."""
        return _for_caller(super().reset(tensordict, **kwargs))

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """``TransformedEnv.step_and_maybe_reset``."""
        out, following = super().step_and_maybe_reset(tensordict)
        return _for_caller(out), _for_caller(following)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        return _for_caller(super()._reset(tensordict, **kwargs))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return _for_caller(super()._step(tensordict))
