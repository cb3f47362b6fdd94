"""What a command shows on the terminal while episodes play: each turn as it happens, shortened, and a progress bar
(tqdm's) over many episodes."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from ..terminal import printable

if TYPE_CHECKING:
    from tqdm import tqdm

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


TERMINAL_REDRAW_S = 0.1
"""How often the progress bar may redraw on a terminal (tqdm's own default)."""
LOG_REDRAW_S = 10.0
"""How often it may write when stderr is a file or a pipe: a snapshot every 10 seconds, and the final state."""


def progress_bar(total: int, label: str, stream: TextIO | None = None) -> tqdm:
    """A tqdm bar over ``total`` episodes on ``stream`` (stderr by default), described by ``label``; move it with
    ``show_progress`` and finish it with its ``close()``."""
    from tqdm import tqdm  # only commands that draw a bar pay for importing it

    stream = stream or sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    # miniters=0: redraw on time alone, so a step that ends no episode still updates the step count in the postfix
    return tqdm(total=total, desc=label, unit="episode", file=stream, miniters=0, dynamic_ncols=tty,
                mininterval=TERMINAL_REDRAW_S if tty else LOG_REDRAW_S)


def show_progress(bar: tqdm, done: int, note: str = "") -> None:
    """Set ``bar`` to ``done`` episodes (a running total, not an increment) with ``note`` after its counts; tqdm
    redraws when its interval has passed."""
    if note:
        bar.set_postfix_str(note, refresh=False)
    bar.update(done - bar.n)
