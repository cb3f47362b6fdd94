"""Conformance checks for parsers: the contract on ordinary replies (``check_parser``), and on hostile ones
(``check_parser_hostile``, which ``check_parser`` runs too): any reply, however deep, long or odd, gives a pair or
``FormatError`` in time linear in its length."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..components.output_checks import ORDINARY_REPLIES
from ..errors import FormatError
from ._common import GROWTH_MARGIN as GROWTH_MARGIN
from ._common import LENGTHS as LENGTHS
from ._common import MEGABYTE as MEGABYTE
from ._common import MEGABYTE_FLOOR_S as MEGABYTE_FLOOR_S
from ._common import MEGABYTE_SKIP_S as MEGABYTE_SKIP_S
from ._common import REPEATS as REPEATS
from ._common import TIME_FLOOR_S as TIME_FLOOR_S
from ._common import HostileReply, _fail, _name, _text, check_linear_time

WELL_FORMED_RESPONSES = ORDINARY_REPLIES
"""One response in each common style, all asking for ``ls -a``: a parser must understand at least one (the chain
tells a parser beaten by a hostile reply from a broken one with the same replies)."""

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
    ``format_instructions`` or ``format_error_message`` must be a string. Last, ``check_parser_hostile`` feeds it
    ``HOSTILE_REPLIES``.
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
    check_parser_hostile(parser)


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


# -- hostile replies ---------------------------------------------------------------------------------------------
_WRAPS = (
    ("", "", ""),
    (" in a fenced block", "DISCUSSION\nx\n```\n", "\n```\n"),
    (" in <command> tags", "<command>\n", "\n</command>"),
    (" in a tool call", "<tool_call>\n", "\n</tool_call>"),
    (" in a JSON command", '{"thought": "t", "command": ', "}"),
)
_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "'
_CALL_END = '"}}\n</tool_call>'
_SPACES = " \t\r\n\f\v\u00a0\u2028\u3000"


def _hostile_replies() -> tuple[HostileReply, ...]:
    replies = []
    # nesting: each bracket kind, unclosed and closed, bare and in a fenced block; JSON's in every common reply style
    for opener, closer in (("[", "]"), ("{", "}"), ("(", ")"), ("<", ">")):
        for where, prefix, suffix in _WRAPS if opener in "[{" else _WRAPS[:2]:
            big = (opener, where) in (("{", ""), ("[", " in a tool call"))
            replies.append(HostileReply(f"{opener!r} nested{where}", opener, "", prefix, "", suffix, big))
            replies.append(HostileReply(f"{opener}...{closer} nested{where}", opener, closer, prefix, "1", suffix,
                                        big))
    replies += [
        HostileReply("JSON objects nested", '{"a": ', "}", "", "1"),
        HostileReply("JSON objects nested in a tool call", '{"name": "bash", "arguments": ', "}", "<tool_call>\n",
                     "{}", "\n</tool_call>"),
        HostileReply("JSON arrays nested as a tool call's arguments string", "[", "]", _CALL, "", _CALL_END),
        # code fences and tags nested: info-string fences open nested blocks, a bare fence closes one
        HostileReply("code fences nested", "```python\n", "```\n", "DISCUSSION\n", "ls -a\n"),
        HostileReply("```json fences, none closed", "```json\n", megabyte=True),
        HostileReply("bare fences", "```\n"),
        HostileReply("<command> tags nested", "<command>", "</command>", "", "ls -a"),
        HostileReply("<tool_call> tags nested", "<tool_call>", "</tool_call>", "",
                     '{"name": "bash", "arguments": {"command": "ls -a"}}'),
        HostileReply("XML tags nested", "<a>", "</a>", "<command>", "ls -a", "</command>"),
        # blank space, alone and after each opener (a regex like \s*(.*?)\s* backtracks on it)
        HostileReply("spaces", " "),
        HostileReply("newlines", "\n"),
        HostileReply("every kind of blank space", _SPACES),
        HostileReply("spaces after an unclosed <tool_call>", " ", prefix="<tool_call>", megabyte=True),
        HostileReply("spaces then text after an unclosed <tool_call>", " ", prefix="<tool_call>", suffix="x"),
        HostileReply("spaces inside a <tool_call> block", " ", prefix="<tool_call>", suffix="</tool_call>"),
        HostileReply("spaces after an unclosed <command>", " ", prefix="<command>", suffix="x"),
        HostileReply("spaces after an opening fence", " ", prefix="```"),
        HostileReply("spaces after an info-string fence", " ", prefix="```python", suffix="x"),
        HostileReply("blank lines after an opening fence", " \n", prefix="DISCUSSION\n```\n"),
        HostileReply("spaces in a JSON command", " ", prefix='{"thought": "t",', suffix='"command": "ls -a"}'),
        # each opener repeated, none closed
        HostileReply("<tool_call> openers", "<tool_call>", megabyte=True),
        HostileReply("<tool_call> openers with spaces", "<tool_call> \n"),
        HostileReply("</tool_call> closers", "</tool_call>"),
        HostileReply("<command> openers", "<command>", megabyte=True),
        HostileReply("</command> closers", "</command>"),
        HostileReply("fence openers on one line", "```", megabyte=True),
        HostileReply("backticks", "`"),
        HostileReply("quotes", '"'),
        HostileReply("backslashes", "\\"),
        HostileReply("escaped quotes in an unclosed JSON string", '\\"', prefix='{"thought": "', megabyte=True),
        HostileReply("JSON string openers", '{"', prefix="<tool_call>"),
        HostileReply("digits as a tool call's arguments", "1", prefix='<tool_call>\n{"name": "bash", "arguments": ',
                     suffix="}\n</tool_call>"),
        HostileReply("digits as a JSON command", "1", prefix='{"thought": "t", "command": ', suffix="}"),
        # odd characters
        HostileReply("NUL bytes", "\x00"),
        HostileReply("NUL bytes in a fenced block", "\x00", prefix="DISCUSSION\n```\n", suffix="\n```\n"),
        HostileReply("NUL bytes in a tool call", "\x00", prefix=_CALL, suffix=_CALL_END),
        HostileReply("lone surrogates", "\ud800", megabyte=True),
        HostileReply("reversed surrogate pairs", "\udc00\ud800"),
        HostileReply("lone surrogates in a fenced block", "\udfff", prefix="DISCUSSION\n```\n", suffix="\n```\n"),
        HostileReply("lone surrogates in a tool call", "\ud800", prefix=_CALL, suffix=_CALL_END),
        HostileReply("escaped lone surrogates in a tool call", "\\ud800", prefix=_CALL, suffix=_CALL_END),
        # long replies, and mixes of all of the above
        HostileReply("prose", "the quick brown fox jumps over the lazy dog. "),
        HostileReply("a long discussion before a command", "I think about it some more. ", prefix="DISCUSSION\n",
                     suffix="\n```\nls -a\n```\n", megabyte=True),
        HostileReply("a long command in a tool call", "x", prefix=_CALL, suffix=_CALL_END),
        HostileReply("one long line", "x"),
        HostileReply("a mix of openers and odd characters", "[{(<`\"\\ \n\x00\ud800", megabyte=True),
        HostileReply("a mix of openers and closers", "```\n<command><tool_call>[{(\"", "\")}]</tool_call></command>\n"
                     "```\n", megabyte=True),
        HostileReply("nested tool calls in fences", "```python\n<tool_call>{\"name\": [", "]}</tool_call>\n```\n"),
    ]
    return tuple(replies)


HOSTILE_REPLIES = _hostile_replies()
"""The families of hostile replies ``check_parser_hostile`` feeds a parser: deep nesting of each bracket kind, of
code fences and of tags; runs of blank space, alone and after each opener; each opener repeated; NUL bytes; lone
surrogates; digits past ``int``'s limit; megabyte replies; mixes of these."""


