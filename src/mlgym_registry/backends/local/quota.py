"""Each env's own disk quota, and whose failure a full disk is.

An env's disk is its workspace and the copy of it that each evaluation makes (``evaluation.py``). The quota bounds
what the agent put there: its files, and their copy, together at most ``limit`` bytes. The task's own files in the
workspace (its datasets, the evaluation files, as they were at reset) are not the agent's and do not count; what the
agent adds to them does.

It is a checked budget, not a file system of its own (which only a privileged driver could mount): every evaluation
measures the workspace as it copies it and stops at the quota, and that is the agent's failure (``WorkspaceTooLarge``,
an invalid submission). Between evaluations, ``disk_guard`` stops the agent's processes once its files take more
than the quota, within a second or so of their going over it; a command cannot write a file over ``max_file_mb``
(``RLIMIT_FSIZE``) in any case.

Envs share a disk. Each is given, at admission (``make``), at most its fair share of it: the disk's free space then,
divided among the live envs whose folders are in the same ``workspace_dir`` (this one included, in any process); a
quota larger than that is lowered to it, with a warning, and an env whose share is under ``MIN_SHARE_MB`` is refused
(``DiskShareTooSmall``). As envs come, an earlier env's quota shrinks to its fair share now (its free space at
admission divided among the envs sharing the disk now: ``effective``), for the disk guard and every evaluation alike,
so summed quotas never promise more than the disk had. When an evaluation finds the disk full, whose failure it is
comes from the env's own account: an env whose files take more than that quota filled it, its failure; an env
within it did not: someone else filled the disk, the host's failure, ``infra_error``.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import BackendUnavailable
from . import trees
from .owners import owner_lives

DEFAULT_SPARE_MB = 2048
"""``max_disk_mb`` defaults to two files of the largest size a command may write (``max_file_mb``: one in the
workspace, one in its copy) and this much more."""


MIN_SHARE_MB = 16
"""The least disk an env is admitted with (its workspace, task files and an evaluation's copy of them)."""

SHARE_PERIOD = 5.0
"""The longest ``DiskQuota.fair_share`` goes without counting the envs that share the disk again."""

ENV_FOLDER_PREFIX = "mlgym-registry-"
OWNER_FILE = "owner.pid"
"""How a live env's folder is told (``resources``: its owner holds a lock on ``owner.pid`` while it lives)."""


_LOWERED: set[str] = set()
"""The env folders where this process lowered a quota (and warned about it)."""


class DiskShareTooSmall(BackendUnavailable):
    """The disk of ``workspace_dir`` has too little free space for one more env."""


def sharing_envs(parent: Path) -> int:
    """How many live envs have their folders in ``parent`` (their owners hold the lock on ``owner.pid``; in every
    process of this machine)."""
    try:
        owners = list(parent.glob(f"{ENV_FOLDER_PREFIX}*/{OWNER_FILE}"))
    except OSError:
        return 1
    count = sum(1 for owner in owners if owner_lives(owner))
    return max(count, 1)


def default_disk_mb(max_file_mb: int | None, default_file_mb: int) -> int:
    """The default quota: room for a workspace holding one file of ``max_file_mb`` and its evaluation copy, and
    ``DEFAULT_SPARE_MB`` more (10240 MB with the default ``max_file_mb`` of 4096)."""
    return 2 * (max_file_mb or default_file_mb) + DEFAULT_SPARE_MB


@dataclass
class DiskQuota:
    """The disk quota of one env: ``limit`` bytes for the agent's files in ``workspace`` and the copy of them that an
    evaluation makes."""

    limit: int
    workspace: Path
    task_bytes: dict[str, int] = field(default_factory=dict)
    """What each of the task's own paths in the workspace (the keys of ``WorkspaceFiles.pristine``) took at reset."""
    outside: list[Path] = field(default_factory=list)
    """Folders of the env outside the workspace that the agent writes to and evaluations do not copy (the writable
    part of its datasets cache, ``hub_cache``): what they hold counts once."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held while the driver walks or changes the workspace (an evaluation's copy, a reset): ``check`` then waits
    for its next turn rather than walk it at the same time."""
    enforcing: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held while ``disk_guard.enforce`` checks the env and stops its processes: the guard's thread and the driver
    (between two commands) never do it at the same time, so that once the driver's check ends, any stop is over."""
    exceeded_seen: bool = False
    """Set when ``disk_guard`` stopped the agent's processes for going over the quota (the next observation says so)."""
    stopped_at: int = 0
    """What the env took when ``disk_guard`` last stopped its processes: it stops them again only past that (the
    agent must be able to run ``rm`` while it is still over). A reset sets it back to 0."""
    admitted_free: int | None = field(default=None, init=False)
    """The disk's free space when the env was admitted (None: it cannot be told)."""
    _free_then: int | None = field(default=None, repr=False)
    _room: int = field(default=0, repr=False)
    _next_walk: float = field(default=0.0, repr=False)
    _share: tuple[float, int | None] = field(default=(-SHARE_PERIOD, None), repr=False)

    def __post_init__(self) -> None:
        self.admit()

    @property
    def env_folders(self) -> Path:
        """Where the env's folder and those of the envs sharing its disk are (its ``workspace_dir``)."""
        return self.workspace.parent.parent

    def fair_share(self, fresh: bool = True) -> int | None:
        """The env's fair share of its disk now: its free space at admission divided among the envs sharing the
        disk now (None when the free space could not be told). ``fresh=False`` (the disk guard's twice a second)
        counts the envs again at most every ``SHARE_PERIOD`` seconds."""
        if self.admitted_free is None:
            return None
        now = time.monotonic()
        if fresh or now - self._share[0] >= SHARE_PERIOD:
            self._share = (now, self.admitted_free // sharing_envs(self.env_folders))
        return self._share[1]

    def effective(self, fresh: bool = True) -> int:
        """The env's quota now: ``limit``, or its fair share of the disk when envs that came since made that smaller
        (so that the quotas of the envs on a disk never add up to more than it had free)."""
        share = self.fair_share(fresh)
        return self.limit if share is None else min(self.limit, share)

    def admit(self) -> None:
        """Give the env at most its fair share of the disk: lower ``limit`` to it with a warning, or refuse the env
        (``DiskShareTooSmall``) when the share is under ``MIN_SHARE_MB``."""
        self.admitted_free = _free_bytes(self.workspace)
        share = self.fair_share()
        if share is None or share >= self.limit:
            return
        envs = sharing_envs(self.env_folders)
        where = (f"the disk of {self.env_folders} has {self.admitted_free >> 20} MB free for {envs} env(s), "
                 f"{share >> 20} MB each")
        if share >> 20 < MIN_SHARE_MB:
            raise DiskShareTooSmall(
                f"local backend: {where}, less than the {MIN_SHARE_MB} MB an env needs at least; free space there, "
                "close other envs, or give them another folder (workspace_dir=) on a disk with room")
        if str(self.env_folders) not in _LOWERED:  # once per folder and process: every env there is lowered alike
            _LOWERED.add(str(self.env_folders))
            warnings.warn(f"local backend: {where}: this env's disk quota (max_disk_mb) is lowered from "
                          f"{self.limit >> 20} to {share >> 20} MB (and so is any other env's made there whose share "
                          "is smaller than its quota), so that the envs' quotas never promise more than the disk has; "
                          "give workspace_dir more room, or run fewer envs on it, for more", RuntimeWarning,
                          stacklevel=4)
        self.limit = share

    @property
    def limit_mb(self) -> int:
        """The quota now in MB (``effective``)."""
        return self.effective() >> 20

    def record_task_files(self, relatives: list[str]) -> None:
        """Measure the task's own paths in the workspace (after a reset filled it): they are not the agent's."""
        outermost = [r for r in relatives if not any(r.startswith(other.rstrip("/") + "/") for other in relatives)]
        self.task_bytes = {relative: trees.disk_usage(self.workspace, relative) for relative in outermost}

    def added_to_task_files(self, budget: trees.CopyBudget | None = None) -> int:
        """What the task's paths in the workspace take now beyond what they took at reset (the agent's additions)."""
        return sum(max(0, trees.disk_usage(self.workspace, relative, budget) - before)
                   for relative, before in self.task_bytes.items())

    def copy_allowance(self, deadline: float | None) -> int:
        """The most disk the agent's files outside the task's paths may take, so that they, their copy and what the
        agent added to the task's paths fit in the quota. Measuring the task's paths stops at ``deadline``
        (``CopyTimeout``) and at folders nested deeper than a copy allows (``TooLarge``)."""
        budget = trees.CopyBudget(max_files=None, deadline=deadline)  # a dataset's files are not the copy's
        return max(0, (self.effective() - self.added_to_task_files(budget) - self.outside_usage()) // 2)

    def usage(self) -> int:
        """What the agent's files in the workspace take now: all of it but the task's files as they were at reset
        (what the agent added to those counts), less what lies more than ``trees.MAX_DEPTH`` folders deep (which no
        evaluation copies), and what the ``outside`` folders hold. The evaluations' copies are bounded apart
        (``copy_allowance``)."""
        return self.workspace_usage() + self.outside_usage()

    def workspace_usage(self) -> int:
        """What the agent's files in the workspace take now (``usage`` less the ``outside`` folders)."""
        return max(0, trees.disk_usage(self.workspace) - sum(self.task_bytes.values()))

    def outside_usage(self) -> int:
        """What the ``outside`` folders hold now."""
        return sum(trees.disk_usage(folder) for folder in self.outside)

    def exceeded(self) -> bool:
        """Whether the agent's files and the copy an evaluation makes of them take more than the quota or the env's
        fair share of the disk now (``fair_share``): a write that found the disk full was then the agent's doing.
        False when that cannot be measured (this process is out of descriptors or memory, the disk fails): nothing
        then shows that the agent is to blame."""
        bound = self.effective()
        try:
            with self.lock:
                added = self.workspace_usage()  # the task's paths, added to or not, are never copied:
                return 2 * added - self.added_to_task_files() + self.outside_usage() > bound
        except OSError:
            return False

    def check(self, periodic: bool = True) -> bool:
        """Whether the env takes more than its quota now, and more than when it was last stopped for it (for
        ``disk_guard.enforce``; it then sets ``stopped_at``). The workspace is walked only when it may be over: when
        the disk's free space fell by more than the env's room since the last walk, and, when ``periodic`` (the
        guard's thread), at least every ``WALK_PERIOD`` seconds (more rarely for a workspace whose walk takes long),
        so that space others freed meanwhile cannot hide the env's growth for long. Without ``periodic`` (the driver,
        after each command) only that fall makes it walk (and the first check of all), which a ``statvfs`` call tells.
        False while a copy or reset is under way."""
        free = _free_bytes(self.workspace)
        now = time.monotonic()
        if free is None:
            if not periodic:
                return False  # the disk cannot say whether the env may be over: the guard's thread walks it in time
        elif self._free_then is not None and self._free_then - free <= self._room and (
                not periodic or now < self._next_walk):
            return False
        if not self.lock.acquire(blocking=False):
            return False
        try:
            started = time.monotonic()
            try:
                usage = self.usage()
            except OSError:
                return False
            took = time.monotonic() - started
        finally:
            self.lock.release()
        bound = max(self.effective(fresh=False), self.stopped_at)
        self._free_then, self._room = free, max(0, bound - usage)
        self._next_walk = now + max(WALK_PERIOD, 100 * took)  # the walks take at most about 1% of a core
        if usage <= bound:
            return False
        self.stopped_at = usage
        return True

    def stopped(self) -> None:
        """``disk_guard`` stopped the env's processes and they are gone: what they wrote until then is what the env
        took when stopped (``stopped_at``), so that their last writes, landing after the measure that stopped them,
        cannot stop the env's next shell too."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            self.stopped_at = max(self.stopped_at, self.usage())
        except OSError:
            pass
        finally:
            self.lock.release()


WALK_PERIOD = 30.0
"""The longest ``DiskQuota.check`` goes without measuring the workspace."""


def _free_bytes(path: Path) -> int | None:
    """Free space on the file system of ``path`` (None when it cannot be told)."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize
