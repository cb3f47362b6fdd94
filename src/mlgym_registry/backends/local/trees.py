"""Copying and deleting folders the agent controls, in bounded time, space and stack.

Both walk the tree with an explicit stack (never recursion: the agent can nest folders thousands deep) and reach
every name through its folder's descriptor, never through a path (which would follow a link the agent swapped in,
and fails past ``PATH_MAX``). ``copy_tree`` copies what is really there: holes of sparse files stay holes, links are
never followed while copying, and it stops with ``TooLarge`` or ``CopyTimeout`` at its budget's bounds.
``remove_tree`` deletes through read-only folders without holding a descriptor per level.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 100
"""How deep the folders of a copied tree may nest (a descriptor stays open per level while copying)."""

DEFAULT_MAX_FILES = 250_000
"""The most files, folders and links one copy of a workspace may hold."""

_CHUNK = 8 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class TooLarge(Exception):
    """The tree is over one of the copy's bounds (bytes of data, entries or depth); the message says which."""


class CopyTimeout(Exception):
    """The copy ran past its budget's deadline."""


@dataclass
class CopyBudget:
    """What one copy may use: ``max_bytes`` of file data, ``max_files`` entries, folders ``max_depth`` deep, and
    time until ``deadline`` (a ``time.monotonic()`` value). None means unbounded."""

    max_bytes: int | None = None
    max_files: int | None = DEFAULT_MAX_FILES
    deadline: float | None = None
    max_depth: int = MAX_DEPTH
    bytes: int = 0
    files: int = 0

    def check_time(self) -> None:
        """Raise ``CopyTimeout`` once the deadline has passed."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CopyTimeout("copying the workspace did not finish in time")

    def add_file(self) -> None:
        """Count one more entry (raises ``TooLarge`` past ``max_files``) and check the deadline."""
        self.files += 1
        if self.max_files is not None and self.files > self.max_files:
            raise TooLarge(f"the workspace holds more than {self.max_files} files, folders and links")
        self.check_time()

    def add_bytes(self, count: int) -> None:
        """Count ``count`` more bytes of file data (raises ``TooLarge`` past ``max_bytes``)."""
        self.bytes += count
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            raise TooLarge(f"the workspace holds more than {_megabytes(self.max_bytes)} MB of file data")


def _megabytes(count: int) -> str:
    return f"{count / (1 << 20):g}"


# -- copying ----------------------------------------------------------------------------------------------------------
def copy_tree(source: Path, target: Path, skip: set[str], budget: CopyBudget, *, into_empty: bool = False) -> None:
    """Copy the folder ``source`` to the new folder ``target`` (with ``into_empty``: into the empty folder ``target``,
    which a sandbox may already show), leaving out the relative paths in ``skip``.

    Names are opened relative to their folder's descriptor with ``O_NOFOLLOW``, so a file or folder swapped for a
    link between listing and opening is left out rather than read through the link. Plain files keep their mode and
    times and only their data is copied (holes stay holes); fifos, sockets and devices are left out. Links are
    resolved inside the copy afterwards (``_resolve_links``). Raises ``TooLarge`` or ``CopyTimeout`` at the
    budget's bounds (the partial copy is left for the caller to delete).
    """
    links: list[str] = []
    root_fd = os.open(source, _DIR_FLAGS)
    if not into_empty:
        os.mkdir(target)
    elif os.listdir(target):
        os.close(root_fd)
        raise FileExistsError(f"{target} is not empty")
    stack: list[tuple[int, Path, str, os.ScandirIterator]] = [(root_fd, target, "", os.scandir(root_fd))]
    try:
        while stack:
            folder_fd, folder, prefix, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.close(folder_fd)
                stack.pop()
                continue
            relative = prefix + entry.name
            if relative in skip:
                continue
            budget.add_file()
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    os.symlink(os.readlink(entry.name, dir_fd=folder_fd), folder / entry.name)
                    links.append(relative)
                elif stat.S_ISDIR(info.st_mode):
                    if len(stack) >= budget.max_depth:
                        raise TooLarge(f"the workspace has folders nested more than {budget.max_depth} deep")
                    child = os.open(entry.name, _NO_FOLLOW | os.O_DIRECTORY, dir_fd=folder_fd)
                    try:
                        (folder / entry.name).mkdir()
                        children = os.scandir(child)
                    except BaseException:
                        os.close(child)
                        raise
                    stack.append((child, folder / entry.name, relative + "/", children))
                elif stat.S_ISREG(info.st_mode):
                    _copy_file(folder_fd, entry.name, folder / entry.name, budget)
            except OSError:
                continue  # gone, swapped for a link, a path too long: not part of the copy
    finally:
        for folder_fd, _folder, _prefix, entries in stack:
            entries.close()
            os.close(folder_fd)
    _resolve_links(target, links)


def _copy_file(folder_fd: int, name: str, target: Path, budget: CopyBudget) -> None:
    fd = os.open(name, _NO_FOLLOW, dir_fd=folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return  # a fifo or device swapped in: reading it could block or mean anything
        os.set_blocking(fd, True)
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            _copy_data(fd, out, info.st_size, budget)
            os.fchmod(out, stat.S_IMODE(info.st_mode))
            os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _copy_data(source: int, target: int, size: int, budget: CopyBudget) -> None:
    """Copy the data extents of a file of ``size`` bytes; what lies between them stays a hole of the copy."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(source, offset, os.SEEK_DATA)
            end = os.lseek(source, start, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole is left
            start, end = offset, size  # no SEEK_DATA here: all of it is data
        end = min(end, size)
        if start >= end:
            break
        budget.add_bytes(end - start)
        _copy_range(source, target, start, end, budget)
        offset = end
    os.ftruncate(target, size)


def _copy_range(source: int, target: int, start: int, end: int, budget: CopyBudget) -> None:
    position = start
    while position < end:
        budget.check_time()
        count = min(_CHUNK, end - position)
        try:
            done = os.copy_file_range(source, target, count, position, position)
        except (AttributeError, OSError):
            data = os.pread(source, count, position)
            done = os.pwrite(target, data, position) if data else 0
        if done <= 0:
            return  # the file shrank while being copied
        position += done


def _resolve_links(root: Path, links: list[str]) -> None:
    """Turn the copy's links into what they stand for inside the copy, never copying a folder through one.

    A link is the agent's; resolved in the evaluation's view it could reach a file the agent may not read (an
    answer put back only there) or a file of the host, so only targets inside the copy count. A link to a file
    becomes a hard link to the copy's file. A link to a folder stays a link only when no folder link (itself
    included) lies inside its target, so that following links can never loop or nest (``.``, ``..`` or two folders
    linking to each other); every other link is deleted.
    """
    base = os.path.realpath(root)
    files: list[tuple[Path, str]] = []
    folders: list[tuple[Path, str, str]] = []
    for relative in links:
        link = root / relative
        try:
            resolved = os.path.realpath(link, strict=True)
            info = os.stat(resolved)
            where = os.path.join(os.path.realpath(link.parent, strict=True), link.name)
        except (OSError, RuntimeError, ValueError):
            resolved, info, where = "", None, ""
        inside = resolved.startswith(base + os.sep)
        if info is not None and inside and stat.S_ISREG(info.st_mode):
            files.append((link, resolved))
        elif info is not None and inside and stat.S_ISDIR(info.st_mode):
            folders.append((link, resolved, where))
        else:
            _unlink(link)
    places = sorted(where for _link, _resolved, where in folders)
    for link, resolved in files:
        _unlink(link)
        try:
            os.link(resolved, link)
        except OSError:
            pass
    for link, resolved, _where in folders:
        index = bisect.bisect_left(places, resolved + os.sep)
        if index < len(places) and places[index].startswith(resolved + os.sep):
            _unlink(link)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- deleting ---------------------------------------------------------------------------------------------------------
def remove_tree(path: Path | str) -> bool:
    """``rm -rf path``, also through read-only folders and at any depth; True when nothing is left. Never raises.

    At most two descriptors are open at a time: the walk goes down by name and back up through ``..``, checking that
    each ``..`` is the folder it came from (a folder moved meanwhile stops the walk rather than deleting elsewhere).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        if stat.S_ISDIR(info.st_mode):
            _empty_folder(path)
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass
    return not os.path.lexists(path)


def empty_folder(path: Path | str, mode: int) -> bool:
    """Make the real folder ``path`` empty, with ``mode`` and no extended attributes (ACLs, ``user.*`` data), as a
    new folder would be; True when that worked, False when ``path`` is not a folder (a link) or anything is left.
    Never raises.

    Keeping the folder avoids removing it: a folder that was a mount point in a sandbox's namespace costs the kernel a
    wait for that mount to be detached (milliseconds) when it is removed.
    """
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        _empty_folder(path)
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return False
    try:
        for name in os.listxattr(fd):
            with contextlib.suppress(OSError):
                os.removexattr(fd, name)
        os.fchmod(fd, mode)
        return not os.listdir(fd) and not _user_attributes(fd)
    except OSError:
        return False
    finally:
        os.close(fd)


def _user_attributes(fd: int) -> list[str]:
    """Extended attributes an unprivileged agent could have set (the security namespace is the system's)."""
    return [name for name in os.listxattr(fd) if not name.startswith("security.")]


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _empty_folder(path: Path | str) -> None:
    fd = _open_folder(path, None)
    try:
        levels: list[tuple[tuple[int, int], list[str]]] = [(_identity(fd), _clear(fd))]
        entered: list[str] = []
        while True:
            pending = levels[-1][1]
            if pending:
                name = pending.pop()
                try:
                    child = _open_folder(name, fd)
                except OSError:
                    continue  # cannot be entered: left as it is
                os.close(fd)
                fd = child
                levels.append((_identity(fd), _clear(fd)))
                entered.append(name)
                continue
            if not entered:
                return
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            if _identity(parent) != levels[-2][0]:
                os.close(parent)
                raise OSError(errno.ESTALE, "a folder was moved while it was being deleted", str(path))
            os.close(fd)
            fd = parent
            levels.pop()
            try:
                os.rmdir(entered.pop(), dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)


def _open_folder(name: Path | str, dir_fd: int | None) -> int:
    """Open a folder (never through a link), making it accessible first when its mode does not let us in."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        _chmod_no_follow(name, dir_fd, 0o700)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _chmod_no_follow(name: Path | str, dir_fd: int | None, mode: int) -> None:
    try:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)
    except (AttributeError, OSError):
        return
    try:
        os.chmod(f"/proc/self/fd/{handle}", mode)  # the folder itself, even if its name was swapped since
    except OSError:
        pass
    finally:
        os.close(handle)


def _clear(fd: int) -> list[str]:
    """Delete everything in the open folder but its subfolders, whose names are returned."""
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o700 != 0o700:
            os.fchmod(fd, mode | 0o700)
    except OSError:
        pass
    folders = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.name)
                else:
                    os.unlink(entry.name, dir_fd=fd)
            except OSError:
                pass
    return folders
