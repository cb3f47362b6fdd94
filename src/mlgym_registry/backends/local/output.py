"""Turning a command's raw bytes into the observation text MLGym's agent sees.

MLGym merges stderr into stdout, decodes UTF-8 with ``backslashreplace``, turns ``\\r\\n`` into ``\\n``, splits into
lines, drops empty lines and tqdm progress-bar lines, and joins with ``\\n`` (so there is no trailing newline).
"""

from __future__ import annotations

import re

TQDM_LINE = re.compile(r"(?:.*?:\s*)?(\d+%\|.*?\|.*\[.*?\])")
"""MLGym's pattern of a tqdm progress-bar line, searched in every line of an observation (lines it finds are dropped).

It is the definition only: searched as it is, it backtracks quadratically on a long line (a 100 KB line took 42 s),
so ``is_tqdm_line`` decides the same thing in linear time.
"""

_BAR_START = re.compile(r"\d%\|")


def is_tqdm_line(line: str) -> bool:
    """Whether ``TQDM_LINE.search(line)`` would find a match, in time linear in ``len(line)``.

    The optional ``desc:`` prefix of the pattern cannot make or break a search, so the pattern finds a match exactly
    when the line holds, in this order, a decimal digit directly followed by ``%|``, then a ``|``, a ``[`` and a
    ``]`` (``.`` matches every character but ``\\n``, which a line never holds). Taking the earliest occurrence of
    each in turn is enough: an earlier start leaves more room for what must follow.
    """
    if "%|" not in line:
        return False
    start = _BAR_START.search(line)  # a fixed-length pattern: no backtracking
    if start is None:
        return False
    bar_end = line.find("|", start.end())
    if bar_end < 0:
        return False
    bracket = line.find("[", bar_end + 1)
    return bracket >= 0 and line.find("]", bracket + 1) >= 0


def normalise(raw: bytes) -> str:
    """MLGym's output normalisation of a command's raw (merged) output, in time linear in its length."""
    text = raw.decode("utf-8", errors="backslashreplace").replace("\r\n", "\n")
    return "\n".join(line for line in text.splitlines() if line != "" and not is_tqdm_line(line))


def truncation_note(omitted: int, limit: int) -> str:
    """The line that stands in for the middle of an output longer than ``limit`` characters."""
    return f"[... {omitted} characters of output omitted: the output exceeded the limit of {limit} characters ...]"


def cap(text: str, limit: int) -> str:
    """``text`` shortened to about ``limit`` characters, keeping its head and tail around a note."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n{truncation_note(omitted, limit)}\n{text[-tail:]}"


class CappedBuffer:
    """Collects a command's output bytes, keeping only a head and a tail once it grows past ``limit`` bytes.

    The tail is always kept so that the end-of-command marker can be found however much the command printed.
    """

    def __init__(self, limit: int):
        self.limit = max(limit, 1024)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        """Append ``data``."""
        if len(self.head) < self.limit // 2:
            room = self.limit // 2 - len(self.head)
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - (self.limit - self.limit // 2)
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def contents(self) -> bytes:
        """Everything kept, with a note where bytes were dropped."""
        if not self.dropped:
            return bytes(self.head) + bytes(self.tail)
        note = f"\n[... {self.dropped} bytes of output omitted ...]\n".encode()
        return bytes(self.head) + note + bytes(self.tail)

    def __len__(self) -> int:
        return len(self.head) + len(self.tail) + self.dropped
