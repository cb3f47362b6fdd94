"""The local backend's options and their rules: the keyword arguments of ``LocalBackend``, checked by the core at
``registry.make`` (``LocalBackend.option_rules``) before the backend is built."""

from __future__ import annotations

import os

from ...held_out import VALIDATION_ROWS
from ...options import BOOLEAN, FOLDER, SEED, Rule, instance_of, integer_at_least, one_of, positive_number
from . import sandbox as sandbox_mod

LOCAL_OPTION_RULES: dict[str, Rule] = {
    "command_timeout": positive_number(),
    "long_timeout": positive_number(optional=True),
    "max_output_chars": integer_at_least(1),
    "memory_limit_mb": integer_at_least(1, optional=True),
    "cpu_seconds": integer_at_least(1, optional=True),
    "max_processes": integer_at_least(1, optional=True),
    "max_file_mb": integer_at_least(1, optional=True),
    "max_snapshot_mb": integer_at_least(1, optional=True),
    "max_disk_mb": integer_at_least(1, optional=True),
    "seed": SEED,
    "network": BOOLEAN,
    "sandbox": one_of(*sandbox_mod.SANDBOX_MODES),
    "workspace_dir": FOLDER,
    "python": instance_of("an interpreter path", str, os.PathLike, optional=True),
    "data_dir": FOLDER,
    "gpus": BOOLEAN,
    "trust_agent_code": BOOLEAN,
    "validation_rows": one_of(*VALIDATION_ROWS),
}
"""The rule of each ``LocalBackend`` option, by name."""
