"""MLGym's edit lint, in the edit helper's own process: flake8's findings for its selection of checks, the way
``flake8 --isolated --select=F821,F822,F831,E111,E112,E113,E999,E902`` reports them.

flake8 runs pyflakes over the file's syntax tree and pycodestyle over its logical lines, then drops what a ``# noqa``
comment covers. Started as a program of its own for every edit, it cost about 0.2 s of CPU, most of it importing its
option machinery and looking for plugins among every installed distribution; the checks themselves are pyflakes'
and pycodestyle's, which this module calls directly (about 0.05 s). ``tests/backends/test_edit_lint.py`` holds it to
flake8's own output.

What flake8 does that this keeps:
- the file is read as ``tokenize.open`` reads it (its coding cookie; latin-1 where that fails), a UTF-8 byte order
  mark dropped; a file that cannot be read is ``E902`` at line 0, and a file with a ``# flake8: noqa`` line of its
  own is not checked;
- a file that does not compile reports ``E999`` alone, at the position its ``SyntaxError`` names (flake8 adds one to
  that column as to every other), and nothing else (unless a ``# noqa`` covers it);
- findings are ordered by line and column, each with flake8's 1-based column;
- ``# noqa`` (every code) and ``# noqa: CODE,...`` (those codes, by prefix) cover the lines that end at one newline
  token together (a string over several lines, lines joined by a backslash): written on any of them, it covers all.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from dataclasses import dataclass

SELECT = ("F821", "F822", "F831", "E111", "E112", "E113", "E999", "E902")
"""MLGym's selection of flake8 checks: names that are not defined, bad arguments, broken indentation, no syntax."""

PYFLAKES_CODES = {"UndefinedName": "F821", "UndefinedExport": "F822", "DuplicateArgument": "F831"}
"""flake8's codes for the pyflakes messages of the selection (the others are not selected)."""

INDENT_SIZE = 4
"""flake8's default ``--indent-size``."""

NOQA_INLINE = re.compile(r"# noqa(?::[\s]?(?P<codes>([A-Z]+[0-9]+(?:[,\s]+)?)+))?", re.I)
"""flake8's inline ``# noqa`` comment, with or without codes."""

NOQA_FILE = re.compile(r"\s*# flake8[:=]\s*noqa", re.I)
"""flake8's whole-file ``# flake8: noqa`` line."""

NOQA_CODE = re.compile(r"[A-Z]+[0-9]+", re.I)


@dataclass(frozen=True)
class LintError:
    """One finding: where it is (1-based line and column, as flake8 prints them) and what it says
    (``"F821 undefined name 'x'"``)."""

    line: int
    col: int
    problem: str


def lint(path: str) -> list[LintError]:
    """The findings of MLGym's lint selection in the file at ``path``, in flake8's order."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        return [LintError(0, 1, f"E902 {type(error).__name__}: {error}")]
    return lint_source(data, path)


def lint_source(data: bytes, path: str) -> list[LintError]:
    """The findings of MLGym's lint selection in ``data``, the bytes of a Python file shown as ``path``, as ``lint``
    finds them in a file that holds those bytes."""
    lines = _decoded_lines(data)
    if lines and lines[0][:1] == "\ufeff":
        lines[0] = lines[0][1:]
    if any(NOQA_FILE.match(line) for line in lines):
        return []
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError) as error:
        # older 3.11 releases raise ValueError for a null byte, where later ones (and flake8 on them) say SyntaxError
        kind = "SyntaxError" if isinstance(error, ValueError) else type(error).__name__
        row, col = _syntax_position(error)
        found = [(row, col, f"E999 {kind}: {error.args[0]}")]
    else:
        found = _pyflakes(tree, path) + _indentation(lines, path)
        found.sort(key=lambda finding: (finding[0], finding[1]))
    covering = _noqa_lines(lines)
    return [LintError(line, col + 1, problem) for line, col, problem in found
            if not _ignored(problem, covering.get(line, _physical_line(lines, line)))]


def _decoded_lines(data: bytes) -> list[str]:
    """``data``'s lines as ``tokenize.open`` reads a file (its coding cookie, newlines made ``\\n``), or as latin-1
    where that fails, as flake8 reads a file."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return io.TextIOWrapper(io.BytesIO(data), encoding, line_buffering=True).readlines()
    except (SyntaxError, UnicodeError):
        return io.TextIOWrapper(io.BytesIO(data), "latin-1").readlines()


