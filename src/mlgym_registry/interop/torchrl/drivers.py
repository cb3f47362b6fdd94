"""Which of TorchRL's pools or worker loops drives an env, told once as the env is built, and the form its outputs
take for it (``ChainEnv.hand_outputs_to``).

- A threading ``AsyncEnvPool`` builds its envs in its own setup, in this process: that pool
  (``pools.constructing_pool``) is adopted, and its envs hand it ``PoolOutput``s (``drive_by_pool`` does the same for
  envs built before the pool).
- A worker process of a multiprocessing ``AsyncEnvPool`` or of a ``ParallelEnv`` runs one of TorchRL's worker loops
  as its process target (``worker_loop``): every env built in that process is that loop's. A pool's get
  ``PoolOutput``s named by the env's token (``env_token``, which the pool wire reads); a ``ParallelEnv``'s get
  ``ParallelOutput``s, their conversations dense when the loop consolidates (its ``consolidate`` argument).
- Any other env (a user's, a collector's, Ray's) is left alone: its outputs are the chain's own.

The process's target and arguments are read once per env, from the ``multiprocessing`` process object (no stack
frame is read); ``internals`` lists them and checks them.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from typing import Any

from tensordict import TensorDictBase

from . import pool_wire
from .pools import adopt_pool, constructing_pool, for_parallel, for_pool

POOL_WORKER_LOOPS = ("ProcessorAsyncEnvPool._env_exec", "ProcessorAsyncEnvPool._worker_exec")
"""The multiprocessing ``AsyncEnvPool``'s worker loops (``torchrl.envs.async_envs``): one env, or several in
threads."""

PARALLEL_WORKER_LOOPS = ("_run_worker_pipe_direct", "_run_worker_pipe_shared_mem")
"""``ParallelEnv``'s worker loops (``torchrl.envs.batched_envs``): without and with shared buffers."""


def worker_loop() -> tuple[str, dict[str, Any]] | None:
    """The TorchRL worker loop this process was started to run, with the keyword arguments it was given:
    ``("pool", kwargs)`` for a multiprocessing ``AsyncEnvPool``'s, ``("parallel", kwargs)`` for a ``ParallelEnv``'s,
    else None."""
    process = multiprocessing.current_process()
    target = getattr(process, "_target", None)
    function = getattr(target, "__func__", target)
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    kwargs = dict(getattr(process, "_kwargs", None) or {})
    if module == "torchrl.envs.async_envs" and name in POOL_WORKER_LOOPS:
        return "pool", kwargs
    if module == "torchrl.envs.batched_envs" and name in PARALLEL_WORKER_LOOPS:
        return "parallel", kwargs
    return None


def env_token(env: Any) -> str:
    """Names ``env``'s outputs on a multiprocessing pool's queues (``pools.PoolOutput``), and the process the env
    lives in (a copy of the env sent to another process gets a name of its own there)."""
    token = env.__dict__.get("_pool_token")
    if token is None or not token.startswith(f"{os.getpid()}:"):
        token = env.__dict__["_pool_token"] = pool_wire.new_token()
    return token


def to_pool(output: TensorDictBase, env: Any) -> TensorDictBase:
    """``output`` as what a pool takes from ``env``: a ``PoolOutput`` named by the env's token."""
    return for_pool(output, env_token(env))


def to_parallel(output: TensorDictBase, env: Any, *, consolidating: bool) -> TensorDictBase:
    """``output`` as what a ``ParallelEnv`` worker loop takes from ``env``: a ``ParallelOutput``."""
    return for_parallel(output, consolidating)


def attach(env: Any) -> None:
    """Tell ``env`` (just built) the output form of the pool or worker loop that drives it, adopting a threading
    pool being set up; leave it alone when none does."""
    pool = constructing_pool()
    if pool is not None:
        adopt_pool(pool)
        env.hand_outputs_to(to_pool)
        return
    loop = worker_loop()
    if loop is None:
        return
    kind, kwargs = loop
    if kind == "pool":
        env.hand_outputs_to(to_pool)
    else:  # the shared-buffer loop takes no 'consolidate' and consolidates (TorchRL's default)
        env.hand_outputs_to(functools.partial(to_parallel, consolidating=bool(kwargs.get("consolidate", True))))


def drive_by_pool(pool: Any) -> None:
    """Adopt a threading ``AsyncEnvPool`` given envs built before it (not by its own setup, where ``attach`` finds
    it), and have each of its envs hand it ``PoolOutput``s: the explicit form of what ``attach`` does for the envs
    a pool builds."""
    adopt_pool(pool)
    for env in getattr(pool, "envs", ()):
        if hasattr(env, "hand_outputs_to"):
            env.hand_outputs_to(to_pool)
