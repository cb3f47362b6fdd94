"""The check of the agent's submission against its task's schema (``mlgym_registry.submissions``), in the
evaluation's view of the workspace, after the pristine files are put back and before the evaluator starts.

It runs in the driver, never in a sandbox the agent's code reaches. The file is the one the evaluator will read: the
view's copy, which the agent's processes cannot change (the copy is private to the evaluation, and both evaluation
processes see it read-only). It is read without following any link, as a plain file only (a folder, a FIFO, a device
in its place is refused), and at most ``max_bytes`` of it. The reference ids (``rows_from``) come from the task's
pristine copy of that file (its data folder, or its copy of a secret or protected file), never from the workspace.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

from ...submissions import SubmissionRejected, SubmissionSchema, SubmissionSchemaError

__all__ = ["SubmissionSchema", "check_submission", "pristine_file", "read_plain_file"]

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: opening a FIFO never waits
_FOLDER = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


def check_submission(schema: SubmissionSchema | None, view: Path, pristine: dict[str, Path]) -> None:
    """Check the submission in ``view`` against ``schema`` (nothing to do when None). A submission that breaks it
    raises ``SubmissionRejected`` naming the rule (the agent's failure: ``invalid_submission``); a reference file
    that is missing or malformed raises ``SubmissionSchemaError`` (the task's: ``infra_error``). The evaluation
    turns each into its failure (``evaluation.submission_failure``)."""
    if schema is None:
        return
    try:
        data = read_plain_file(view, schema.file, schema.max_bytes)
    except SubmissionRejected as exc:
        raise schema.rejection(exc.rule, str(exc)) from None
    schema.check(data, reference_bytes(schema, pristine))


def reference_bytes(schema: SubmissionSchema, pristine: dict[str, Path]) -> bytes | None:
    """The content of ``schema.rows_from`` from the task's pristine files (None when the schema names none);
    ``SubmissionSchemaError`` when it is none of them (the agent could change it) or cannot be read."""
    if schema.rows_from is None:
        return None
    path = pristine_file(schema.rows_from, pristine)
    if path is None:
        raise SubmissionSchemaError(
            f"task {schema.task!r}: submission.rows_from {schema.rows_from!r} is none of the task's dataset, "
            "evaluation, protected or secret files, so the agent could change it; name a file of those"
        )
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SubmissionSchemaError(f"task {schema.task!r}: submission.rows_from {schema.rows_from!r} cannot be "
                                    f"read from {str(path)!r}: {exc.strerror or exc}") from None


def pristine_file(relative: str, pristine: dict[str, Path]) -> Path | None:
    """Where the pristine copy of the workspace file ``relative`` is: an entry of ``pristine`` (workspace path ->
    pristine copy) or a file inside a pristine folder; None when no entry covers it."""
    for key in sorted(pristine, key=len, reverse=True):
        folder = key.rstrip("/")
        if relative == folder:
            return Path(pristine[key])
        if relative.startswith(folder + "/"):
            return Path(pristine[key]) / relative[len(folder) + 1:]
    return None


def read_plain_file(root: Path, relative: str, limit: int) -> bytes:
    """The bytes of the plain file ``relative`` under ``root``, opened without following a link at any step;
    ``SubmissionRejected`` (its message the bare problem) when it is missing, a link, a folder or anything but a
    plain file, or over ``limit``."""
    parts = PurePosixPath(relative).parts
    fd = os.open(root, _FOLDER)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            try:
                child = os.open(part, _READ if last else _FOLDER, dir_fd=fd)
            except OSError as exc:
                raise _unreadable(relative, "/".join(parts[:index + 1]), exc, _is_link(part, fd)) from None
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a plain file"
            raise SubmissionRejected("file", f"{relative} is {kind}; write the submission as a plain file")
        if info.st_size > limit:
            raise SubmissionRejected("size", f"{relative} holds {info.st_size} bytes, more than the {limit} allowed")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise SubmissionRejected("size", f"{relative} holds more than the {limit} bytes allowed")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _is_link(name: str, folder_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _unreadable(relative: str, where: str, exc: OSError, link: bool) -> SubmissionRejected:
    if link or exc.errno == errno.ELOOP:  # O_NOFOLLOW: ELOOP for a file, ENOTDIR for a folder (Linux)
        problem = f"{where} is a symbolic link; write the submission itself at {relative}"
    elif exc.errno == errno.ENOTDIR:
        problem = f"{where} is not a folder"
    elif exc.errno == errno.ENOENT:
        problem = (f"there is no plain file {relative} in the evaluation's copy of the workspace: it is missing, or "
                   "it is a FIFO, socket or device, or a link to nothing the workspace holds (the copy keeps plain "
                   "files and folders only)")
    else:
        problem = f"{where} cannot be opened ({exc.strerror or exc})"
    return SubmissionRejected("file", problem)
