"""Action isolators: turn the model's whole response into the command the backend runs.

An isolator is a callable ``isolator(response: str, parser) -> action`` that raises
``mlgym_registry.errors.FormatError`` when the response holds no usable action. The transform that calls it flags a
retry (and the optional penalty) on that error.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping

from ..errors import FormatError
from .parsers import ThoughtActionParser

MULTILINE_COMMAND_ENDINGS: Mapping[str, str] = {"edit": "end_of_edit", "insert": "end_of_insert"}
"""The multi-line tool commands and the line that ends their body (MLGym's ``end_name`` of ``edit`` and ``insert``)."""

Parser = Callable[[str], tuple[str, str]]

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
# a here-document operator (not a here-string) and its delimiting word, quoted or not
_HEREDOC = re.compile(r"(?<!<)<<-?(?!<)[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
# a multi-line command as a model writes it: the name, at most one argument (``insert 3``), no heredoc operator
_BARE_COMMAND = re.compile(r"^\s*(?P<name>\S+)(?:[ \t]+[^\s<>|;&]+)?[ \t]*\r?$")


def replace_lone_surrogates(text: str) -> str:
    """``text`` with every surrogate code point, which is no character and which UTF-8 cannot encode, made valid.

    A tokenizer can decode a model's output into a lone surrogate (``"\\ud800"``); encoding it for the shell then
    raises ``UnicodeEncodeError``. A high surrogate followed by a low one becomes the character the pair stands for
    (UTF-16 read as code points), every other surrogate becomes U+FFFD. Text without surrogates is returned as it is.
    """
    if _SURROGATE.search(text) is None:
        return text
    text = _SURROGATE_PAIR.sub(lambda pair: pair.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le"), text)
    return _SURROGATE.sub("\ufffd", text)


def malformed_message(name: str, terminator: str) -> str:
    """What a multi-line command without its terminator line gets (MLGym's wording for ``edit``)."""
    return f"Malformed {name} command. Please ensure you use the `{terminator}` keyword to mark the end of your {name}."


def guard_multiline_input(action: str, endings: Mapping[str, str] = MULTILINE_COMMAND_ENDINGS) -> str:
    """Turn every multi-line ``edit``/``insert`` in ``action`` into a heredoc, as MLGym's agent does before a step.

    The command line ``edit 14:33`` becomes ``edit 14:33 << 'end_of_edit'`` when a later line reads ``end_of_edit``
    (``insert 5`` likewise with ``end_of_insert``), so the shell feeds the body to the tool instead of running it.
    Unlike MLGym's agent, the command is guarded wherever it stands in the action (text before it is kept intact).
    A command already followed by a heredoc operator, or whose terminator line is missing, is left as it is; body
    lines are never treated as commands. Guarding a guarded action changes nothing.
    """
    if not endings:
        return action
    command = _command_pattern(endings)
    lines = action.split("\n")
    terminators: TerminatorSearch | None = None  # made at the first command: most actions have none
    index = 0
    while index < len(lines):
        match = command.match(lines[index])
        if match is None:
            index += 1
            continue
        terminator = endings[match.group(1)]
        terminators = terminators or TerminatorSearch(lines)
        end = terminators.first(terminator, index + 1)
        if end is None:
            index += 1
            continue
        if not _has_heredoc(lines[index], terminator):
            line = lines[index]
            carriage = "\r" if line.endswith("\r") else ""
            lines[index] = line[: len(line) - len(carriage)] + f" << '{terminator}'" + carriage
        index = end + 1
    return "\n".join(lines)


def unterminated_command(
    action: str, names: Iterable[str] = ("insert",), endings: Mapping[str, str] = MULTILINE_COMMAND_ENDINGS
) -> str | None:
    """The name of the first command of ``names`` in ``action`` that has no terminator line after it, or None.

    Such a command is not guarded, so the shell would run its body lines as commands. Lines are read as
    ``guard_multiline_input`` reads them (a guarded command's body is skipped), and the body of any other
    here-document is skipped too; a command counts only as a model writes it, the name and at most one argument on
    its line (``insert 3``), so that free text such as ``insert into t values (1)`` is not taken for one.
    """
    wanted = {name for name in names if name in endings}
    if not wanted:
        return None
    command = _command_pattern(endings)
    lines = action.split("\n")
    terminators: TerminatorSearch | None = None  # made at the first command: most actions have none
    index = 0
    while index < len(lines):
        match = command.match(lines[index])
        if match is None:
            index = _after_heredocs(lines, index)
            continue
        name = match.group(1)
        terminators = terminators or TerminatorSearch(lines)
        end = terminators.first(endings[name], index + 1)
        if end is not None:
            index = end + 1
            continue
        bare = _BARE_COMMAND.match(lines[index])
        if name in wanted and bare is not None and bare.group("name") == name:
            return name
        index += 1
    return None


def _after_heredocs(lines: list[str], index: int) -> int:
    """The index of the line after ``lines[index]`` and the bodies of the here-documents it opens (``<< EOF``)."""
    for word in _HEREDOC.findall(lines[index]):
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == word[1]), None)
        if end is None:
            return len(lines)
        index = end
    return index + 1


def _command_pattern(endings: Mapping[str, str]) -> re.Pattern[str]:
    return _names_pattern(tuple(endings))


@functools.lru_cache(maxsize=64)
def _names_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    """A line that starts with one of ``names`` (the longest first), after blank space."""
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(rf"^\s*({alternatives})(?=\s|$)")


class TerminatorSearch:
    """Finds the terminator line of a multi-line command in ``lines``: a line that is the terminator at column 0,
    trailing space allowed (``line.rstrip() == terminator``).

    A search that finds nothing is remembered: no later search for that terminator from that line on reads a line
    again. Searching the rest of the reply anew after every ``edit`` line made a reply of ``edit`` lines quadratic
    (10^5 characters: seconds; a megabyte: minutes). With searches that go on after the line each one found (as
    ``guard_multiline_input`` and ``unterminated_command`` do), every line is read at most once per terminator, and
    an ordinary reply costs what a plain scan does.
    """

    __slots__ = ("_lines", "_missing")

    def __init__(self, lines: list[str]):
        self._lines = lines
        self._missing: dict[str, int] = {}

    def first(self, terminator: str, start: int) -> int | None:
        """The index of the first terminator line ``terminator`` at or after ``start``, or None."""
        missing = self._missing.get(terminator)
        if missing is not None and start >= missing:
            return None
        lines = self._lines
        for index in range(start, len(lines)):
            if lines[index].rstrip() == terminator:
                return index
        self._missing[terminator] = start
        return None


def _has_heredoc(line: str, terminator: str) -> bool:
    """True when ``line`` already ends with a heredoc operator for ``terminator`` (quoted or not)."""
    return re.search(rf"<<-?\s*(['\"]?){re.escape(terminator)}\1\s*$", line) is not None


class CodeBlockIsolator:
    """Parse the response with the task's parser, then heredoc-guard ``edit``/``insert`` bodies.

    The result is what MLGym's agent sends to ``env.step``: the guarded action, stripped. An empty action (an empty
    code block) is a ``FormatError`` too: running nothing would only waste a step. So is a command of
    ``unterminated`` (``insert``) without its terminator line, whose body the shell would otherwise run as commands;
    an ``edit`` without ``end_of_edit`` is left to the backend, which answers it with MLGym's malformed-edit
    observation. Lone surrogates in the response are made valid text first (``replace_lone_surrogates``).
    """

    def __init__(
        self, endings: Mapping[str, str] = MULTILINE_COMMAND_ENDINGS, unterminated: Iterable[str] = ("insert",)
    ):
        self.endings = dict(endings)
        self.unterminated = tuple(unterminated)

    def __call__(self, response: str, parser: Parser | None = None) -> str:
        """The backend action for ``response``; ``FormatError`` when ``parser`` finds none (default: thought_action)."""
        if not isinstance(response, str) or not response.strip():
            raise FormatError("The model response is empty.")
        parser = parser if parser is not None else ThoughtActionParser()
        _thought, action = parser(replace_lone_surrogates(response))
        name = unterminated_command(action, self.unterminated, self.endings)
        if name is not None:
            raise FormatError(malformed_message(name, self.endings[name]))
        action = guard_multiline_input(action, self.endings).strip()
        if not action:
            raise FormatError("The code block in the model response is empty.")
        return action

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
