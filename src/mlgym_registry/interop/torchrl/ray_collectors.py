"""TorchRL 0.14's own Ray collectors over our envs, with the checks its constructors leave out.

``ray_collector`` builds ``Collector(backend="ray", num_collectors=N, ...)`` (TorchRL's ``RayCollector``: one Ray
actor per collector, each running an env and the policy), and ``ray_llm_collector`` builds a ``RayLLMCollector`` (one
Ray actor running an ``LLMCollector``). Both build the env in the actor from the task spec (``EnvFactory``), so a task
or a component registered only in this process works there too.

What they do that TorchRL 0.14 does not (each seen on a real local Ray):

- ``total_frames`` must be a positive budget: ``RayCollector`` takes ``-1`` (its default, "no limit" elsewhere in
  TorchRL) and then yields nothing at all, after starting every actor. ``total_frames=None`` asks for no limit here.
- an actor that asks for more CPUs (GPUs, memory, ...) than any node has, or than the cluster has free, stays pending
  and TorchRL's constructor (or its first batch) waits for it forever. The helpers size the request to the cluster
  and raise ``RayResourceError`` before anything is started when it cannot be placed.
- ``len(collector)``, and so ``list(collector)``, fails on ``RayCollector`` with ``AttributeError``
  (``requested_frames_per_batch``); the helper sets it.
- a policy without weights (``TextPolicy``) needs ``NoWeightSyncScheme``, under which the first batch warns that
  weights were never synchronised and ``update_policy_weights_()`` fails with ``AttributeError``; the helper picks
  that scheme and marks the sync as done.
- ``RayCollector`` takes only its own keyword arguments; the per-worker collector's (``compact_obs``, ``use_buffers``,
  ...) go in ``collector_kwargs``. ``ray_collector`` sends each keyword where TorchRL 0.14 reads it.
- ``ray_init_config`` is ignored when Ray is already initialised, and otherwise starts a runtime with Ray's defaults
  (every interface, files in ``/tmp/ray``). The helpers use the caller's Ray when there is one, and otherwise start a
  local one with ``ray_session()`` that the collector's ``shutdown()`` stops.
- ``RayLLMCollector`` returns ``None`` for ever once its budget is spent (its iteration never ends), keeps its actor
  (and the CPUs it holds) alive after ``shutdown()``, and fails with ``AttributeError`` when given ``num_cpus``
  without a ``remote_config``. ``ManagedRayLLMCollector`` stops at the budget and ends its actor on ``shutdown()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tensordict import TensorDictBase
from torchrl.collectors.llm import RayLLMCollector

from ...errors import MLGymRegistryError
from ...scale.ray_resources import (
    SCHEDULE_TIMEOUT,
    check_schedulable,
    cpus_per_collector,
)
from ...scale.ray_runtime import import_ray, ray_session
from ...specs import TaskSpec
from .env_factory import EnvFactory

_UNLIMITED = 2**62
"""The frame budget ``total_frames=None`` stands for (TorchRL 0.14's Ray collector has no 'no limit' value)."""

class RayCollectorError(MLGymRegistryError, ValueError):
    """Arguments TorchRL 0.14's Ray collectors would accept but not run as meant."""


# ----------------------------------------------------------------------------------------------------------------
# the Ray runtime


def _session_for_collector() -> contextlib.ExitStack | None:
    """``None`` when Ray is initialised (the caller's: left alone); otherwise a local runtime from ``ray_session()``,
    held open by the returned stack until it is closed."""
    ray = import_ray()
    if ray.is_initialized():
        return None
    stack = contextlib.ExitStack()
    stack.enter_context(ray_session())
    return stack


def _close_with(collector: Any, stack: contextlib.ExitStack | None) -> None:
    """Make ``collector.shutdown()`` (which TorchRL also calls when a budget is spent) close ``stack`` too, and close
    it when the collector is garbage-collected or the interpreter exits."""
    if stack is None:
        return
    shutdown = collector.shutdown

    def shutdown_and_stop_ray(*args: Any, **kwargs: Any) -> Any:
        try:
            return shutdown(*args, **kwargs)
        finally:
            stack.close()

    collector.shutdown = shutdown_and_stop_ray
    weakref.finalize(collector, stack.close)


# ----------------------------------------------------------------------------------------------------------------
# Collector(backend="ray")


def _check_total(name: str, total: int | None) -> int | None:
    if total is None:
        return None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise RayCollectorError(
            f"{name} must be a positive number of frames, got {total!r}: TorchRL 0.14's Ray collector yields nothing "
            f"for -1 (its 'no limit' elsewhere) or 0. Pass a budget such as {name}=1000, or {name}=None to collect "
            f"until you break out of the loop.")
    return total


def env_factories(task_or_factory: TaskSpec | str | Callable[[], Any], count: int,
                  env_options: Mapping[str, Any] | None = None) -> list[Callable[[], Any]]:
    """``count`` env constructors that can be sent to Ray actors.

    A task name or ``TaskSpec`` (or an ``EnvFactory``) gives ``EnvFactory``s numbered 0..count-1 (the number is the
    ``env_index`` each step records), with ``env_options`` passed to ``registry.make``. Any other callable is used
    as it is, ``count`` times (``env_options`` then is an error: bind them in the callable).
    """
    if isinstance(task_or_factory, (str, TaskSpec)):
        base = EnvFactory.from_spec(task_or_factory, **dict(env_options or {}))
    elif isinstance(task_or_factory, EnvFactory):
        base = dataclasses.replace(task_or_factory, options={**task_or_factory.options, **dict(env_options or {})})
    elif callable(task_or_factory):
        if env_options:
            raise TypeError("env_options apply to a task name, a TaskSpec or an EnvFactory; bind them in your own "
                            "env constructor (e.g. functools.partial) instead")
        return [task_or_factory] * count
    else:
        raise TypeError(f"expected a task name, a TaskSpec or an env constructor, got {task_or_factory!r}")
    return [dataclasses.replace(base, index=index) for index in range(count)]


def _remote_config(remote_options: Mapping[str, Any] | None, cpus: float, gpus: float,
                   arguments: tuple[str, str]) -> dict[str, Any]:
    """``ray.remote`` options for one actor: ``remote_options`` with the CPUs and GPUs it asks for."""
    remote = dict(remote_options or {})
    for name, argument in zip(("num_cpus", "num_gpus"), arguments, strict=True):
        if name in remote:
            raise TypeError(f"pass {argument}=... instead of remote_options[{name!r}]")
    remote["num_cpus"] = cpus
    if gpus:
        remote["num_gpus"] = gpus
    return remote


def _has_weights(policy: Any) -> bool:
    import torch

    if not isinstance(policy, torch.nn.Module):
        return False
    return any(True for _ in policy.parameters()) or any(True for _ in policy.buffers())


def split_collector_kwargs(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword arguments into ``RayCollector``'s own and the per-worker collector's (``collector_kwargs``).

    TorchRL 0.14's ``Collector(backend="ray")`` hands every keyword to ``RayCollector``, which rejects the
    per-worker ones (``compact_obs``, ``use_buffers``, ``auto_register_policy_transforms``, ...) with a
    ``TypeError``. A keyword neither takes is a ``TypeError`` here, naming it.
    """
    from torchrl.collectors import Collector
    from torchrl.collectors.distributed.ray import RayCollector

    ray_names = set(inspect.signature(RayCollector.__init__).parameters) - {"self"}
    worker_names = set(inspect.signature(Collector.__init__).parameters) - {"self", "kwargs", "create_env_fn"}
    own, worker = {}, {}
    for name, value in kwargs.items():
        if name in ray_names:
            own[name] = value
        elif name in worker_names:
            worker[name] = value
        else:
            raise TypeError(f"neither TorchRL's RayCollector nor its per-worker Collector takes {name!r}")
    return own, worker


def ray_collector(
    task_or_factory: TaskSpec | str | Callable[[], Any],
    policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
    *,
    num_collectors: int,
    frames_per_batch: int,
    total_frames: int | None,
    num_cpus_per_collector: float | None = None,
    num_gpus_per_collector: float = 0,
    env_options: Mapping[str, Any] | None = None,
    remote_options: Mapping[str, Any] | None = None,
    worker_kwargs: Mapping[str, Any] | None = None,
    sync: bool = False,
    schedule_timeout: float = SCHEDULE_TIMEOUT,
    **collector_kwargs: Any,
) -> Any:
    """TorchRL's ``Collector(backend="ray", num_collectors=num_collectors, ...)`` over a task's env.

    Each of the ``num_collectors`` Ray actors builds the env (``env_factories``: for a task, ``registry.make(task,
    **env_options)`` with the ``env_index`` of the actor) and runs ``policy`` on it, ``frames_per_batch`` steps per
    batch; with ``sync=False`` batches come as each actor finishes one, with ``sync=True`` one from every actor,
    stacked. ``total_frames`` is the budget (``None``: none, stop by breaking out of the loop).

    Resources: ``num_cpus_per_collector`` (default ``cpus_per_collector``: 1 CPU, or less when that many collectors
    would not fit) and ``num_gpus_per_collector`` go to ``ray.remote`` with ``remote_options`` (``memory``,
    ``resources``, ``runtime_env``, ...); a request that cannot be placed raises ``RayResourceError`` before any actor
    starts (``check_schedulable``, which waits up to ``schedule_timeout`` seconds for busy resources).

    ``collector_kwargs`` go where TorchRL 0.14 reads them (``split_collector_kwargs``); ``worker_kwargs`` are for
    the per-worker collector only. A policy without weights (such as ``TextPolicy``) gets ``NoWeightSyncScheme``
    unless ``weight_sync_schemes`` is given. Ray: the caller's when initialised, otherwise a local runtime
    (``ray_session()``) that the collector's ``shutdown()`` stops (TorchRL calls it when the budget is spent).
    """
    from torchrl.collectors import Collector

    total = _check_total("total_frames", total_frames)
    if isinstance(num_collectors, bool) or not isinstance(num_collectors, int) or num_collectors < 1:
        raise RayCollectorError(f"num_collectors must be a positive integer, got {num_collectors!r}")
    if not isinstance(frames_per_batch, int) or frames_per_batch < 1:
        raise RayCollectorError(f"frames_per_batch must be a positive integer, got {frames_per_batch!r}")
    if sync and frames_per_batch % num_collectors:
        raise RayCollectorError(f"with sync=True each batch takes frames_per_batch // num_collectors steps from every "
                                f"collector: make frames_per_batch ({frames_per_batch}) a multiple of num_collectors "
                                f"({num_collectors})")
    own, worker = split_collector_kwargs(collector_kwargs)
    for reserved in ("remote_configs", "collector_kwargs", "ray_init_config", "num_collectors", "sync"):
        if reserved in own:
            raise TypeError(f"ray_collector sets {reserved!r} itself: use num_cpus_per_collector, "
                            f"num_gpus_per_collector, remote_options, worker_kwargs or your own Ray instead")
    worker.update(worker_kwargs or {})
    factories = env_factories(task_or_factory, num_collectors, env_options)

    stack = _session_for_collector()
    try:
        cpus = num_cpus_per_collector if num_cpus_per_collector is not None else cpus_per_collector(num_collectors)
        remote = _remote_config(remote_options, cpus, num_gpus_per_collector,
                                ("num_cpus_per_collector", "num_gpus_per_collector"))
        check_schedulable(num_collectors, remote, timeout=schedule_timeout)
        weightless = "weight_sync_schemes" not in own and "weight_updater" not in own and not _has_weights(policy)
        if weightless:
            from torchrl.weight_update import NoWeightSyncScheme

            own["weight_sync_schemes"] = {"policy": NoWeightSyncScheme()}
        collector = Collector(
            factories,
            policy,
            backend="ray",
            num_collectors=num_collectors,
            sync=sync,
            frames_per_batch=frames_per_batch,
            total_frames=_UNLIMITED if total is None else total,
            backend_options={"remote_configs": remote, "collector_kwargs": worker, **own},
        )
    except BaseException:
        if stack is not None:
            stack.close()
        raise
    # BaseCollector.__len__ (which list(collector) calls) reads this, and TorchRL 0.14's RayCollector never sets it
    collector.requested_frames_per_batch = frames_per_batch
    if weightless:
        # nothing to send: TorchRL 0.14 would warn at the first batch that weights were never synchronised, and its
        # update_policy_weights_() fails under NoWeightSyncScheme (AttributeError), so mark the sync as done
        collector._weight_sync_initialized = True
    _close_with(collector, stack)
    return collector


# ----------------------------------------------------------------------------------------------------------------
# RayLLMCollector


class ManagedRayLLMCollector(RayLLMCollector):
    """TorchRL's ``RayLLMCollector``, whose iteration ends when its ``total_dialog_turns`` are collected and whose
    ``shutdown()`` also ends its actor (and a Ray runtime ``ray_llm_collector`` started for it).

    TorchRL 0.14's own yields ``None`` for ever once the budget is spent, and leaves the actor alive (holding its CPUs)
    after ``shutdown()``. Build it with ``ray_llm_collector``.
    """

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        """Batches (``None`` for each one written to the replay buffer) until the budget is collected."""
        ray = import_ray()
        pending = None if self.sync_iter else self._next_remote()
        while True:
            batch = self.next() if pending is None else ray.get(pending)
            finished = (batch is None and self.replay_buffer is None) or self.budget_spent()
            pending = None if self.sync_iter or finished else self._next_remote()
            if batch is not None or self.replay_buffer is not None:
                yield batch
            if finished:
                return

    def budget_spent(self) -> bool:
        """Whether the remote collector has collected its ``total_dialog_turns`` (never, without a budget)."""
        return bool(import_ray().get(self._collector.stats.remote()).get("completed", False))

    def shutdown(self) -> None:
        """Shut the remote collector down (closing its env), then end its actor."""
        ray = import_ray()
        try:
            if ray.is_initialized():
                with contextlib.suppress(Exception):  # an actor that already died has nothing to shut down
                    super().shutdown()
                ray.kill(self._collector, no_restart=True)
        finally:
            stack = getattr(self, "_session_stack", None)
            if stack is not None:
                stack.close()


def ray_llm_collector(
    task_or_factory: TaskSpec | str | Callable[[], Any],
    policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
    *,
    policy_factory: Callable[[], Callable[[TensorDictBase], TensorDictBase]] | None = None,
    dialog_turns_per_batch: int,
    total_dialog_turns: int | None,
    num_cpus: float | None = None,
    num_gpus: float = 0,
    env_options: Mapping[str, Any] | None = None,
    remote_options: Mapping[str, Any] | None = None,
    schedule_timeout: float = SCHEDULE_TIMEOUT,
    **collector_kwargs: Any,
) -> ManagedRayLLMCollector:
    """TorchRL's ``RayLLMCollector`` over a task's env: one Ray actor runs an ``LLMCollector`` with ``policy`` (or
    what ``policy_factory()`` builds in the actor) on the env (for a task, ``registry.make(task, **env_options)``,
    batch size ``(1,)`` as ``LLMCollector`` wants; an LLM policy needs ``env_options={"tokenizer": ...}``).

    ``total_dialog_turns`` is the budget of turns (``None``: none); iteration stops there. ``num_cpus`` defaults to
    ``cpus_per_collector(1)``; with ``num_gpus`` and ``remote_options`` it goes to ``ray.remote``, checked first by
    ``check_schedulable``. ``collector_kwargs`` go to ``RayLLMCollector`` (``yield_completed_trajectories``,
    ``replay_buffer``, ``sync_iter``, ...). Ray: the caller's when initialised, otherwise a local runtime
    (``ray_session()``) that ``shutdown()`` stops.
    """
    if total_dialog_turns is not None and (not isinstance(total_dialog_turns, int) or total_dialog_turns <= 0):
        raise RayCollectorError(f"total_dialog_turns must be a positive number of turns, got {total_dialog_turns!r}; "
                                f"pass total_dialog_turns=None to collect until you break out of the loop")
    if not isinstance(dialog_turns_per_batch, int) or dialog_turns_per_batch < 1:
        raise RayCollectorError(f"dialog_turns_per_batch must be a positive integer, got {dialog_turns_per_batch!r}")
    for reserved in ("ray_init_config", "remote_config", "num_cpus", "num_gpus"):
        if reserved in collector_kwargs:
            raise TypeError(f"ray_llm_collector sets {reserved!r} itself: use num_cpus, num_gpus, remote_options or "
                            f"your own Ray instead")
    (factory,) = env_factories(task_or_factory, 1, env_options)

    stack = _session_for_collector()
    try:
        cpus = num_cpus if num_cpus is not None else cpus_per_collector(1)
        remote = _remote_config(remote_options, cpus, num_gpus, ("num_cpus", "num_gpus"))
        check_schedulable(1, remote, timeout=schedule_timeout)
        collector = ManagedRayLLMCollector(
            factory,
            policy=policy,
            policy_factory=policy_factory,
            dialog_turns_per_batch=dialog_turns_per_batch,
            total_dialog_turns=-1 if total_dialog_turns is None else total_dialog_turns,
            remote_config=remote,
            **collector_kwargs,
        )
    except BaseException:
        if stack is not None:
            stack.close()
        raise
    collector._session_stack = stack
    if stack is not None:
        weakref.finalize(collector, stack.close)
    return collector
