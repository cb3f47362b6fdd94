"""What this machine gives the process: the cores it may run on, and the folder where the package keeps what it
makes on it (``cache_root``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_FOLDER = "mlgym-registry"
"""The name of the package's folder in the user's cache folder."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one, else every core), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def cache_root() -> Path:
    """The one folder under which the package keeps what it makes on this machine (prepared data, environments,
    generated task data, integrity reports): ``$XDG_CACHE_HOME/mlgym-registry``, else ``~/.cache/mlgym-registry``.
    Each of its users may have a variable of its own that moves its part elsewhere."""
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache).expanduser() / CACHE_FOLDER
