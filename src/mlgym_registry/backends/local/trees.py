"""Copying and deleting folders the agent controls, in bounded time, space and stack.

Both walk the tree with an explicit stack (never recursion: the agent can nest folders thousands deep) and reach
every name through its folder's descriptor, never through a path (which would follow a link the agent swapped in,
and fails past ``PATH_MAX``). ``copy_tree`` copies what is really there: holes of sparse files stay holes, links are
never followed while copying, and it stops with ``TooLarge`` or ``CopyTimeout`` at its budget's bounds.
``remove_tree`` deletes through read-only folders without holding a descriptor per level.

Under a driver that is not root, the agent's files belong to the driver's user (the sandbox maps the agent's user to
it), so a mode the agent set (``chmod 000``) would lock the driver out of them: the walks give themselves the owner's
read (and a folder's search) bit on such a file or folder for as long as they read it, and give its mode back
afterwards (see ``_Access``).
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

HOST_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE,
                         errno.ENOMEM})
"""Errors a copy never skips over (as it skips a file that vanished or was swapped): the disk is full or failing, or
this process ran out of descriptors or memory. They stop the copy, and the caller decides whose failure it was."""

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
    max_disk: int | None = None
    """The most disk the copied entries may take where they are (``allocated``), so that they and their copy fit in
    the env's disk quota; None: unbounded."""
    quota_mb: int | None = None
    """The env's disk quota (for the message when ``max_disk`` is passed)."""
    bytes: int = 0
    files: int = 0
    disk: int = 0

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

    def add_disk(self, info: os.stat_result) -> None:
        """Count the disk an entry takes (raises ``TooLarge`` past ``max_disk``)."""
        self.disk += allocated(info)
        if self.max_disk is not None and self.disk > self.max_disk:
            raise TooLarge(f"the workspace and the copy an evaluation makes of it would take more than this "
                           f"environment's disk quota of {self.quota_mb} MB")

    def add_bytes(self, count: int) -> None:
        """Count ``count`` more bytes of file data (raises ``TooLarge`` past ``max_bytes``)."""
        self.bytes += count
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            raise TooLarge(f"the workspace holds more than {_megabytes(self.max_bytes)} MB of file data")


def _megabytes(count: int) -> str:
    return f"{count / (1 << 20):g}"


ENTRY_BYTES = 4096
"""The least one entry is counted to take on disk: an empty file takes no block, but it takes an inode, and a disk
runs out of those too."""


def allocated(info: os.stat_result) -> int:
    """The disk an entry takes: its allocated blocks (holes of sparse files take none), at least ``ENTRY_BYTES``."""
    return max(info.st_blocks * 512, ENTRY_BYTES)


# -- reading what the agent locked ------------------------------------------------------------------------------------
class _Access:
    """Opens the agent's files and folders for reading whatever their mode, and gives each its mode back at ``close``.

    Only what the agent could have locked is opened this way: a file or folder (never a link) that belongs to this
    process's user and lacks its owner's read bit (a folder: read or search bit). It is reached through a descriptor
    of the name that follows no link (``O_PATH``), its mode is changed through that descriptor, and it is reopened
    through it too (``/proc/self/fd``), so the entry changed and opened is the one inspected, even if the name is
    swapped meanwhile. Root needs none of this (it reads any file), and no mode is changed for it.
    """

    def __init__(self) -> None:
        self.uid = os.geteuid()
        self._modes: dict[int, int] = {}  # open descriptor -> the mode to give back when it is closed

    def open_folder(self, name: Path | str, dir_fd: int | None) -> int:
        """Open a folder for reading and searching (never through a link)."""
        fd = self._open(name, dir_fd, _DIR_FLAGS, 0o500)
        if self.uid != 0 and fd not in self._modes:
            info = os.fstat(fd)  # it opened (its read bit is set) but may still be shut to search (no x bit)
            mode = stat.S_IMODE(info.st_mode)
            if mode & 0o500 != 0o500 and info.st_uid == self.uid:
                try:
                    os.fchmod(fd, mode | 0o500)
                except OSError:
                    pass
                else:
                    self._modes[fd] = mode
        return fd

    def open_file(self, name: str, dir_fd: int) -> int:
        """Open a file for reading (never through a link, never blocking on a fifo)."""
        return self._open(name, dir_fd, _NO_FOLLOW, 0o400)

    def mode(self, fd: int, info: os.stat_result) -> int:
        """The mode of the open entry ``fd`` (``info``: its ``fstat``) as the agent left it."""
        return self._modes.get(fd, stat.S_IMODE(info.st_mode))

    def close(self, fd: int) -> None:
        """Give the entry its mode back (if it was changed) and close it."""
        mode = self._modes.pop(fd, None)
        if mode is not None:
            with contextlib.suppress(OSError):
                os.fchmod(fd, mode)
        os.close(fd)

    def _open(self, name: Path | str, dir_fd: int | None, flags: int, bits: int) -> int:
        try:
            return os.open(name, flags, dir_fd=dir_fd)
        except PermissionError:
            if self.uid == 0:
                raise
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
        try:
            info = os.fstat(handle)
            mode = stat.S_IMODE(info.st_mode)
            kind = stat.S_ISDIR if flags & os.O_DIRECTORY else stat.S_ISREG
            if info.st_uid != self.uid or not kind(info.st_mode) or mode & bits == bits:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
            through = f"/proc/self/fd/{handle}"
            os.chmod(through, mode | bits)
            try:
                fd = os.open(through, flags & ~os.O_NOFOLLOW)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.chmod(through, mode)
                raise
            self._modes[fd] = mode
            return fd
        finally:
            os.close(handle)


