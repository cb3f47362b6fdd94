"""Turning a command's raw bytes into the observation text MLGym's agent sees.

MLGym merges stderr into stdout, decodes UTF-8 with ``backslashreplace``, turns ``\\r\\n`` into ``\\n``, splits into
lines, drops empty lines and tqdm progress-bar lines, and joins with ``\\n`` (so there is no trailing newline).
"""

from __future__ import annotations

import re

TQDM_LINE = re.compile(r"(?:.*?:\s*)?(\d+%\|.*?\|.*\[.*?\])")
"""A tqdm progress-bar line (what MLGym filters out of every observation)."""


def normalise(raw: bytes) -> str:
    """MLGym's output normalisation of a command's raw (merged) output."""
    text = raw.decode("utf-8", errors="backslashreplace").replace("\r\n", "\n")
    return "\n".join(line for line in text.splitlines() if line != "" and not TQDM_LINE.search(line))


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
