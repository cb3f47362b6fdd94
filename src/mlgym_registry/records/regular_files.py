"""Reading files of run folders (and paths a user names) that may be anything: regular files only, bounded.

A run folder may come from anywhere, and readers of it (``report``, ``replay``, ``show``) must finish: a FIFO blocks
``open`` until a writer comes, ``/dev/zero`` or a growing file never ends, a socket cannot be opened, a folder is no
file. So every such read goes through ``open_regular`` (or ``read_regular``):

- the path is ``stat``-ed first and anything but a regular file (FIFO, socket, device, folder; a symlink to one of
  those) is refused with ``IrregularFile`` naming it and its kind, never opened;
- it is then opened with ``O_NONBLOCK`` (a FIFO swapped in after the ``stat`` cannot block the ``open``) and
  checked again with ``fstat`` on the open descriptor, which is what is read;
- ``read_regular`` reads at most ``MAX_FILE_BYTES``, and refuses a larger (or growing) file with ``FileTooLarge``.

Symlinks are followed to a regular file: a reader gets nothing through one that it could not read anyway, and run
folders are often assembled with links. Inside a folder the user named (``within``), a link resolving outside that
folder is refused instead (``OutsideFolder``): a run folder from elsewhere is read as itself and cannot make a
report quote files of the reader's own. All three errors are ``OSError``s, so readers that already skip unreadable
files skip these the same way.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

MAX_FILE_BYTES = 256 * 1024 * 1024
"""The most a reader reads of one file: 256 MiB (MLGym's published ``.traj`` files are under 1 MB)."""

CHUNK_BYTES = 1024 * 1024
"""How much ``read_regular`` asks for at a time."""

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class IrregularFile(OSError):
    """A path that is not a regular file, or one a reader refuses; ``str()`` names the path and why."""

    def __init__(self, path: str | Path, reason: str, code: int = errno.EINVAL):
        super().__init__(code, reason, str(path))
        self.path, self.reason = Path(path), reason

    def __str__(self) -> str:
        return f"{str(self.path)!r} {self.reason}"


class FileTooLarge(IrregularFile):
    """A regular file larger than the reader's cap (``MAX_FILE_BYTES`` unless told)."""


class OutsideFolder(IrregularFile):
    """A symlink inside a folder being read that resolves outside it."""


def kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (``"a FIFO (named pipe)"``, ``"a regular file"``, ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_regular(path: str | Path, within: str | Path | None = None) -> os.stat_result:
    """The ``stat`` of ``path`` (symlinks followed) when it is a regular file (inside ``within`` when given);
    ``IrregularFile`` otherwise, ``FileNotFoundError`` (and other ``OSError``s) as ``os.stat`` raises them."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise IrregularFile(path, _not_regular(path, info.st_mode))
    if within is not None:
        _check_within(path, os.path.realpath(path), within)
    return info


@contextmanager
def open_regular(path: str | Path, within: str | Path | None = None) -> Iterator[BinaryIO]:
    """``path`` open for reading in binary, when it is a regular file (see the module); never blocks on opening."""
    check_regular(path, within)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise IrregularFile(path, _not_regular(path, mode))
        if within is not None:
            _check_within(path, _opened_path(fd, path), within)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def read_regular(path: str | Path, limit: int = MAX_FILE_BYTES, within: str | Path | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: ``FileTooLarge`` for a larger file."""
    chunks, size = [], 0
    with open_regular(path, within) as handle:
        if os.fstat(handle.fileno()).st_size > limit:
            raise _too_large(path, limit)
        while size <= limit:  # a file growing while it is read stops at the cap too
            try:
                chunk = handle.read(min(CHUNK_BYTES, limit + 1 - size))
            except BlockingIOError:
                chunk = None
            if chunk is None:  # a pseudo-file that would block (it stays non-blocking while read)
                raise IrregularFile(path, "has nothing to read without waiting (a pseudo-file?)", errno.EAGAIN)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > limit:
        raise _too_large(path, limit)
    return b"".join(chunks)


def read_regular_text(path: str | Path, limit: int = MAX_FILE_BYTES, within: str | Path | None = None,
                      encoding: str = "utf-8") -> str:
    """``read_regular`` decoded (``UnicodeDecodeError`` for text that is not in ``encoding``)."""
    return read_regular(path, limit, within).decode(encoding)


def split_regular(paths: Iterable[str | Path], within: str | Path | None = None) -> tuple[list[Path], list[str]]:
    """``paths`` split into the regular files (inside ``within`` when given) and, for every other one, a line
    naming it and why (for a warning); nothing is opened."""
    regular, skipped = [], []
    for path in paths:
        try:
            check_regular(path, within)
        except OSError as exc:
            skipped.append(str(exc) if isinstance(exc, IrregularFile) else f"{str(path)!r} cannot be read ({exc})")
        else:
            regular.append(Path(path))
    return regular, skipped


def _not_regular(path: str | Path, mode: int) -> str:
    through = " (through a symlink)" if os.path.islink(path) else ""
    return f"is {kind(mode)}{through}, not a regular file (never opened)"


def _too_large(path: str | Path, limit: int) -> FileTooLarge:
    return FileTooLarge(path, f"is larger than {limit:,} bytes, the most read of one file", errno.EFBIG)


def _opened_path(fd: int, path: str | Path) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")  # the file actually opened, whatever the links did meanwhile
    except OSError:
        return os.path.realpath(path)


def _check_within(path: str | Path, real: str, within: str | Path) -> None:
    folder = os.path.realpath(within)
    if os.path.commonpath([folder, real]) != folder:
        raise OutsideFolder(path, f"is a symlink out of {str(within)!r} (to {real!r}); a folder of runs is read "
                                  "as itself")
