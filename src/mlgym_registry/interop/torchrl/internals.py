"""Every TorchRL, tensordict and CPython internal this package relies on, in one list, each with a check that it still
exists and behaves as the code that uses it assumes; and the TorchRL and tensordict versions the package is tested
with.

Public APIs are not listed: an upgrade that breaks one fails loudly. An internal (a private name, a worker loop's
argument, a module's file) can change in any release without notice, and the code that reads it would then quietly
take its fallback. ``problems()`` names each internal that changed; ``tests/interop/torchrl/test_internals.py`` runs
it, so an upgrade of TorchRL or tensordict past the tested versions (``TESTED``; pyproject.toml pins the upper bound)
says what to look at before anything misbehaves. Most are used in this room (``interop/torchrl``); the chain's own
conversation (``transforms/history.py``: a ``History`` over a lazy stack of messages, built without tensordict's
checks) and TorchRL's chat templates by name (``transforms/rendering.py``) are listed here too. ``History`` itself is
imported once, in ``transforms/history.py``: from ``tensordict.llm`` where tensordict keeps it (0.15), else from
TorchRL.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ...transforms.history import History

__all__ = ["INTERNALS", "TESTED", "Internal", "problems"]

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


def _reads(path: str, name: str) -> Callable[[], str]:
    """``path`` is a function whose code uses the attribute or global ``name``."""
    def check() -> str:
        code = getattr(_attribute(path), "__code__", None)
        if code is None:
            return f"{path} is gone"
        return "" if name in code.co_names else f"{path} no longer uses {name!r}"
    return check


def _source_has(path: str, *snippets: str) -> Callable[[], str]:
    """``path``'s source still holds each of ``snippets``."""
    def check() -> str:
        import inspect

        value = _attribute(path)
        if value is None:
            return f"{path} is gone"
        source = inspect.getsource(value)
        missing = [snippet for snippet in snippets if snippet not in source]
        return f"{path} no longer holds {', '.join(map(repr, missing))}" if missing else ""
    return check


def _parallel_workers() -> str:
    """Both ``ParallelEnv`` worker loops exist, the first takes ``consolidate``, and ``ParallelEnv`` starts a process
    with the loop as its target and its arguments as keywords (what ``drivers.worker_loop`` reads back)."""
    import inspect

    for name in ("_run_worker_pipe_direct", "_run_worker_pipe_shared_mem"):
        if _attribute(f"torchrl.envs.batched_envs:{name}") is None:
            return f"torchrl.envs.batched_envs:{name} is gone"
    direct = _attribute("torchrl.envs.batched_envs:_run_worker_pipe_direct")
    if "consolidate" not in inspect.signature(direct).parameters:
        return "torchrl.envs.batched_envs:_run_worker_pipe_direct takes no 'consolidate' any more"
    return _source_has("torchrl.envs.batched_envs:ParallelEnv._start_workers", "proc_fun(target=func, kwargs=",
                       '"consolidate": self.consolidate')()


def _worker_target(**kwargs: object) -> None:
    """A stand-in worker loop for ``_process_target``."""


def _process_target() -> str:
    """A ``multiprocessing`` process keeps its target and keyword arguments (``_target``, ``_kwargs``), runs them from
    there, and is ``current_process()`` in the child it starts."""
    import multiprocessing
    from multiprocessing import process

    worker = multiprocessing.get_context("spawn").Process(target=_worker_target, kwargs={"consolidate": False})
    if getattr(worker, "_target", None) is not _worker_target or getattr(worker, "_kwargs", None) != {
            "consolidate": False}:
        return "a multiprocessing Process no longer keeps its target and keyword arguments as _target and _kwargs"
    problem = _reads("multiprocessing.process:BaseProcess.run", "_target")() or _reads(
        "multiprocessing.process:BaseProcess.run", "_kwargs")()
    if problem:
        return problem
    bootstrap = getattr(process.BaseProcess._bootstrap, "__code__", None)
    if bootstrap is None or "_current_process" not in bootstrap.co_names:
        return "multiprocessing's child no longer makes its Process object current_process() (BaseProcess._bootstrap)"
    return ""


def _queue_feeder() -> str:
    """A ``multiprocessing`` queue keeps the thread that feeds its pipe as ``_thread``, named 'QueueFeederThread'."""
    import multiprocessing

    from .pool_wire import _FEEDER_THREAD

    queue = multiprocessing.get_context("spawn").Queue()
    try:
        queue.put(None)
        feeder = getattr(queue, "_thread", None)
        queue.get(timeout=30)
    finally:
        queue.close()
        queue.join_thread()
    if feeder is None:
        return "multiprocessing.queues:Queue no longer keeps its feeder thread as _thread"
    if feeder.name != _FEEDER_THREAD:
        return f"multiprocessing.queues:Queue's feeder thread is named {feeder.name!r}, not {_FEEDER_THREAD!r}"
    return ""


