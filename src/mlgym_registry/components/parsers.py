"""Response parsers: turn the model's text into ``(thought, action)``.

A parser is any callable ``parser(response: str) -> (thought, action)`` that raises
``mlgym_registry.errors.FormatError`` when the response holds no usable action. The parsers here reproduce the
behaviour of MLGym's parsers of the same purpose (checked against MLGym's recorded trajectories).

Beside ``__call__`` a parser may describe its format, and every parser here does (in our own wording):

- ``format_instructions: str``: how to write a reply, example included; the system prompt shows it under HOW TO
  REPLY (the ``{format_instructions}`` placeholder of the templates).
- ``format_error_message: str``: the text that asks the model to answer again after a format error.
- ``format_action(action) -> str``: a response that carries ``action`` in this format. For an ordinary command
  (no line that is a fence, no ``</command>`` inside), ``parser(parser.format_action(a))[1].strip() == a.strip()``;
  the fenced parsers give the action back with one trailing newline, as they give every action.

All three are optional for parsers of other plugins: the chain and the conformance kit fall back to generic text.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import FormatError

NO_ACTION = "No action found in model response."
"""MLGym's message when a response has no complete code block (or no command tags)."""

MORE_THAN_ONE_BLOCK = "Found more than one code block in the model response."
"""MLGym's message when the strict parser sees several code blocks."""

# A fence line: ``` at column 0, then an optional info string. The first alternative ends at the newline (and may
# swallow trailing blank space on the way); the second is a bare fence at the very end of the text.
_FENCE = re.compile(r"^```(\S*)\s*\n|^```\s*$", re.MULTILINE)
# Any ```...``` pair anywhere in the text, counted non-greedily (what MLGym's strict parser counts).
_ANY_BLOCK = re.compile(r"```([\s\S]*?)```")

_UNUSED = "Your reply could not be used: no command was run.\n"

_REPLY_SHAPE = """\
Every reply has two parts, in this order:
1. A short DISCUSSION: what you have learned so far and what the next command should achieve.
2. """
"""The start of the fenced and tagged parsers' instructions; their own rule for the command follows."""

_FENCED_RULE = """\
Exactly one command, in a fenced code block: a line of three backticks, the command, and a closing line of three
   backticks.
"""

_TAGGED_RULE = """\
Exactly one command, between a line holding the tag <command> and a line holding the closing tag </command>.
"""

_ONE_BLOCK_ONLY = "\nWrite only one code block per reply, and no other triple backticks, even inside the discussion.\n"

_BARE_RULE = "Reply with the command to run and nothing else: the whole reply is run as one command.\n"


def _fenced(action: str) -> str:
    """``action`` in a fenced code block (the body ends with exactly the newline the closing fence needs)."""
    body = action if action.endswith("\n") else action + "\n"
    return f"```\n{body}```"


def _tagged(action: str) -> str:
    """``action`` between ``<command>`` and ``</command>`` lines."""
    return f"<command>\n{action.strip()}\n</command>"


def _instructions(rule: str, show: str, extra: str = "") -> str:
    """A parser's ``format_instructions``: the reply's shape, its ``rule`` for the command, an example."""
    example = "I do not know the layout of the workspace yet, so I will list every file in it, hidden ones included."
    return f"{_REPLY_SHAPE}{rule}\nFor example:\n\nDISCUSSION\n{example}\n\n{show}\n{extra}"


def _retry(rule: str, show: str, extra: str = "") -> str:
    """A parser's ``format_error_message``: the same shape and rule, with a template of a reply."""
    return (f"{_UNUSED}{_REPLY_SHAPE}{rule}\nLike this:\n\nDISCUSSION\nWhat I have learned so far and what this "
            f"command is meant to do.\n\n{show}\n{extra}")


class ThoughtActionParser:
    """The last complete top-level fenced code block is the action; everything around it is the thought.

    Fence lines count only at column 0. A fence with an info string (```` ```python ````) opens a block, nested when a
    block is already open; a bare fence closes the innermost open block (or opens one when none is open). The action
    is the text between the two fence lines, unstripped (it keeps its trailing newline); the thought is the text
    before plus the text after the block. Same semantics as MLGym's ``ThoughtActionParser`` (TorchRL's default).
    """

    format_instructions: str = _instructions(_FENCED_RULE, _fenced("ls -a"))
    format_error_message: str = _retry(_FENCED_RULE, _fenced("the command to run"))

    def __call__(self, response: str) -> tuple[str, str]:
        """Split ``response`` into ``(thought, action)``; ``FormatError`` when there is no complete block."""
        span = last_top_level_block(response)
        if span is None:
            raise FormatError(NO_ACTION)
        open_start, open_end, close_start, close_end = span
        return response[:open_start] + response[close_end:], response[open_end:close_start]

    def format_action(self, action: str) -> str:
        """``action`` in a fenced code block; parsed back, it keeps (or gains) one trailing newline."""
        return _fenced(action)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class StrictThoughtActionParser(ThoughtActionParser):
    """Like ``ThoughtActionParser``, but more than one ```` ```...``` ```` pair anywhere is a format error.

    The pairs are counted non-greedily over the whole text, fences mid-line included, as MLGym's default agent
    (``MLGymThoughtActionParser``) does.
    """

    format_instructions: str = _instructions(_FENCED_RULE, _fenced("ls -a"), _ONE_BLOCK_ONLY)
    format_error_message: str = _retry(_FENCED_RULE, _fenced("the command to run"), _ONE_BLOCK_ONLY)

    def __call__(self, response: str) -> tuple[str, str]:
        """Split ``response`` into ``(thought, action)``; ``FormatError`` on zero or several code blocks."""
        if count_code_blocks(response) > 1:
            raise FormatError(MORE_THAN_ONE_BLOCK)
        return super().__call__(response)


