"""What TorchRL's ``AsyncEnvPool`` needs of the env: outputs that stack at any conversation length, and a close that
releases every sandbox.

**Stacking.** A pool stacks its envs' outputs with ``torch.stack`` by default (``stack="dense"``). An env's
conversation is a ``History`` whose message count is a batch dim, and the policy's token ids, log-probs and masks have
one length per env: envs at different turns cannot be stacked densely, and tensordict refuses ("The shapes of the
tensors to stack is incompatible ... for key prompt"); even at equal lengths, a dense stack of lazily stacked
conversations is one that ``reshape`` (which TorchRL's LLM wrappers call) leaves unreshaped. So every output the env
hands to a pool is a ``PoolOutput``: a ``TensorDict`` that ``torch.stack`` stacks lazily, as ``stack="lazy"`` does,
so each env keeps its own shapes. Only outputs returned to a pool's worker are marked, so everything else
(``rollout``, a user's own ``torch.stack``) behaves as before.

**Closing.** TorchRL 0.14's threading pool does not close its envs on ``close()`` (its multiprocessing pool does, in
each worker), and every ``EnvBase`` counts as closed from construction, so ``collector.shutdown()`` skips
``pool.close()``. An env built by a threading pool's setup adopts the pool: the pool counts as open until it is
closed, and closing it closes each of its envs.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack

_SEARCHED_FRAMES = 40
"""How far up the stack the pool that is building an env is looked for (the factory's own calls sit in between)."""


class PoolOutput(TensorDict):
    """A ``TensorDict`` that ``torch.stack`` stacks lazily (``lazy_stack``): what the env returns to a pool."""

    @classmethod
    def __torch_function__(cls, func: Any, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None):
        if func is torch.stack:
            return lazy_stack(*args, **(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)


def _pool_class() -> type | None:
    module = sys.modules.get("torchrl.envs.async_envs")
    return None if module is None else module.AsyncEnvPool


def _pool_file() -> str | None:
    module = sys.modules.get("torchrl.envs.async_envs")
    return None if module is None else module.__file__


def called_by_pool(depth: int = 2) -> bool:
    """True when the function ``depth`` frames up was called by an ``AsyncEnvPool`` worker (the pool's functions
    that step and reset its envs, in a thread or a worker process), told by the caller's code alone: reading the
    caller's locals would keep them (the env itself, in a user's function) alive in the frame's snapshot of them."""
    pool_file = _pool_file()
    return pool_file is not None and sys._getframe(depth).f_code.co_filename == pool_file


def for_pool(tensordict: TensorDictBase) -> TensorDictBase:
    """``tensordict`` as a ``PoolOutput`` (a plain ``TensorDict`` changes class in place; anything else is copied
    shallowly)."""
    if isinstance(tensordict, PoolOutput):
        return tensordict
    if type(tensordict) is TensorDict:
        tensordict.__class__ = PoolOutput
        return tensordict
    return PoolOutput._new_unsafe(
        source={key: tensordict.get(key) for key in tensordict.keys()},
        batch_size=tensordict.batch_size,
        device=tensordict.device,
    )


# -- closing -----------------------------------------------------------------------------------------------------------
def constructing_pool() -> Any:
    """The threading ``AsyncEnvPool`` whose setup is building an env right now, if one is (else None). Only frames of
    the pool's own module have their locals read (for the pool), never a user's."""
    pool_class, pool_file = _pool_class(), _pool_file()
    if pool_class is None:
        return None
    frame = sys._getframe(1)
    for _ in range(_SEARCHED_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_filename == pool_file:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, pool_class) and hasattr(candidate, "_pool"):  # the thread pool executor
                return candidate
        frame = frame.f_back
    return None


def adopt_pool(pool: Any) -> None:
    """Make ``pool`` (a threading ``AsyncEnvPool`` being set up) close its envs when it is closed, and count as open
    until then, so that ``collector.shutdown()`` closes it. Idempotent."""
    if pool.__dict__.get("_mlgym_adopted"):
        return
    pool.__dict__["_mlgym_adopted"] = True
    # EnvBase.__init__ (run after the pool's setup) sets is_closed=True only when no value is there yet
    pool.__dict__["is_closed"] = False
    shutdown = type(pool).shutdown
    owner = weakref.ref(pool)  # no cycle through the pool's own __dict__: its __del__ still shuts it down

    def shutdown_and_close_envs() -> None:
        """The pool's own shutdown (its threads end), then each env's ``close()`` (its sandbox ends)."""
        pool = owner()
        if pool is None:
            return
        shutdown(pool)
        for env in getattr(pool, "envs", ()):
            if not env.is_closed:
                env.close(raise_if_closed=False)
        pool.__dict__["is_closed"] = True

    pool.shutdown = shutdown_and_close_envs
