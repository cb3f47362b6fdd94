"""What a command shows on the terminal while episodes play: each turn as it happens, shortened, and a progress bar
over many episodes."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from ..terminal import printable

if TYPE_CHECKING:
    from ..episodes.episode import Turn

OBSERVATION_LINES = 4
OBSERVATION_WIDTH = 100


def shorten(text: str, lines: int = OBSERVATION_LINES, width: int = OBSERVATION_WIDTH) -> str:
    """The first ``lines`` lines of ``text``, each cut at ``width`` characters, with a note of what was left out."""
    all_lines = text.splitlines() or [""]
    shown = [line if len(line) <= width else line[: width - 3] + "..." for line in all_lines[:lines]]
    if len(all_lines) > lines:
        shown.append(f"[... {len(all_lines) - lines} more lines]")
    return "\n".join(shown)


def indent(text: str, prefix: str = "      ") -> str:
    """``text`` with every line indented by ``prefix``."""
    return "\n".join(prefix + line for line in text.splitlines())


def format_turn(turn: Turn) -> str:
    """A turn as a few lines: step number and action, the observation shortened, the reward."""
    if turn.format_error:
        head = f"[{turn.index + 1:>3}] (no command: {turn.observation})"
        return f"{head}\n      reward {turn.reward:+.4f}"
    action_lines = turn.action.strip().splitlines() or [""]
    action = action_lines[0] + (f"  [+{len(action_lines) - 1} lines]" if len(action_lines) > 1 else "")
    parts = [f"[{turn.index + 1:>3}] {action}"]
    if turn.observation.strip():
        parts.append(indent(shorten(turn.observation)))
    parts.append(f"      reward {turn.reward:+.4f}" + ("  (done)" if turn.done else ""))
    return "\n".join(parts)


class Transcript:
    """Prints each turn as it happens."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def __call__(self, turn: Turn) -> None:
        self.stream.write(printable(format_turn(turn)) + "\n")
        self.stream.flush()


class ProgressBar:
    """A one-line progress bar over ``total`` units (redrawn in place on a terminal, a line per update elsewhere)."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 30,
                 min_interval: float = 1.0):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.done = 0
        self.note = ""
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = 0.0 if self.tty else min_interval
        self._last = 0.0
        self._line = ""

    def update(self, done: int | None = None, note: str = "", *, force: bool = False) -> None:
        """Set progress to ``done`` units (or one more) and redraw."""
        self.done = self.done + 1 if done is None else done
        self.note = note or self.note
        now = time.monotonic()
        if not force and now - self._last < self.min_interval and self.done < self.total:
            return
        self._last = now
        filled = int(self.width * min(self.done, self.total) / self.total)
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {self.note}"
        if line == self._line and not self.tty:
            return
        self._line = line
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Finish the bar's line."""
        self.update(self.done, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