class XMLThoughtActionParser:
    """The last ``<command>...</command>`` is the action; the text around it is the thought. Both are stripped."""

    format_instructions: str = _instructions(_TAGGED_RULE, _tagged("ls -a"))
    format_error_message: str = _retry(_TAGGED_RULE, _tagged("the command to run"))

    def __call__(self, response: str) -> tuple[str, str]:
        """Split ``response`` into ``(thought, action)``; ``FormatError`` when there is no complete tag pair."""
        close = response.rfind("</command>")
        start = response.rfind("<command>", 0, close) if close >= 0 else -1
        if start < 0:
            raise FormatError(NO_ACTION)
        action = response[start + len("<command>"):close]
        thought = response[:start] + response[close + len("</command>"):]
        return thought.strip(), action.strip()

    def format_action(self, action: str) -> str:
        """``action`` between ``<command>`` and ``</command>`` lines; parsed back, it comes out stripped."""
        return _tagged(action)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IdentityParser:
    """The whole response is both the thought and the action (for models that answer with a bare command)."""

    format_instructions: str = (
        _BARE_RULE + "No discussion, no explanation, no code fences or tags around it.\n\nFor example, to list every "
        "file in the workspace, hidden ones included, the whole reply is:\n\nls -a\n"
    )
    format_error_message: str = _UNUSED + _BARE_RULE

    def __call__(self, response: str) -> tuple[str, str]:
        """Return ``(response, response)``."""
        return response, response

    def format_action(self, action: str) -> str:
        """``action`` itself: the whole response is the command."""
        return action

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


ANSWER_FILE = "answer.txt"
"""Where ``AnswerOrCommandParser`` writes a reply without a code block, in the workspace."""

ANSWER_END = "END_OF_ANSWER"
"""The line that ends the here-document holding the answer."""


def answer_command(answer: str) -> str:
    """The shell command that writes ``answer`` to ``ANSWER_FILE`` verbatim (a quoted here-document: nothing in it is
    expanded) and then submits."""
    body = answer if answer.endswith("\n") else answer + "\n"
    return f"cat > {ANSWER_FILE} << '{ANSWER_END}'\n{body}{ANSWER_END}\nsubmit"


class AnswerOrCommandParser(ThoughtActionParser):
    """For answer tasks: a fenced code block is a command, as with ``thought_action``; any other reply is the answer,
    which the action writes to ``answer.txt`` and submits (``answer_command``). It never raises ``FormatError``.

    This is what lets a model that has not learned the command format yet be scored at all: its first reply is its
    answer, and the task's evaluator scores it like any submission.
    """

    format_instructions: str = (
        "Reply with your answer and nothing else: a reply without a code block is your final answer. It is saved to "
        f"{ANSWER_FILE} and submitted, which ends the task.\nTo run a command first (to look around), put it alone in "
        "a fenced code block instead: a line of three backticks, the command, and a closing line of three backticks."
    )
    format_error_message: str = "Your reply could not be used. Reply with your answer, or with one command in a " \
        "fenced code block.\n"

    def __call__(self, response: str) -> tuple[str, str]:
        """``(thought, command)`` for a reply with a complete code block, else ``("", answer_command(response))``."""
        if last_top_level_block(response) is not None:
            return super().__call__(response)
        return "", answer_command(response)


def reads_action(parser: Any, response: str, action: str) -> bool:
    """Whether ``parser`` finds exactly ``action`` (up to surrounding blank space) in ``response``; any error it
    raises (``FormatError`` or another) counts as not."""
    try:
        result = parser(response)
    except Exception:  # noqa: BLE001 - a parser that cannot read this response does not read the action
        return False
    return isinstance(result, (tuple, list)) and len(result) == 2 and str(result[1]).strip() == action.strip()


def last_top_level_block(text: str) -> tuple[int, int, int, int] | None:
    """Offsets ``(open_start, open_end, close_start, close_end)`` of the last complete top-level fenced block, or None.

    ``open_end`` is where the block's body starts and ``close_start`` where it ends.
    """
    stack: list[re.Match[str]] = []
    last: tuple[int, int, int, int] | None = None
    for fence in _FENCE.finditer(text):
        info = fence.group(1)
        if stack and not info:
            opening = stack.pop()
            if not stack:
                last = (opening.start(), opening.end(), fence.start(), fence.end())
        elif info is not None:
            # An info-string fence always opens (nested if a block is open); a bare fence opens only at top level.
            # A bare fence at the very end of the text (``info is None``) can only close.
            stack.append(fence)
    return last


def count_code_blocks(text: str) -> int:
    """How many ```` ```...``` ```` pairs ``text`` holds, matched left to right and non-greedily, anywhere in a line."""
    return len(_ANY_BLOCK.findall(text))
