"""Conformance checks for action isolators."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from ..errors import FormatError
from ._common import _fail, _name

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
    ``FormatError`` whenever the parser itself finds no action in them.
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
