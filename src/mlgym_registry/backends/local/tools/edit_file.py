"""The ``edit`` and ``insert`` tools: change lines of the open file, lint Python files, roll back on new errors.

Usage: ``edit_file.py edit|insert <file> <range> <current_line> <window>``, with the new text on stdin (the tool is
called from a here-document). ``<range>`` is ``<start>:<end>`` for edit and ``<line>`` for insert.

Prints the new value of ``CURRENT_LINE`` on the first line, then the observation. Exit status 1 when the file is
read-only, else 0.
"""

from __future__ import annotations

import os
import stat
import sys

# the tool folder is the package's own (or a sandbox's read-only view of it): importing its lint module must leave no
# __pycache__ there
sys.dont_write_bytecode = True
from lint import LintError, lint, lint_source  # noqa: E402 - after the line above

RULE = "-------------------------------------------------"


def split_lines(text: str) -> list[str]:
    """The lines of a file's text, as ``mapfile -t`` reads them (a final line without newline still counts)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_replacement(data: str) -> list[str]:
    """The lines of a here-document body, as ``while read -r`` reads them (an unterminated last line is lost)."""
    return data.split("\n")[:-1]


def render_window(path: str, lines: list[str], current: int, window: int) -> list[str]:
    """The editor window around ``current``: ``[File: ...]``, ``(k more lines above)``, ``n:text``, ``(k more ...)``."""
    total = len(lines)
    out = [f"[File: {os.path.realpath(path)} ({total} lines total)]"]
    above = (2 * current - window) // 2 if 2 * current - window > 0 else 0
    below = (2 * total - 2 * current - window + 1) // 2 if 2 * total - 2 * current - window > 0 else 0
    if above > 0:
        out.append(f"({above} more lines above)")
    upto = (2 * current + window) // 2 if current > 0 else window // 2
    numbered = [f"{i}:{text}" for i, text in enumerate(lines[: max(upto, 0)], start=1)]
    out += numbered[-window:] if window > 0 else []
    if below > 0:
        out.append(f"({below} more lines below)")
    return out


def constrain(current: int, total: int, window: int) -> int:
    """Keep the window inside the file, as the ``open``/``goto`` tools do."""
    half = window // 2
    return max(min(current, total - half), half)


def new_errors(before: list[LintError], after: list[LintError], start: int, end: int, n_new: int) -> list[LintError]:
    """Errors of ``after`` that were not already in ``before`` once ``before`` is shifted past the changed lines.

    ``start``..``end`` (1-based, inclusive) were replaced by ``n_new`` lines. Earlier errors inside that range are
    forgotten: any error there afterwards counts as new.
    """
    shift = n_new - (end - start + 1)
    known = set()
    for error in before:
        if error.line < start:
            known.add(error)
        elif error.line > end:
            known.add(LintError(error.line + shift, error.col, error.problem))
    return [error for error in after if error not in known]


def is_read_only(path: str) -> bool:
    """Whether the file is marked read-only (no write bit at all) or not writable by us.

    The mode bits are checked too because a root user may write any file.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return True
    return not (mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(path, os.W_OK)


def usage(mode: str, detail: str | None = None) -> list[str]:
    """The usage message of ``mode``."""
    lines = ["Usage: edit <start_line>:<end_line>" if mode == "edit" else "Usage: insert <line_number>"]
    return lines + ([f"Error: {detail}"] if detail else [])


def main(argv: list[str]) -> int:
    mode, path, spec, current_text, window_text = argv
    current, window = int(current_text or 0), int(window_text or 1000)
    if mode == "edit":
        start_text, end_text = (spec + ":").split(":")[:2]
        if not start_text or not end_text:
            return _say(current, usage(mode))
        if not start_text.isdigit():
            return _say(current, usage(mode, f"start_line must be a number, got '{start_text}'"))
        if not end_text.isdigit():
            return _say(current, usage(mode, f"end_line must be a number, got '{end_text}'"))
        start, end = int(start_text), int(end_text)
    else:
        if not spec:
            return _say(current, usage(mode))
        if not spec.isdigit():
            return _say(current, usage(mode, f"line_number must be a number, got '{spec}'"))
        start = end = int(spec)

    text = sys.stdin.buffer.read().decode("utf-8", errors="surrogateescape")
    new_text = read_replacement(text)
    if is_read_only(path):
        _say(current, [f"Error: You cannot edit read-only file {path}"])
        return 1
    with open(path, "rb") as handle:
        original = handle.read()
    original_text = original.decode("utf-8", errors="surrogateescape")
    old = split_lines(original_text)
    if mode == "edit":
        lines = old[: max(start - 1, 0)] + new_text + old[end:]
        window_range = (start, end)
    else:
        lines = old[:start] + new_text + old[start:]
        window_range = (start + 1, start + len(new_text))
    _write(path, lines)

    problems: list[LintError] = []
    if path.endswith(".py"):
        problems = _lint_change(path, original, window_range, len(new_text))
    if not problems:
        after = start - 1 if mode == "edit" else start + 1
        after = constrain(after, len(lines), window)
        report = render_window(path, lines, after, window)
        report.append(
            "File updated. Check the window above: indentation, no duplicated or missing lines. "
            "Edit again if something is off."
        )
        return _say(after, report)

    _write_text(path, original_text)
    return _say(current, _rejection(mode, path, problems, lines, old, start, end, len(new_text)))


def _lint_change(path: str, original: bytes, window_range: tuple[int, int], n_new: int) -> list[LintError]:
    """The lint findings the change brings: those of the file now that its old bytes ``original`` did not have."""
    before = lint_source(original, path)
    return new_errors(before, lint(path), window_range[0], window_range[1], n_new)


def _rejection(
    mode: str,
    path: str,
    problems: list[LintError],
    lines: list[str],
    old: list[str],
    start: int,
    end: int,
    n_new: int,
) -> list[str]:
    noun = "edit" if mode == "edit" else "insertion"
    out = [
        f"Your {noun} was not applied: it introduces new error(s) that flake8 reports. "
        f"Read them, then send a corrected {'edit' if mode == 'edit' else 'insert'} command.",
        "ERRORS:",
        *(f"- {p.problem}" for p in problems),
        f"This is how your {noun} would have looked if applied",
        RULE,
    ]
    if mode == "edit":
        would_line, would_window = n_new // 2 + start - 1, n_new + 10
        orig_line, orig_window = (end - start + 2) // 2 + start - 1, end - start + 11
    else:
        would_line, would_window = start + n_new // 2, n_new + 10
        orig_line, orig_window = start, 10
    out += render_window(path, lines, constrain(would_line, len(lines), would_window), would_window)
    out += [RULE, f"This is the original code before your {noun}", RULE]
    out += render_window(path, old, constrain(orig_line, len(old), orig_window), orig_window)
    out += [
        RULE,
        "The file is unchanged. Fix the line numbers or the new text; repeating the same command gives the same "
        "errors.",
    ]
    return out


def _write(path: str, lines: list[str]) -> None:
    _write_text(path, "".join(line + "\n" for line in lines) if lines else "\n")


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as handle:
        handle.write(text)


def _say(current: int, lines: list[str]) -> int:
    sys.stdout.write("\n".join([str(current), *lines]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