def _chat_templates() -> str:
    templates = _attribute("torchrl.data.llm.history:_CHAT_TEMPLATES")
    if not isinstance(templates, dict):
        return "torchrl.data.llm.history:_CHAT_TEMPLATES is no longer a dict"
    return "" if isinstance(templates.get("chatml_format"), str) else "_CHAT_TEMPLATES lacks the 'chatml_format' text"


INTERNALS: tuple[Internal, ...] = (
    Internal("torchrl.envs.async_envs:AsyncEnvPool._maybe_make_tensordict",
             "pools.reading_env_indices: the pool's view(-1) of a batch only reads env indices (a frame's code)",
             _reads("torchrl.envs.async_envs:AsyncEnvPool._maybe_make_tensordict", "view")),
    Internal("torchrl.envs.async_envs:ThreadingAsyncEnvPool._setup (its 'self', building env_makers)",
             "pools.constructing_pool: the pool whose setup builds an env is the 'self' of a frame of its module",
             _reads("torchrl.envs.async_envs:ThreadingAsyncEnvPool._setup", "env_makers")),
    Internal("torchrl.envs.async_envs:ProcessorAsyncEnvPool._setup (its 'self', starting the workers)",
             "pools.constructing_pool: the pool that pickles an env factory for its workers, the same way",
             _source_has("torchrl.envs.async_envs:ProcessorAsyncEnvPool._setup", "self.env_makers[",
                         "multiprocessing.Process(")),
    Internal("torchrl.envs.async_envs:ProcessorAsyncEnvPool._env_exec / _worker_exec (the workers' targets)",
             "drivers.worker_loop: a process started to run one of them is a pool worker",
             _source_has("torchrl.envs.async_envs:ProcessorAsyncEnvPool._setup", "target = self._env_exec",
                         "target = self._worker_exec")),
    Internal("torchrl.envs.async_envs:ProcessorAsyncEnvPool.input_queue / .threads",
             "pool_wire._queue_destination: which worker a queue feeds",
             _source_has("torchrl.envs.async_envs:ProcessorAsyncEnvPool", "self.input_queue", "self.threads")),
    Internal("torchrl.envs.batched_envs:_run_worker_pipe_direct / _run_worker_pipe_shared_mem (the workers' targets, "
             "'consolidate' a keyword of the first)",
             "drivers.worker_loop: a ParallelEnv worker, and whether it consolidates what the env returns",
             _parallel_workers),
    Internal("torchrl.envs.utils:_update_during_reset",
             "pools.ParallelOutput.where: how a ParallelEnv merges the envs it reset",
             _reads("torchrl.envs.utils:_update_during_reset", "where")),
    Internal("torchrl.data.llm.history:_CHAT_TEMPLATES",
             "transforms/rendering: TorchRL's chat templates by name",
             _chat_templates),
    Internal("torchrl.collectors._runner:_TIMEOUT",
             "collectors (documented): a collector worker drops a frame its queue did not take in time",
             _exists("torchrl.collectors._runner:_TIMEOUT")),
    Internal("multiprocessing.process:BaseProcess._target / ._kwargs, current_process() in the child (CPython)",
             "drivers.worker_loop: the worker loop this process runs, and its keyword arguments",
             _process_target),
    Internal("multiprocessing.queues:Queue._thread, the 'QueueFeederThread' that pickles what is put (CPython)",
             "pool_wire.may_encode, pool_wire._queue_destination: which queue this feeder thread feeds",
             _queue_feeder),
    *(Internal(f"tensordict:{owner}.{method}", used_by, _exists(f"tensordict:{owner}.{method}"))
      for owner, method, used_by in (
          ("TensorDict", "_new_unsafe", "pools._recast: an output recast without copying its leaves"),
          ("TensorDict", "_clone", "pools.PoolOutput, pools.ParallelOutput, transforms/history: clones that share "
                                   "messages"),
          ("TensorDict", "_get_sub_tensordict", "pools.PoolOutput.unbind: each env's row as a view"),
          ("TensorDict", "_set_str", "pools.ParallelOutput.where: a merged entry set in place"),
          ("LazyStackedTensorDict", "_new_lazy_unsafe", "transforms/history: a conversation stacked without checks"),
          ("LazyStackedTensorDict", "_key_list", "transforms/history.MessageStack: the message keys, once"),
          ("LazyStackedTensorDict", "_apply_nest", "transforms/history.MessageStack: apply over messages"),
          ("LazyStackedTensorDict", "_unbind", "transforms/history.MessageStack: unbind over messages"),
      )),
    Internal("History._from_tensordict", "transforms/history, pools: a History around a stack of messages",
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
