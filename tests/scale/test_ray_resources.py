"""Sizing what Ray actors ask for to the cluster's nodes (``scale/ray_resources.py``), from the nodes' resources
alone (no runtime: what a real cluster refuses is in tests/interop/torchrl/test_ray_collectors.py)."""

from __future__ import annotations

import pytest

from mlgym_registry.scale.ray_resources import NodeResources, RayResourceError, cpus_per_collector


def test_default_cpus_fit_the_nodes():
    two = [NodeResources("a", {"CPU": 2.0}, {"CPU": 2.0})]
    assert cpus_per_collector(2, two) == 1.0
    assert cpus_per_collector(4, two) == 0.5
    assert cpus_per_collector(3, two) == 0.66  # 3 x 0.67 would not fit on 2 CPUs
    uneven = [NodeResources("a", {"CPU": 1.0}, {"CPU": 1.0}), NodeResources("b", {"CPU": 0.5}, {"CPU": 0.5})]
    assert cpus_per_collector(2, uneven) == 0.5  # 1 CPU each would leave one collector without a node
    with pytest.raises(RayResourceError, match="no CPUs"):
        cpus_per_collector(1, [NodeResources("gpu-only", {"GPU": 1.0}, {"GPU": 1.0})])
