"""Whether the env that owns a folder still lives: its owner holds a lock on the folder's ``owner.pid`` for as long as
it does (``resources.hold_owner_lock``). Locks, unlike pids, mean the same in every PID namespace."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def owner_lives(owner_file: Path) -> bool | None:
    """True when the lock on ``owner_file`` is held (its env lives), False when it could be taken (an orphan), None
    when the file cannot be opened (gone meanwhile, or not readable)."""
    try:
        fd = os.open(owner_file, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
