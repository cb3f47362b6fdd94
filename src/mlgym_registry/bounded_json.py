"""JSON parsing with a nesting bound, for text that an agent (or anyone) controls.

``json.loads`` recurses once per nesting level. Under the default recursion limit it raises ``RecursionError`` (not
``ValueError``) on input nested deeper than that limit, which depends on how deep the caller already is; under a
raised limit (``sys.setrecursionlimit(10**6)``, which some ML code does) it overflows the C stack and the process
dies of a segmentation fault, which no ``except`` catches. Code that walks the parsed value recursively fails the
same way at a smaller depth. ``loads`` measures the nesting first, in one linear pass that does not recurse, and
treats any text nested deeper than ``MAX_JSON_DEPTH`` as unreadable: it raises ``JSONTooDeep``, a ``ValueError``,
like any other unreadable JSON, and ``json.loads`` never sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_DEPTH = 128
"""How deep a JSON value may nest (arrays and objects). MLGym's files and the state line nest a few levels."""

# A JSON string (its escapes skipped; an unclosed one runs to the end of the text, so a failed match never backtracks
# and an unclosed string costs one pass), a run of openers or a run of closers. Only the runs change the depth.
_TOKEN = re.compile(r'"(?:[^"\\]+|\\.)*"?|[\[{]+|[\]}]+', re.DOTALL)


class JSONTooDeep(ValueError):
    """A JSON text nested deeper than the bound (see ``loads``)."""

    def __init__(self, max_depth: int):
        super().__init__(f"JSON nested deeper than {max_depth} levels")
        self.max_depth = max_depth


def loads(text: str | bytes | bytearray, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, raising ``JSONTooDeep`` when the text nests deeper than ``max_depth`` levels.

    Linear in the text: the depth is measured before decoding (``nests_deeper``), only when the text holds more than
    ``max_depth`` openers. Other unreadable input raises what ``json.loads`` raises for it (``ValueError``s:
    ``JSONDecodeError``, ``UnicodeDecodeError``, an integer with too many digits); catch ``ValueError`` for all.
    """
    if isinstance(text, (bytes, bytearray)):  # what json.loads does with bytes, done first so the scan reads text
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    if text.count("[") + text.count("{") > max_depth and nests_deeper(text, max_depth):
        raise JSONTooDeep(max_depth)
    try:
        return json.loads(text)
    except RecursionError:  # only a caller already near the recursion limit gets here
        raise JSONTooDeep(max_depth) from None


def nests_deeper(text: str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``text`` opens more than ``max_depth`` arrays and objects at once (brackets inside strings do not
    count). Exact for valid JSON; for any text one pass, without recursion, that stops at the first level too many."""
    depth = 0
    for token in _TOKEN.finditer(text):
        run = token.group()
        first = run[0]
        if first == '"':
            continue
        if first == "[" or first == "{":
            depth += len(run)
            if depth > max_depth:
                return True
        else:
            depth -= len(run)
    return False
