"""Every TorchRL, tensordict and CPython internal this package relies on, in one list, each with a check that it still
exists and behaves as the code that uses it assumes; and ``History``, imported where tensordict now keeps it.

Public APIs are not listed: an upgrade that breaks one fails loudly. An internal (a private name, a function's local
variable, a module's file) can change in any release without notice, and the code that reads it would then quietly
take its fallback. ``problems()`` names each internal that changed; ``tests/transforms/test_torchrl_internals.py``
runs it, so an upgrade of TorchRL or tensordict past the tested versions (``TESTED``; pyproject.toml pins the upper
bound) says what to look at before anything misbehaves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

try:  # tensordict >= 0.15 keeps History (TorchRL re-exports it from there)
    from tensordict.llm import History
except ImportError:  # TorchRL <= 0.14
    from torchrl.data.llm import History

__all__ = ["INTERNALS", "TESTED", "History", "Internal", "problems"]

TESTED = {"torchrl": "0.14.1", "tensordict": "0.14.3"}
"""The versions the package is tested with (pyproject.toml allows up to the next minor release, not including it)."""


@dataclass(frozen=True)
class Internal:
    """An internal relied on: ``name`` (where it lives), ``used_by`` (what relies on it, and for what), and ``check``,
    which returns what no longer holds ('' when all does)."""

    name: str
    used_by: str
    check: Callable[[], str]


def _attribute(path: str) -> object | None:
    """The object at ``module.attr.attr`` (None when any part is missing)."""
    module_name, _, rest = path.partition(":")
    try:
        value: object = importlib.import_module(module_name)
    except ImportError:
        return None
    for part in filter(None, rest.split(".")):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _exists(path: str) -> Callable[[], str]:
    return lambda: "" if _attribute(path) is not None else f"{path} is gone"


def _has_local(path: str, local: str) -> Callable[[], str]:
    """``path`` is a function with a local variable (or argument) named ``local``."""
    def check() -> str:
        function = _attribute(path)
        code = getattr(function, "__code__", None)
        if code is None:
            return f"{path} is gone"
        return "" if local in code.co_varnames else f"{path} has no local {local!r} any more"
    return check


def _reads(path: str, name: str) -> Callable[[], str]:
    """``path`` is a function whose code uses the attribute or global ``name``."""
    def check() -> str:
        code = getattr(_attribute(path), "__code__", None)
        if code is None:
            return f"{path} is gone"
        return "" if name in code.co_names else f"{path} no longer uses {name!r}"
    return check


def _pool_sets(*attributes: str) -> Callable[[], str]:
    """The multiprocessing ``AsyncEnvPool`` keeps ``attributes`` on itself (read from its source)."""
    def check() -> str:
        import inspect

        pool = _attribute("torchrl.envs.async_envs:ProcessorAsyncEnvPool")
        if pool is None:
            return "torchrl.envs.async_envs:ProcessorAsyncEnvPool is gone"
        source = inspect.getsource(pool)
        missing = [name for name in attributes if f"self.{name}" not in source]
        return f"ProcessorAsyncEnvPool no longer sets {', '.join(missing)}" if missing else ""
    return check


def _chat_templates() -> str:
    templates = _attribute("torchrl.data.llm.history:_CHAT_TEMPLATES")
    if not isinstance(templates, dict):
        return "torchrl.data.llm.history:_CHAT_TEMPLATES is no longer a dict"
    return "" if isinstance(templates.get("chatml_format"), str) else "_CHAT_TEMPLATES lacks the 'chatml_format' text"


INTERNALS: tuple[Internal, ...] = (
    Internal("torchrl.envs.async_envs:AsyncEnvPool._maybe_make_tensordict",
             "pools.reading_env_indices: the pool's view(-1) of a batch only reads env indices",
             _reads("torchrl.envs.async_envs:AsyncEnvPool._maybe_make_tensordict", "view")),
    Internal("torchrl.envs.async_envs (the module's file)",
             "pools.called_by_pool, pools.constructing_pool: a frame of the pool's module is the pool's own",
             _exists("torchrl.envs.async_envs:AsyncEnvPool")),
    Internal("torchrl.envs.async_envs:ProcessorAsyncEnvPool.input_queue / .threads",
             "pool_wire._queue_destination: which worker a queue feeds",
             _pool_sets("input_queue", "threads")),
    Internal("torchrl.envs.batched_envs:_run_worker_pipe_direct (local 'consolidate')",
             "pools.parallel_worker: whether a ParallelEnv worker consolidates what the env returns",
             _has_local("torchrl.envs.batched_envs:_run_worker_pipe_direct", "consolidate")),
    Internal("torchrl.envs.batched_envs:_run_worker_pipe_shared_mem",
             "pools.parallel_worker: the other ParallelEnv worker loop (consolidates by default)",
             _exists("torchrl.envs.batched_envs:_run_worker_pipe_shared_mem")),
    Internal("torchrl.envs.utils:_update_during_reset",
             "pools.ParallelOutput.where: how a ParallelEnv merges the envs it reset",
             _reads("torchrl.envs.utils:_update_during_reset", "where")),
    Internal("torchrl.data.llm.history:_CHAT_TEMPLATES",
             "rendering: TorchRL's chat templates by name",
             _chat_templates),
    Internal("torchrl.collectors._runner:_TIMEOUT",
             "scale.parallel (documented): a collector worker drops a frame its queue did not take in time",
             _exists("torchrl.collectors._runner:_TIMEOUT")),
    Internal("multiprocessing.queues:Queue._feed (local 'send_bytes'), Queue._writer (CPython)",
             "pool_wire._queue_destination: which pipe the queue's feeder thread writes to",
             _has_local("multiprocessing.queues:Queue._feed", "send_bytes")),
    *(Internal(f"tensordict:{owner}.{method}", used_by, _exists(f"tensordict:{owner}.{method}"))
      for owner, method, used_by in (
          ("TensorDict", "_new_unsafe", "pools._recast: an output recast without copying its leaves"),
          ("TensorDict", "_clone", "pools.PoolOutput, pools.ParallelOutput, history: clones that share messages"),
          ("TensorDict", "_get_sub_tensordict", "pools.PoolOutput.unbind: each env's row as a view"),
          ("TensorDict", "_set_str", "pools.ParallelOutput.where: a merged entry set in place"),
          ("LazyStackedTensorDict", "_new_lazy_unsafe", "history: a conversation stacked without checks"),
          ("LazyStackedTensorDict", "_key_list", "history.MessageStack: the message keys, once"),
          ("LazyStackedTensorDict", "_apply_nest", "history.MessageStack: apply over messages"),
          ("LazyStackedTensorDict", "_unbind", "history.MessageStack: unbind over messages"),
      )),
    Internal("History._from_tensordict", "history, pools: a History around a stack of messages",
             lambda: "" if hasattr(History, "_from_tensordict") else "History._from_tensordict is gone"),
)
"""Every internal relied on, with who relies on it."""


def problems() -> list[str]:
    """One line per internal that no longer exists or behaves as assumed (empty when all hold)."""
    found = []
    for internal in INTERNALS:
        problem = internal.check()
        if problem:
            found.append(f"{problem} (relied on by {internal.used_by})")
    return found
