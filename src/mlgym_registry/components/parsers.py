"""Response parsers: turn the model's text into ``(thought, action)``.

A parser is any callable ``parser(response: str) -> (thought, action)`` that raises
``mlgym_registry.errors.FormatError`` when the response holds no usable action. The parsers here reproduce the
behaviour of MLGym's parsers of the same purpose (checked against MLGym's recorded trajectories); their error
explanations (``format_error_message``) are our own wording.
"""

from __future__ import annotations

import re

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

_FENCED_FORMAT = """\
Your reply could not be used: no command was run.
Each reply must contain a short discussion followed by exactly one command, written in a fenced code block that
starts with a line of three backticks and ends with another line of three backticks, like this:

DISCUSSION
What I have learned so far and what this command is meant to do.

```
the command to run
```
"""


class ThoughtActionParser:
    """The last complete top-level fenced code block is the action; everything around it is the thought.

    Fence lines count only at column 0. A fence with an info string (```` ```python ````) opens a block, nested when a
    block is already open; a bare fence closes the innermost open block (or opens one when none is open). The action
    is the text between the two fence lines, unstripped (it keeps its trailing newline); the thought is the text
    before plus the text after the block. Same semantics as MLGym's ``ThoughtActionParser`` (TorchRL's default).
    """

    format_error_message: str = _FENCED_FORMAT

    def __call__(self, response: str) -> tuple[str, str]:
        """Split ``response`` into ``(thought, action)``; ``FormatError`` when there is no complete block."""
        span = last_top_level_block(response)
        if span is None:
            raise FormatError(NO_ACTION)
        open_start, open_end, close_start, close_end = span
        return response[:open_start] + response[close_end:], response[open_end:close_start]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class StrictThoughtActionParser(ThoughtActionParser):
    """Like ``ThoughtActionParser``, but more than one ```` ```...``` ```` pair anywhere is a format error.

    The pairs are counted non-greedily over the whole text, fences mid-line included, as MLGym's default agent
    (``MLGymThoughtActionParser``) does.
    """

    format_error_message: str = (
        _FENCED_FORMAT
        + "\nWrite only one code block per reply, and no other triple backticks, even inside the discussion.\n"
    )

    def __call__(self, response: str) -> tuple[str, str]:
        """Split ``response`` into ``(thought, action)``; ``FormatError`` on zero or several code blocks."""
        if count_code_blocks(response) > 1:
            raise FormatError(MORE_THAN_ONE_BLOCK)
        return super().__call__(response)


class XMLThoughtActionParser:
    """The last ``<command>...</command>`` is the action; the text around it is the thought. Both are stripped."""

    format_error_message: str = """\
Your reply could not be used: no command was run.
Each reply must contain a short discussion followed by exactly one command between <command> and </command> tags:

DISCUSSION
What I have learned so far and what this command is meant to do.
<command>
the command to run
</command>
"""

    def __call__(self, response: str) -> tuple[str, str]:
        """Split ``response`` into ``(thought, action)``; ``FormatError`` when there is no complete tag pair."""
        close = response.rfind("</command>")
        start = response.rfind("<command>", 0, close) if close >= 0 else -1
        if start < 0:
            raise FormatError(NO_ACTION)
        action = response[start + len("<command>"):close]
        thought = response[:start] + response[close + len("</command>"):]
        return thought.strip(), action.strip()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IdentityParser:
    """The whole response is both the thought and the action (for models that answer with a bare command)."""

    format_error_message: str = "Your reply could not be used: no command was run. Reply with the command to run.\n"

    def __call__(self, response: str) -> tuple[str, str]:
        """Return ``(response, response)``."""
        return response, response

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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
