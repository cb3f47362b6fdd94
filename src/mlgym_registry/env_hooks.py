"""What the layers above the chain do with the envs it builds, without the chain or the registry knowing them.

Two moments are announced here: an env is built (``ChainEnv.__init__`` calls ``env_built(env)``), and an env
factory leaves this process (the registry, or a factory holding it, is pickled for a worker: ``factory_pickled()``).
The package's front door (``__init__.py``) registers the hooks of the layers above, which every import of the package
runs first; each hook decides for itself whether it has anything to do. Nothing here imports anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ENV_BUILT: list[Callable[[Any], None]] = []
"""Called with each env the chain builds, once, at the end of its construction."""

FACTORY_PICKLED: list[Callable[[], None]] = []
"""Called each time an env factory (the registry, ``EnvFactory``) is pickled, maybe for another process."""


def env_built(env: Any) -> None:
    """Run every ``ENV_BUILT`` hook on ``env``, in the order they were registered."""
    for hook in ENV_BUILT:
        hook(env)


def factory_pickled() -> None:
    """Run every ``FACTORY_PICKLED`` hook, in the order they were registered."""
    for hook in FACTORY_PICKLED:
        hook()