def _syntax_position(error: SyntaxError | ValueError) -> tuple[int, int]:
    """Where flake8 places a syntax error: the line and offset the error names, else line 1, column 0."""
    if len(error.args) > 1 and error.args[1] and len(error.args[1]) > 2:
        return error.args[1][1], error.args[1][2]
    return 1, 0


def _pyflakes(tree: ast.AST, path: str) -> list[tuple[int, int, str]]:
    import pyflakes.checker

    checker = pyflakes.checker.Checker(tree, filename=path, withDoctest=False)
    found = []
    for message in checker.messages:
        code = PYFLAKES_CODES.get(type(message).__name__)
        if code is not None:
            text = message.message % message.message_args
            found.append((message.lineno, getattr(message, "col", 0), f"{code} {text}"))
    return found


def _indentation(lines: list[str], path: str) -> list[tuple[int, int, str]]:
    """pycodestyle's indentation checks of the selection (E111, E112, E113) over the file's logical lines."""
    import pycodestyle

    style = _style_guide()
    report = style.options.report
    report.found = []
    pycodestyle.Checker(path, lines=lines, options=style.options, report=report).check_all()
    return report.found


@functools.cache
def _style_guide():
    """pycodestyle set up once for the selection's indentation checks, its report collecting what they find."""
    import pycodestyle

    class Collect(pycodestyle.BaseReport):
        found: list[tuple[int, int, str]] = []

        def error(self, line_number, offset, text, check):
            if text[:4] in SELECT:
                self.found.append((line_number, offset, text))

    return pycodestyle.StyleGuide(select=[code for code in SELECT if code.startswith("E11")], quiet=True,
                                  indent_size=INDENT_SIZE, reporter=Collect)


def _noqa_lines(lines: list[str]) -> dict[int, str]:
    """For each line, the text of all the lines that end at the same newline token: where flake8 looks for a
    ``# noqa`` that covers a finding on that line."""
    covering: dict[int, str] = {}
    first, last = len(lines) + 2, -1
    try:
        for token in tokenize.generate_tokens(iter(lines).__next__):
            if token.type in (tokenize.ENDMARKER, tokenize.DEDENT):
                continue
            first, last = min(first, token.start[0]), max(last, token.end[0])
            if token.type in (tokenize.NL, tokenize.NEWLINE):
                text = "".join(lines[first - 1:last])
                covering.update(dict.fromkeys(range(first, last + 1), text))
                first, last = len(lines) + 2, -1
    except (tokenize.TokenError, SyntaxError):
        return {}
    return covering


def _physical_line(lines: list[str], line: int) -> str:
    """The line's own text, where flake8 looks for ``# noqa`` when no statement covers the line."""
    return lines[line - 1] if 1 <= line <= len(lines) else ""


def _ignored(problem: str, text: str) -> bool:
    """Whether a ``# noqa`` in ``text`` covers the finding ``problem`` (flake8's rules: no codes covers all, else a
    code that the finding's code starts with)."""
    match = NOQA_INLINE.search(text)
    if match is None:
        return False
    codes = match.group("codes")
    if not codes:
        return True
    code = problem.split(" ", 1)[0]
    return any(code.startswith(listed) for listed in set(NOQA_CODE.findall(codes)))


def main(paths: list[str]) -> int:
    """Print the findings in each file of ``paths`` as flake8 prints them (``path:line:col: CODE text``); exit
    status 1 when there are any."""
    found = [f"{path}:{error.line}:{error.col}: {error.problem}" for path in paths for error in lint(path)]
    if found:
        print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
