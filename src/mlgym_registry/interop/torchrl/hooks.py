"""What TorchRL's interop does as an env is built and as an env factory is pickled: the hooks the package's front
door registers in ``env_hooks``. Nothing is imported, and nothing done, unless TorchRL's pools or batched envs are
loaded in this process (no env of ours can be theirs otherwise)."""

from __future__ import annotations

import sys
from typing import Any

POOL_MODULE = "torchrl.envs.async_envs"
"""TorchRL's module of ``AsyncEnvPool``."""

BATCHED_MODULE = "torchrl.envs.batched_envs"
"""TorchRL's module of ``ParallelEnv`` and its worker loops."""


def env_built(env: Any) -> None:
    """Give ``env`` the output form of the TorchRL pool or worker loop that drives it, if one does
    (``drivers.attach``)."""
    if POOL_MODULE in sys.modules or BATCHED_MODULE in sys.modules:
        from .drivers import attach

        attach(env)


def factory_pickled() -> None:
    """An env factory is being pickled, maybe by a multiprocessing ``AsyncEnvPool`` sending it to its worker: that
    pool is adopted (``pools.adopt_constructing_pool``), so that closing it closes its envs."""
    if POOL_MODULE in sys.modules:
        from .pools import adopt_constructing_pool

        adopt_constructing_pool()
