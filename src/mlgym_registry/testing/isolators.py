"""Conformance checks for action isolators: the contract on ordinary replies (``check_isolator``), and on hostile ones
(``check_isolator_hostile``, which ``check_isolator`` runs too): any reply, however deep, long or odd, gives an action
or ``FormatError`` in time linear in its length."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from ..errors import FormatError
from ._common import HostileReply, _fail, _name, _text, check_linear_time
from .parsers import _CALL, _CALL_END, HOSTILE_REPLIES

EDIT_RESPONSE = "DISCUSSION\nReplace the function.\n```\nedit 1:2\ndef f(x):\n    return (x, 'a')\nend_of_edit\n```"


EDIT_ACTION = "edit 1:2\ndef f(x):\n    return (x, 'a')\nend_of_edit"
"""The multi-line edit the isolator check asks for, in whatever format the parser reads."""

NO_COMMAND_RESPONSES = ("", "Just thinking out loud, no command.")
"""Responses that hold no command in the common formats."""

RESPONSE_STYLES: dict[str, Callable[[str], str]] = {
    "fenced": lambda action: f"DISCUSSION\nLet me do this.\n```\n{action}\n```",
    "xml": lambda action: f"DISCUSSION\nLet me do this.\n<command>\n{action}\n</command>",
    "json": lambda action: json.dumps({"thought": "Let me do this.", "command": action}),
    "bare": lambda action: action,
}
"""How a response asks for an action in each common style; ``isolator_responses`` tries them in this order."""


def isolator_responses(parser: Callable[[str], Any]) -> tuple[str, str] | None:
    """Two responses in ``parser``'s own format, ``(asks for 'ls -a', asks for EDIT_ACTION)``, or None.

    A parser that declares ``format_action(action) -> response`` (a method or callable attribute) is asked for them;
    otherwise each of ``RESPONSE_STYLES`` is tried and the first style whose responses the parser reads back into
    exactly these actions is used.
    """
    from ..components.parsers import reads_action

    styles = list(RESPONSE_STYLES.values())
    declared = getattr(parser, "format_action", None)
    if callable(declared):
        styles.insert(0, declared)
    for style in styles:
        try:
            command, edit = style("ls -a"), style(EDIT_ACTION)
        except Exception:  # noqa: BLE001 - a broken format_action falls back to the common styles
            continue
        if (isinstance(command, str) and isinstance(edit, str) and reads_action(parser, command, "ls -a")
                and reads_action(parser, edit, EDIT_ACTION)):
            return command, edit
    return None


def check_isolator(isolator: Callable[..., Any], parser: Callable[[str], Any] | None = None,
                   responses: tuple[str, str] | None = None) -> None:
    """Check ``isolator(response, parser) -> action``: a plain command comes through, a response without a command
    raises ``FormatError``, and a multi-line ``edit`` comes out as one shell-safe command (what MLGym's heredoc
    guard ensures: ``bash -n`` accepts it, its body is kept).

    The isolator is called as the chain calls it, ``isolator(response, parser)``, so the responses must be in the
    parser's format. ``parser`` defaults to ``thought_action`` (fenced code blocks). ``responses`` is a pair of
    responses in that format: the first asks for the command ``ls -a``, the second for ``EDIT_ACTION`` (an
    ``edit 1:2`` with a two-line body ending in ``end_of_edit``). When it is not given they are built with
    ``isolator_responses(parser)`` (the parser's ``format_action`` if it declares one, else the first common style
    it reads: fenced, ``<command>`` tags, JSON, bare). The no-command responses (``""`` and prose) must raise
    ``FormatError`` whenever the parser itself finds no action in them. Last, ``check_isolator_hostile`` feeds it
    ``ISOLATOR_HOSTILE_REPLIES`` with the same parser.
    """
    from ..components.parsers import ThoughtActionParser

    what = f"isolator {_name(isolator)}"
    parser = parser or ThoughtActionParser()
    if not callable(isolator):
        _fail(what, "is not callable; an isolator is isolator(response, parser) -> action")
    if responses is None:
        responses = isolator_responses(parser)
        if responses is None:
            _fail(what, f"cannot be checked with parser {_name(parser)}: it reads none of the common response "
                        f"styles; pass responses=(command_response, edit_response) in its format")
    command_response, edit_response = responses
    action = _isolate(isolator, command_response, parser, what)
    if action is None or action.strip() != "ls -a":
        _fail(what, f"turned {command_response[:60]!r} (asking for 'ls -a') into {action!r}; expected the action "
                    f"'ls -a'")
    for response in NO_COMMAND_RESPONSES:
        if _parse_quietly(parser, response) is None and _isolate(isolator, response, parser, what) is not None:
            _fail(what, f"accepted {response!r}, which holds no command; it must raise FormatError")
    edit = _isolate(isolator, edit_response, parser, what)
    if edit is None or not edit.lstrip().startswith("edit 1:2") or "return (x, 'a')" not in edit:
        _fail(what, f"turned an edit into {edit!r}; the edit command and its body must be kept")
    bash = shutil.which("bash")
    if bash is not None:
        check = subprocess.run([bash, "-n"], input=edit, text=True, capture_output=True, timeout=10)
        if check.returncode != 0:
            _fail(what, f"left the edit body unguarded: bash -n rejects {edit!r} ({check.stderr.strip()}); guard "
                        f"multi-line edit/insert bodies with a heredoc (<< 'end_of_edit') as MLGym's agent does")
    check_isolator_hostile(isolator, parser)


def _parse_quietly(parser: Callable[[str], Any], response: str) -> Any:
    """What ``parser`` makes of ``response``, or None when it raises (no action)."""
    try:
        return parser(response)
    except Exception:  # noqa: BLE001 - any failure means the parser found no action
        return None


def _isolate(isolator: Callable[..., Any], response: str, parser: Any, what: str) -> str | None:
    try:
        action = isolator(response, parser)
    except FormatError:
        return None
    except Exception as exc:  # noqa: BLE001 - reported as the failure
        _fail(what, f"raised {type(exc).__name__}: {exc} on {response[:60]!r}; it must raise FormatError only")
    if not isinstance(action, str):
        _fail(what, f"returned {type(action).__name__} for {response[:60]!r}; it must return the action as a str")
    return action


# -- hostile replies ---------------------------------------------------------------------------------------------
_COMMAND_WRAPS = (
    ("", "", "", False),
    (" in a fenced block", "DISCUSSION\nx\n```\n", "\n```\n", False),
    (" in <command> tags", "<command>\n", "\n</command>", False),
    (" in a JSON command", '{"thought": "t", "command": "', '"}', True),
    (" in a tool call", _CALL, _CALL_END, True),
)
"""Where a command stands in each common reply style: name, text before, text after, and whether the command is a
JSON string there (its newlines escaped)."""


def _json_text(text: str) -> str:
    return json.dumps(text)[1:-1]


def _wrapped(name: str, unit: str, *, closer: str = "", prefix: str = "", middle: str = "", megabyte: bool = False,
             every_style: bool = False) -> list[HostileReply]:
    """The family ``prefix + unit * n + middle + closer * n`` as a command of each of ``_COMMAND_WRAPS`` (the bare
    and fenced ones only, unless ``every_style``)."""
    families = []
    for where, before, after, escaped in _COMMAND_WRAPS if every_style else _COMMAND_WRAPS[:2]:
        text = _json_text if escaped else str
        families.append(HostileReply(f"{name}{where}", text(unit), text(closer), before + text(prefix), text(middle),
                                     after, megabyte))
    return families


def _command_replies() -> tuple[HostileReply, ...]:
    replies = [
        # every line a multi-line command whose terminator never comes: a search for it after each one is quadratic
        *_wrapped("edit lines", "edit 1:2\n", megabyte=True, every_style=True),
        *_wrapped("insert lines", "insert 1\n", megabyte=True, every_style=True),
        *_wrapped("edit lines and end_of_insert lines", "edit 1:2\nend_of_insert\n", every_style=True),
        *_wrapped("edit lines, then one end_of_edit", "edit 1:2\n", middle="end_of_edit\n", megabyte=True),
        *_wrapped("edit lines with CRLF", "edit 1:2\r\n"),
        *_wrapped("end_of_edit lines", "end_of_edit\n"),
        *_wrapped("edits, each ended", "edit 1:2\nx\nend_of_edit\n", megabyte=True),
        # here-documents, opened and never closed, and heredoc operators on one line
        *_wrapped("heredoc openers", "cat << EOF\n", megabyte=True),
        *_wrapped("heredocs, each closed", "cat << EOF\nx\nEOF\n"),
        *_wrapped("heredoc operators on one line", "<< EOF ", prefix="cat ", middle="\nEOF"),
        *_wrapped("heredoc operators on an edit line", "<< 'end_of_edit' ", prefix="edit 1:2 ",
                  middle="\nx\nend_of_edit"),
        # blank space around a command and its terminator
        *_wrapped("spaces after an edit's heredoc operator", " ", prefix="edit 1:2 <<", middle="x\nend_of_edit"),
        *_wrapped("spaces before an edit", " ", middle="edit 1:2\nx\nend_of_edit"),
        *_wrapped("spaces after an insert's argument", " ", prefix="insert 1", middle="x"),
        *_wrapped("spaces after end_of_edit", " ", prefix="edit 1:2\nx\nend_of_edit"),
        *_wrapped("spaces then text after end_of_edit", " ", prefix="edit 1:2\nx\nend_of_edit", middle="x"),
        # odd characters in an edit's body
        *_wrapped("lone surrogates in an edit", "\ud800", prefix="edit 1:2\n", middle="\nend_of_edit"),
        *_wrapped("NUL bytes in an edit", "\x00", prefix="edit 1:2\n", middle="\nend_of_edit"),
    ]
    return tuple(replies)


COMMAND_HOSTILE_REPLIES = _command_replies()
"""The families of hostile replies aimed at what an isolator does after the parser: lines of multi-line commands
(``edit 1:2``, ``insert 1``) whose terminator never comes, terminators alone, here-documents never closed, heredoc
operators and blank space on a command line, odd characters in an edit's body; each bare and in a fenced block, the
``edit``/``insert`` lines in every common reply style too."""

ISOLATOR_HOSTILE_REPLIES = HOSTILE_REPLIES + COMMAND_HOSTILE_REPLIES
"""What ``check_isolator_hostile`` feeds an isolator: the parsers' ``HOSTILE_REPLIES``, then
``COMMAND_HOSTILE_REPLIES``."""

ISOLATOR_MUST = ("an action isolator must run in time linear in the reply. Look for a search to the end of the reply "
                 "restarted at every line (a terminator line looked for after every edit/insert line: find the "
                 "terminator lines once, or remember where none is left), a regex with adjacent or nested "
                 "quantifiers over the same characters, or text rebuilt in a loop; if the time is the parser's, "
                 "check_parser shows it")
"""How an isolator too slow on a hostile reply is told what to do."""


def check_isolator_hostile(isolator: Callable[..., Any], parser: Callable[[str], Any] | None = None,
                           replies: tuple[HostileReply, ...] = ISOLATOR_HOSTILE_REPLIES) -> None:
    """Feed ``isolator(reply, parser)`` every family of ``replies`` at each of ``LENGTHS`` (and at ``MEGABYTE`` for
    the families marked ``megabyte``), as the chain calls it: each reply must give an action (a ``str``) or raise
    ``FormatError`` (nothing else), and the time must grow no more than linearly with the length, judged as
    ``check_parser_hostile`` judges a parser's (the parser's own time counts too). ``parser`` defaults to
    ``thought_action``. ``check_isolator`` runs this last.
    """
    from ..components.parsers import ThoughtActionParser

    parser = parser or ThoughtActionParser()
    what = f"isolator {_name(isolator)} (with parser {_name(parser)})"
    for family in replies:
        def call(text: str, family: HostileReply) -> None:
            _hostile_isolate(isolator, parser, text, family, what)

        check_linear_time(call, family, what, ISOLATOR_MUST)


def _hostile_isolate(isolator: Callable[..., Any], parser: Callable[[str], Any], text: str, family: HostileReply,
                     what: str) -> None:
    """``isolator(text, parser)``; anything but a string or ``FormatError`` fails the check."""
    try:
        action = isolator(text, parser)
    except FormatError:
        return
    except Exception as exc:  # noqa: BLE001 - any other exception is exactly what the check reports
        _fail(what, f"raised {type(exc).__name__}: {_text(exc)} on a hostile reply ({family.name}, {len(text):,} "
                    f"characters); an action isolator must return the action or raise mlgym_registry.errors."
                    f"FormatError on every reply, however deep, long or odd: loop instead of recursing, bound what "
                    f"you read, and raise FormatError for a reply you cannot use (an exception the parser raised "
                    f"through it is the parser's: check_parser shows it)")
    if not isinstance(action, str):
        _fail(what, f"returned {type(action).__name__} for a hostile reply ({family.name}, {len(text):,} characters); "
                    f"it must return the action as a str or raise FormatError")
