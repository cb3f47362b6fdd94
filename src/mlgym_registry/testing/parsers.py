"""Conformance checks for parsers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import FormatError
from ._common import _fail, _name

WELL_FORMED_RESPONSES = (
    "DISCUSSION\nLet me look at the files first.\n```\nls -a\n```",
    "<command>\nls -a\n</command>",
    '{"thought": "Let me look at the files first.", "command": "ls -a"}',
    "ls -a",
)
"""One response in each common style, all asking for ``ls -a``: a parser must understand at least one."""

ODD_RESPONSES = (
    "",
    "I think we should look at the files.",
    "```\nls -a",
    "```\n```",
    "DISCUSSION\n```python\nprint('nested')\n```\nno closing fence",
    "caf\u00e9 \u2603 \x00 \ufffd",
    "x" * 100_000,
)
"""Responses a model really produces: empty, prose only, unclosed or empty blocks, odd characters, huge text."""


def check_parser(parser: Callable[[str], Any], *, well_formed: dict[str, str] | None = None,
                 malformed: tuple[str, ...] = ()) -> None:
    """Check ``parser(response) -> (thought, action)`` and its ``FormatError`` contract.

    ``well_formed`` maps responses to the action they must give (stripped); by default the parser must read
    ``ls -a`` out of at least one of ``WELL_FORMED_RESPONSES`` or, when it declares ``format_action(action) ->
    response`` (a response in its own format carrying ``action``), out of its own ``format_action("ls -a")``. Every
    odd response must give a ``(str, str)`` pair or raise ``FormatError``; each of ``malformed`` must raise
    ``FormatError``. The result must not vary between calls. A parser need not declare ``format_action`` (nor
    ``format_instructions``); a declared ``format_action`` must give ``ls -a`` back, and a declared
    ``format_instructions`` or ``format_error_message`` must be a string.
    """
    what = f"parser {_name(parser)}"
    if not callable(parser):
        _fail(what, "is not callable; a parser is a callable parser(response: str) -> (thought, action)")
    examples = well_formed or {response: "ls -a" for response in WELL_FORMED_RESPONSES}
    for attribute in ("format_instructions", "format_error_message"):
        text = getattr(parser, attribute, None)
        if text is not None and not isinstance(text, str):
            _fail(what, f"declares {attribute} = {text!r:.80}; it must be a str (or not be declared)")
    declared = getattr(parser, "format_action", None) if well_formed is None else None
    if callable(declared):  # a parser that shows its own format: its example counts as a well-formed response
        example = declared("ls -a")
        if not isinstance(example, str):
            _fail(what, f"format_action('ls -a') returned {example!r:.80}; it must return a response (a str)")
        examples = {example: "ls -a", **examples}
    understood = []
    for response, expected in examples.items():
        result = _parse(parser, response, what)
        if result is not None and result[1].strip() == expected.strip():
            understood.append(response)
        elif well_formed is not None:
            got = "a FormatError" if result is None else repr(result[1])
            _fail(what, f"parsed {response!r} into {got}; expected the action {expected!r}")
    if not understood:
        _fail(what, f"read the action 'ls -a' out of none of {list(examples)}; it must understand at least one")
    if callable(declared) and example not in understood:
        _fail(what, f"does not read 'ls -a' back out of its own format_action('ls -a') = {example!r:.80}; "
                    f"parser(parser.format_action(a))[1].strip() must equal a.strip()")
    for response in ODD_RESPONSES + tuple(understood):
        first = _parse(parser, response, what)
        if _parse(parser, response, what) != first:
            _fail(what, f"gave different results for the same response {response[:60]!r}; a parser must be pure")
    for response in malformed:
        if _parse(parser, response, what) is not None:
            _fail(what, f"accepted the malformed response {response[:60]!r}; it must raise FormatError")


def _parse(parser: Callable[[str], Any], response: str, what: str) -> tuple[str, str] | None:
    """The parser's ``(thought, action)``, or None for a ``FormatError``; anything else fails the check."""
    shown = response[:60] + ("..." if len(response) > 60 else "")
    try:
        result = parser(response)
    except FormatError:
        return None
    except Exception as exc:  # noqa: BLE001 - any other exception is exactly what the check reports
        _fail(what, f"raised {type(exc).__name__}: {exc} on {shown!r}; when a response holds no action a parser "
                    f"must raise mlgym_registry.errors.FormatError, and nothing else")
    if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(part, str) for part in result)):
        _fail(what, f"returned {result!r:.80} for {shown!r}; it must return a (thought, action) tuple of two strings")
    return result
