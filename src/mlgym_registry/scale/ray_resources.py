"""What Ray actors ask for, and whether the cluster can place them: an actor that asks for more than the cluster
has stays pending, and whoever waits for it (TorchRL 0.14's Ray collectors, ``ray_episodes``' actors) waits for ever,
so each request is sized to the cluster's nodes (``cpus_per_collector``) and checked before anything starts
(``check_schedulable``, ``RayResourceError``). Ray's alone: the TorchRL collectors over it are in
``interop/torchrl/ray_collectors.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .ray_runtime import RayConnectionError, import_ray

SCHEDULE_TIMEOUT = 10.0
"""Seconds to wait for busy resources to free up (e.g. a previous collector's actors ending) before giving up."""

DEFAULT_CPUS_PER_COLLECTOR = 1.0
"""CPUs a collector asks for when the cluster has them (one env and its policy run in one process)."""

_CPU_STEP = 0.01
"""Smallest CPU share the default sizing gives a collector."""

_REMOTE_RESOURCE_NAMES = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


class RayResourceError(RayConnectionError):
    """What the actors ask for cannot be placed on the cluster (TorchRL would wait for it forever)."""


@dataclasses.dataclass(frozen=True)
class NodeResources:
    """One alive node's resources: all it has, and what is free now."""

    node_id: str
    total: dict[str, float]
    available: dict[str, float]


def node_resources() -> list[NodeResources]:
    """The alive nodes of the cluster Ray is connected to, with their total and free resources."""
    ray = import_ray()
    available: dict[str, dict[str, float]] = {}
    with contextlib.suppress(ImportError, AttributeError):
        from ray._private.state import available_resources_per_node  # no public per-node view in Ray 2.x

        available = {node: dict(values) for node, values in available_resources_per_node().items()}
    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        total = {name: float(value) for name, value in node.get("Resources", {}).items()}
        free = available.get(node["NodeID"], total)
        nodes.append(NodeResources(node["NodeID"], total, {name: float(value) for name, value in free.items()}))
    return nodes


def resource_request(remote_options: Mapping[str, Any]) -> dict[str, float]:
    """The resources one actor made with ``ray.remote(**remote_options)`` asks for, by Ray's resource names."""
    request = {}
    for option, name in _REMOTE_RESOURCE_NAMES.items():
        value = remote_options.get(option)
        if value:
            request[name] = float(value)
    for name, value in (remote_options.get("resources") or {}).items():
        if value:
            request[name] = float(value)
    return request


def _actors_that_fit(resources: Mapping[str, float], request: Mapping[str, float]) -> int:
    """How many actors asking for ``request`` one node with ``resources`` can hold."""
    counts = [math.floor(resources.get(name, 0.0) / amount + 1e-9) for name, amount in request.items() if amount > 0]
    return min(counts) if counts else 1_000_000


def _fits(nodes: Sequence[Mapping[str, float]], request: Mapping[str, float], count: int) -> bool:
    return sum(_actors_that_fit(node, request) for node in nodes) >= count


def cpus_per_collector(num_collectors: int, nodes: Sequence[NodeResources] | None = None) -> float:
    """The CPUs to give each of ``num_collectors`` actors: ``DEFAULT_CPUS_PER_COLLECTOR`` when the cluster's nodes
    can hold that many at once, otherwise the largest share (in steps of 0.01 CPU) that they can; never more than the
    largest alive node has. Sized on the nodes' total CPUs; ``check_schedulable`` then checks what is free.
    """
    nodes = node_resources() if nodes is None else nodes
    totals = [node.total for node in nodes]
    largest = max((node.get("CPU", 0.0) for node in totals), default=0.0)
    if largest <= 0:
        raise RayResourceError("the Ray cluster has no CPUs on any alive node: a collector cannot run there")
    steps = math.floor(min(DEFAULT_CPUS_PER_COLLECTOR, largest) / _CPU_STEP + 1e-9)
    while steps > 0 and not _fits(totals, {"CPU": steps * _CPU_STEP}, num_collectors):
        steps -= 1
    if steps == 0:
        raise RayResourceError(f"{num_collectors} collectors do not fit on the cluster's CPUs "
                               f"({_describe(nodes, 'CPU')}), even at {_CPU_STEP} CPU each; use fewer collectors")
    return round(steps * _CPU_STEP, 2)


def check_schedulable(num_actors: int, remote_options: Mapping[str, Any], *,
                      timeout: float = SCHEDULE_TIMEOUT) -> None:
    """Raise ``RayResourceError`` unless ``num_actors`` actors made with ``ray.remote(**remote_options)`` can all be
    placed on the alive nodes.

    A request larger than every node is refused at once; one the nodes could hold but whose resources are busy is
    retried for up to ``timeout`` seconds (actors that were just killed give theirs back a moment later).
    """
    request = resource_request(remote_options)
    if not request:
        return
    nodes = node_resources()
    for name, amount in request.items():
        largest = max((node.total.get(name, 0.0) for node in nodes), default=0.0)
        if amount > largest + 1e-9:
            raise RayResourceError(
                f"each actor asks for {amount:g} {name}, but the largest alive node has {largest:g} "
                f"({_describe(nodes, name)}); ask for at most {largest:g} per collector"
                + (" (num_cpus_per_collector)" if name == "CPU" else "")
                + ", or add a bigger node. TorchRL 0.14 would wait for it forever.")
    if not _fits([node.total for node in nodes], request, num_actors):
        raise RayResourceError(
            f"{num_actors} actors asking for {_format_request(request)} each do not fit on the cluster's nodes "
            f"({_describe(nodes, *request)}); use fewer collectors or smaller requests. TorchRL 0.14 would wait "
            f"for them forever.")
    deadline = time.monotonic() + timeout
    while not _fits([node.available for node in nodes], request, num_actors):
        if time.monotonic() >= deadline:
            raise RayResourceError(
                f"{num_actors} actors asking for {_format_request(request)} each cannot be placed now: other "
                f"actors or tasks hold the resources ({_describe(nodes, *request)}), and none came free within "
                f"{timeout:g} s. End them, or ask for less (e.g. num_cpus_per_collector=...). TorchRL 0.14 would "
                f"wait for them forever.")
        time.sleep(0.25)
        nodes = node_resources()


def _format_request(request: Mapping[str, float]) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in request.items())


def _describe(nodes: Sequence[NodeResources], *names: str) -> str:
    """``node abc123: 1/2 CPU free`` for each node."""
    parts = []
    for node in nodes:
        free = ", ".join(f"{node.available.get(name, 0.0):g}/{node.total.get(name, 0.0):g} {name}" for name in names)
        parts.append(f"node {node.node_id[:8]}: {free} free")
    return "; ".join(parts) or "no alive node"