# -- copying ----------------------------------------------------------------------------------------------------------
def copy_tree(source: Path, target: Path, skip: set[str], budget: CopyBudget, *, into_empty: bool = False) -> None:
    """Copy the folder ``source`` to the new folder ``target`` (with ``into_empty``: into the empty folder ``target``,
    which a sandbox may already show), leaving out the relative paths in ``skip``.

    Names are opened relative to their folder's descriptor with ``O_NOFOLLOW``, so a file or folder swapped for a
    link between listing and opening is left out rather than read through the link; what the agent locked is read
    anyway (``_Access``). Plain files keep their mode (the agent's, not the one given for reading) and times and only
    their data is copied (holes stay holes); fifos, sockets and devices are left out. Links are resolved inside the
    copy afterwards (``_resolve_links``). Raises ``TooLarge`` or ``CopyTimeout`` at the budget's bounds (bytes,
    entries, depth, disk), and the ``OSError`` of ``HOST_ERRNOS`` (the partial copy is left for the caller to delete).
    """
    links: list[str] = []
    access = _Access()
    root_fd = access.open_folder(source, None)
    if not into_empty:
        os.mkdir(target)
    elif os.listdir(target):
        access.close(root_fd)
        raise FileExistsError(f"{target} is not empty")
    stack: list[tuple[int, Path, str, os.ScandirIterator]] = [(root_fd, target, "", os.scandir(root_fd))]
    try:
        while stack:
            folder_fd, folder, prefix, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                access.close(folder_fd)
                stack.pop()
                continue
            relative = prefix + entry.name
            if relative in skip:
                continue
            budget.add_file()
            try:
                info = entry.stat(follow_symlinks=False)
                budget.add_disk(info)
                if stat.S_ISLNK(info.st_mode):
                    os.symlink(os.readlink(entry.name, dir_fd=folder_fd), folder / entry.name)
                    links.append(relative)
                elif stat.S_ISDIR(info.st_mode):
                    if len(stack) >= budget.max_depth:
                        raise TooLarge(f"the workspace has folders nested more than {budget.max_depth} deep")
                    child = access.open_folder(entry.name, folder_fd)
                    try:
                        (folder / entry.name).mkdir()
                        children = os.scandir(child)
                    except BaseException:
                        access.close(child)
                        raise
                    stack.append((child, folder / entry.name, relative + "/", children))
                elif stat.S_ISREG(info.st_mode):
                    _copy_file(folder_fd, entry.name, folder / entry.name, budget, access)
            except OSError as exc:
                if exc.errno in HOST_ERRNOS:
                    raise
                continue  # gone, swapped for a link, a path too long: not part of the copy
    finally:
        for folder_fd, _folder, _prefix, entries in stack:
            entries.close()
            access.close(folder_fd)
    _resolve_links(target, links)


def disk_usage(root: Path | str, relative: str = "", budget: CopyBudget | None = None) -> int:
    """What the file or folder ``relative`` in the folder ``root`` (``root`` itself when empty) takes on disk
    (``allocated`` per entry, a file with several links once); 0 when it is not there. Links are never followed, and
    locked folders are read as ``copy_tree`` reads them. With ``budget``, its entries count against its bounds
    (files, depth, deadline: ``TooLarge``, ``CopyTimeout``), as a copy's would; without, what lies more than
    ``MAX_DEPTH`` folders deep is left out (a descriptor stays open per level)."""
    strict = budget is not None
    budget = budget if budget is not None else CopyBudget(max_files=None)
    access = _Access()
    parts = [part for part in relative.split("/") if part and part != "."]
    try:
        fd = access.open_folder(root, None)
    except FileNotFoundError:
        return 0
    try:
        for part in parts[:-1]:
            child = access.open_folder(part, fd)
            access.close(fd)
            fd = child
        if not parts:
            folder, fd = fd, -1  # the walk closes it
            return allocated(os.fstat(folder)) + _tree_usage(folder, access, budget, strict)
        info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            return allocated(info)
        return allocated(info) + _tree_usage(access.open_folder(parts[-1], fd), access, budget, strict)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    finally:
        if fd >= 0:
            access.close(fd)


def _tree_usage(root_fd: int, access: _Access, budget: CopyBudget, strict: bool) -> int:
    """What the entries of the open folder ``root_fd`` take on disk (see ``disk_usage``); closes it."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[int, os.ScandirIterator]] = []
    try:
        stack.append((root_fd, os.scandir(root_fd)))
    except BaseException:
        access.close(root_fd)
        raise
    try:
        while stack:
            folder_fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                access.close(folder_fd)
                stack.pop()
                continue
            budget.add_file()
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += allocated(info)
                if stat.S_ISDIR(info.st_mode):
                    if len(stack) >= budget.max_depth:
                        if not strict:
                            continue
                        raise TooLarge(f"the workspace has folders nested more than {budget.max_depth} deep")
                    child = access.open_folder(entry.name, folder_fd)
                    try:
                        stack.append((child, os.scandir(child)))
                    except BaseException:
                        access.close(child)
                        raise
            except OSError as exc:
                if exc.errno in HOST_ERRNOS:
                    raise
                continue  # gone meanwhile
    finally:
        for folder_fd, entries in stack:
            entries.close()
            access.close(folder_fd)
    return total


def _copy_file(folder_fd: int, name: str, target: Path, budget: CopyBudget, access: _Access) -> None:
    fd = access.open_file(name, folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return  # a fifo or device swapped in: reading it could block or mean anything
        os.set_blocking(fd, True)
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            _copy_data(fd, out, info.st_size, budget)
            os.fchmod(out, access.mode(fd, info))
            os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        access.close(fd)


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
        except OSError as exc:
            if exc.errno in HOST_ERRNOS:
                raise
            done = -1
        except AttributeError:
            done = -1
        if done < 0:  # no copy_file_range between these files: read and write
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
