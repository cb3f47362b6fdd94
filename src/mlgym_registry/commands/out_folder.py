"""The ``--out`` folder of a run: a new one by default, used by one run at a time (an exclusive lock while it runs),
and refused when it already holds a run."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..errors import MLGymRegistryError


def default_out(stem: str) -> Path:
    """``runs/<stem>-<time>``, or ``runs/<stem>-<time>-<n>`` when a run started in the same second took that."""
    base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, number = base, 1
    while candidate.exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


LOCK_NAME = ".mlgym-registry.lock"
"""The file in ``--out`` a run holds an exclusive ``flock`` on while it runs (removed when it ends)."""

RUN_FILES = ("*.traj", "results.json", "replay-report.json")
"""Files that show a folder already holds a run (at its top, or in a sub-folder such as ``env<i>/``)."""

LOCK_ATTEMPTS = 20


class OutFolderError(MLGymRegistryError):
    """An ``--out`` folder this run may not write to: a file, a folder that holds a run, or one in use."""


class OutFolder:
    """Exclusive use of an ``--out`` folder for one run, as a context manager.

    On entry the folder is created when missing, locked (``flock`` on ``LOCK_NAME``; the kernel drops the lock when
    the process dies, so a killed run never blocks the folder) and checked to hold no earlier run; any of these
    failing raises ``OutFolderError``. On exit the lock file is removed, and the folder too when this run created it
    and wrote nothing. A run that finds the lock taken fails at once rather than wait: of several runs started with
    the same ``--out`` exactly one proceeds. With ``resume`` a folder holding earlier runs is accepted (a suite
    continues where it stopped).
    """

    def __init__(self, path: Path, *, resume: bool = False):
        self.path = Path(path)
        self.resume = resume
        self.lock_path = self.path / LOCK_NAME
        self._fd: int | None = None
        self._created = False

    def __enter__(self) -> OutFolder:
        self.claim()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def claim(self) -> None:
        """Create, lock and check the folder (``OutFolderError`` when this run may not use it)."""
        self._make_folder()
        self._lock()
        if self.resume:
            return
        try:
            found = existing_run(self.path)
        except OSError as exc:
            self.release()
            raise self._error(f"cannot be read ({exc.strerror or exc}); choose another --out") from None
        if found is not None:
            self.release()
            raise self._error(f"already holds a run ({found}); choose another --out or remove that folder")

    def release(self) -> None:
        """Remove the lock file (while still holding the lock), unlock, and remove the folder if this run made it
        and it is empty."""
        if self._fd is None:
            return
        try:
            self.lock_path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
        if self._created:
            try:
                self.path.rmdir()
            except OSError:
                pass  # the run wrote something: keep it

    def _error(self, problem: str) -> OutFolderError:
        return OutFolderError(f"--out {str(self.path)!r} {problem}")

    def _make_folder(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise self._error("is a file, not a folder; choose another --out")
        try:
            self.path.mkdir(parents=True)
            self._created = True
        except FileExistsError:
            if not self.path.is_dir():
                raise self._error("is a file, not a folder; choose another --out") from None
        except OSError as exc:
            raise self._error(f"cannot be created ({exc.strerror or exc}); choose another --out") from None

    def _lock(self) -> None:
        """Hold an exclusive lock on the lock file that is at ``lock_path`` now.

        A run removes its lock file before unlocking, so a lock won on a file already removed is worth nothing:
        try again on the new file.
        """
        for _ in range(LOCK_ATTEMPTS):
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # the run that created the folder removed it on the way out
                self._make_folder()
                continue
            except OSError as exc:
                raise self._error(f"cannot be written to ({exc.strerror or exc}); choose another --out") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._error("is in use by another run right now; choose another --out") from None
            if _same_file(fd, self.lock_path):
                self._fd = fd
                return
            os.close(fd)
        raise self._error("is in use by another run right now; choose another --out")


def _same_file(fd: int, path: Path) -> bool:
    """True when the open file ``fd`` is the file at ``path``."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def existing_run(folder: Path) -> Path | None:
    """A file of an earlier run in ``folder`` or one of its sub-folders (``env<i>/``), or None."""
    places = [folder, *sorted(child for child in folder.iterdir() if child.is_dir())]
    for place in places:
        for pattern in RUN_FILES:
            for match in sorted(place.glob(pattern)):
                if match.is_file():
                    return match
    return None
