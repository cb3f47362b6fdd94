"""Showing text from commands and models on a terminal without letting it drive the terminal."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe to show on a terminal: control characters other than newline and tab (escape sequences,
    carriage returns, bells) are shown as ``\\xNN``, so command output cannot drive the terminal."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match[0]):02x}", text)
