"""JSON parsing with a nesting bound, for text that an agent (or anyone) controls.

``json.loads`` recurses once per nesting level and raises ``RecursionError`` (not ``ValueError``) on input nested
deeper than the interpreter's recursion limit, which depends on how deep the caller already is; code that walks the
parsed value recursively fails the same way at a smaller depth. ``loads`` treats any value nested deeper than
``MAX_JSON_DEPTH`` as unreadable: it raises ``JSONTooDeep``, a ``ValueError``, like any other unreadable JSON.
"""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 128
"""How deep a JSON value may nest (arrays and objects). MLGym's files and the state line nest a few levels."""


class JSONTooDeep(ValueError):
    """A JSON text nested deeper than the bound (see ``loads``)."""

    def __init__(self, max_depth: int):
        super().__init__(f"JSON nested deeper than {max_depth} levels")
        self.max_depth = max_depth


def loads(text: str | bytes | bytearray, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, raising ``JSONTooDeep`` when the value nests deeper than ``max_depth`` levels.

    Other unreadable input raises what ``json.loads`` raises for it (``ValueError``s: ``JSONDecodeError``,
    ``UnicodeDecodeError``, an integer with too many digits).
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeep(max_depth) from None
    openers = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if openers > max_depth and _deeper_than(value, max_depth):  # fewer openers cannot nest that deep
        raise JSONTooDeep(max_depth)
    return value


def _deeper_than(value: Any, max_depth: int) -> bool:
    """Whether a parsed JSON value nests deeper than ``max_depth`` (an explicit stack: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