def check_parser_hostile(parser: Callable[[str], Any], replies: tuple[HostileReply, ...] = HOSTILE_REPLIES) -> None:
    """Feed ``parser`` every family of ``replies`` at each of ``LENGTHS`` (and at ``MEGABYTE`` for the families marked
    ``megabyte``): each reply must give a ``(str, str)`` pair or raise ``FormatError`` (nothing else), and the time
    must grow no more than linearly with the length.

    The time at 10x the length may be up to ``GROWTH_MARGIN`` x 10 the time before (best of ``REPEATS`` calls, with
    the garbage collector off); a longer time is measured again before it fails, and times under ``TIME_FLOOR_S``
    (``MEGABYTE_FLOOR_S`` at a megabyte) are not judged. The lengths grow 10x at a time, so a parser that backtracks
    fails at a few thousand characters, before a length that would take it hours. ``check_parser`` runs this last.
    """
    what = f"parser {_name(parser)}"
    for family in replies:
        _check_family(parser, family, what)


def _check_family(parser: Callable[[str], Any], family: HostileReply, what: str) -> None:
    def call(text: str, family: HostileReply) -> None:
        _hostile_parse(parser, text, family, what)

    check_linear_time(call, family, what, PARSER_MUST)


PARSER_MUST = ("a parser must run in time linear in the reply. Look for a regex with adjacent or nested quantifiers "
               "over the same characters (such as \\s*(.*?)\\s*, which backtracks over blank space), a search that "
               "restarts at every opener, or text rebuilt in a loop")
"""How a parser too slow on a hostile reply is told what to do."""


def _hostile_parse(parser: Callable[[str], Any], text: str, family: HostileReply, what: str) -> None:
    """``parser(text)``; anything but a pair or ``FormatError`` fails the check."""
    try:
        result = parser(text)
    except FormatError:
        return
    except Exception as exc:  # noqa: BLE001 - any other exception is exactly what the check reports
        _fail(what, f"raised {type(exc).__name__}: {_text(exc)} on a hostile reply ({family.name}, {len(text):,} "
                    f"characters); a parser must return (thought, action) or raise mlgym_registry.errors.FormatError "
                    f"on every reply, however deep, long or odd: measure nesting before recursing or decoding "
                    f"(mlgym_registry.bounded_json.loads reads JSON with a nesting bound; catch ValueError), and raise "
                    f"FormatError for a reply you cannot read")
    if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(part, str) for part in result)):
        _fail(what, f"returned {type(result).__name__} for a hostile reply ({family.name}, {len(text):,} characters); "
                    f"it must return a (thought, action) tuple of two strings or raise FormatError")
