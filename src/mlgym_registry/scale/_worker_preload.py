"""Imported by the fork server of ``workers.py`` before it forks any worker: the modules every worker needs.

Each import is tried on its own and a failure is ignored (the worker then imports that module itself, as a spawned
worker would, and reports any error where it happens). Nothing is registered or built here: importing the registry
module creates the empty registry, and each worker loads its plugins when it first uses it.
"""

from __future__ import annotations

import gc
import importlib

MODULES = (
    "torch",
    "tensordict",
    "torchrl",
    "torchrl.collectors",
    "torchrl.envs",
    "transformers",
    "mlgym_registry.registry",
    "mlgym_registry.interop.torchrl.collectors",
    "mlgym_registry.interop.torchrl.drivers",
    "mlgym_registry.transforms.chain",
    "mlgym_registry.transforms",
    "mlgym_registry.backends.local.backend",
    "mlgym_registry.policies.scripted",
    "mlgym_registry.scale.process_episodes",
)
"""What the fork server imports, in this order."""

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 - the worker imports it again and reports the error there
        pass

# Everything imported so far is shared with the workers, page for page, until a worker's garbage collector writes to
# those objects' headers and so copies their pages: 28 MiB of private memory per worker after 20 turns, 125 MiB after
# 50. Frozen objects are never collected, so the pages stay shared (42 MiB after 50 turns).
gc.freeze()
