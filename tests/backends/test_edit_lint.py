"""The edit tools' lint (``backends/local/tools/lint.py``) against flake8 itself: for hand-written cases of every
selected check and every rule flake8 applies (``# noqa``, ``# flake8: noqa``, encodings, syntax errors), and for
mutants of real Python files, both print the same lines."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

import mlgym_registry
from mlgym_registry.backends.local.tools.lint import lint, lint_source
from mlgym_registry.backends.local.toolset import TOOLS_DIR

FLAKE8_SELECT = "F821,F822,F831,E111,E112,E113,E999,E902"
"""MLGym's flake8 command's selection, which the lint module reproduces."""

CASES: dict[str, bytes] = {
    "clean": b"def f(x):\n    return x\n",
    "empty": b"",
    "no_final_newline": b"def f():\n    return y",
    "undefined": b"import os\n\ndef f():\n    return os.path, missing + other\n",
    "undefined_in_annotation_string": b"def f(x: 'Nope') -> 'Missing':\n    return x\n",
    "undefined_export": b"__all__ = ['here', 'gone']\nhere = 1\n",
    "undefined_export_augmented": b"__all__ = ['a']\n__all__ += ['b']\na = 1\n",
    "duplicate_argument": b"def f(a, b, a):\n    return b\n\nlambda x, x: x\n",
    "bad_indent": b"def f():\n   x = 1\n   return x\n\nclass C:\n      y = 2\n",
    "bad_indent_nested": b"if True:\n    if True:\n         pass\n",
    "tabs": b"def f():\n\treturn 1\n\n\ndef g():\n\t\treturn 2\n",
    "mixed_tabs_spaces": b"def f():\n    if 1:\n\treturn 1\n",
    "blanket_noqa": b"x = nope  # noqa\ny = nah  # NOQA\n",
    "noqa_with_codes": b"x = nope  # noqa: F821\ny = nah  # noqa:E111\nz = gone  # noqa: F8,E1\nw = no  # noqa: f821\n",
    "noqa_in_a_multiline_string_statement": b'x = """\nline\n""" + nope  # noqa\ny = """\n"""; z = nah\n',
    "noqa_inside_brackets": b"x = [a  # noqa\n     for b in c]\ny = (d +\n     e)  # noqa: F821\n",
    "file_noqa": b"# flake8: noqa\nx = nope\n",
    "file_noqa_after_code": b"x = nope  # flake8: noqa\n",
    "syntax_error": b"def f(:\n    pass\n",
    "syntax_error_under_noqa": b"  x = 1  # noqa: E999\n",
    "syntax_error_under_other_noqa": b"def f(:  # noqa: F821\n    pass\n",
    "unclosed_bracket": b"x = (1,\ny = 2\n",
    "unterminated_string": b"x = 'abc\n",
    "unterminated_triple_string": b'x = """abc\n\n',
    "indentation_error": b"def f():\nreturn 1\n",
    "unexpected_indent": b"x = 1\n    y = 2\n",
    "unindent_mismatch": b"if x:\n        a = 1\n    b = 2\n",
    "bom": b"\xef\xbb\xbfx = nope\n",
    "latin1_cookie": b"# -*- coding: latin-1 -*-\nname = '\xe9t\xe9'\nx = nope\n",
    "bad_utf8": b"x = '\xff\xfe'\ny = nope\n",
    "comments_and_blank_lines": b"# a comment\n\n   # an indented comment\nx = 1\n  # another\n",
    "continuation_lines": b"x = (1 +\n   2)\ny = [\n  3,\n]\nz = 1 + \\\n  nope\n",
    "decorators_and_classes": b"@deco\nclass C(Base):\n  attr: Missing = 1\n\n  def m(self):\n    return self\n",
    "comprehension_and_walrus": b"[y for x in range(3) if (y := x)]\nprint(z := 1, q)\n",
    "match_statement": b"match cmd:\n    case [x, *rest]:\n       print(x, rest, nope)\n    case _:\n        pass\n",
    "fstrings": b"x = 1\nprint(f'{x} {nope} {x!r:>{width}}')\n",
    "global_and_nonlocal": (b"def f():\n    global g\n    g = 1\n\n\n"
                            b"def h():\n    def i():\n        nonlocal k\n    k = 2\n"),
    "conditional_definitions": (b"try:\n    import fast as impl\nexcept ImportError:\n    impl = None\n"
                                b"print(impl, __file__, __name__)\n"),
    "del_then_use": b"x = 1\ndel x\nprint(x)\n",
    "async": b"async def f():\n  async with a as b:\n      await b\n",
    "form_feed": b"\x0cdef f():\n    return 1\n",
    "only_comment_noqa_file": b"#flake8=NOQA\n",
    "crlf_newlines": b"def f():\r\n   return nope\r\n",
    "cr_newlines": b"def f():\r   return nope\r",
    "utf8_cookie_with_bad_bytes": b"# coding: utf-8\nx = '\xe9'\ny = nope\n",
}


def lint_lines(paths: list[Path]) -> list[str]:
    """What the edit tools' lint prints for ``paths``, run as the tools run it (a program, no bytecode written)."""
    done = subprocess.run([sys.executable, "-B", str(TOOLS_DIR / "lint.py"), *map(str, paths)],
                          capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.splitlines()


def flake8_lines(paths: list[Path]) -> list[str]:
    """What MLGym's flake8 command prints for ``paths``."""
    done = subprocess.run([sys.executable, "-m", "flake8", "--isolated", f"--select={FLAKE8_SELECT}", "--jobs=1",
                           *map(str, paths)], capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.splitlines()


def same_output(paths: list[Path]) -> None:
    """Both print the same lines for ``paths`` (flake8 orders files by name; the lint module as given)."""
    paths = sorted(paths, key=str)
    ours, theirs = lint_lines(paths), flake8_lines(paths)
    assert ours == theirs


def test_every_case_reads_as_flake8_reads_it(tmp_path):
    paths = []
    for name, data in CASES.items():
        path = tmp_path / f"{name}.py"
        path.write_bytes(data)
        paths.append(path)
    same_output(paths)
    # the cases do reach every selected check that can fire besides E112/E113, which Python's own parser finds
    # first (as an E999), and besides E902
    found = {line.split(": ", 1)[1][:4] for line in lint_lines(paths)}
    assert found >= {"F821", "F822", "F831", "E111", "E999"}


def test_the_bytes_of_a_file_lint_as_the_file_does(tmp_path):
    """An edit lints the file's old bytes from memory (``lint_source``) and its new text from the file (``lint``):
    for every case, both find the same."""
    for name, data in CASES.items():
        path = tmp_path / f"{name}.py"
        path.write_bytes(data)
        assert lint_source(data, str(path)) == lint(str(path)), name


def test_a_null_byte_is_a_syntax_error_on_every_python(tmp_path):
    """Python 3.11.7 reports a null byte as a SyntaxError, and flake8 an E999; older 3.11 releases raise ValueError,
    on which flake8 itself crashes. The lint reports it as the newer ones do, whichever runs it."""
    path = tmp_path / "null_byte.py"
    path.write_bytes(b"x = 1\x00\n")
    ours = lint_lines([path])
    assert ours == [f"{path}:1:1: E999 SyntaxError: source code string cannot contain null bytes"]
    assert lint_source(path.read_bytes(), str(path)) == lint(str(path))
    flake8 = subprocess.run([sys.executable, "-m", "flake8", "--isolated", f"--select={FLAKE8_SELECT}", str(path)],
                            capture_output=True, text=True, check=False)
    if "ValueError: source code string cannot contain null bytes" not in flake8.stderr:
        assert flake8.stdout.splitlines() == ours


def test_a_file_that_cannot_be_read_is_an_e902(tmp_path):
    missing = tmp_path / "missing.py"
    assert lint_lines([missing]) == flake8_lines([missing])
    assert lint_lines([missing])[0].startswith(f"{missing}:0:1: E902 FileNotFoundError")


def mutate(lines: list[str], rng: random.Random) -> list[str]:
    """``lines`` with one change an agent's edit could make: a line indented by 1-3 spaces more or less, dropped,
    repeated, or with a name it uses replaced by an unknown one, a comment ``# noqa`` added, or an argument
    repeated."""
    lines = list(lines)
    if not lines:
        return ["x = missing\n"]
    at = rng.randrange(len(lines))
    line = lines[at]
    kind = rng.randrange(6)
    if kind == 0:
        shift = rng.choice([-3, -2, -1, 1, 2, 3])
        stripped = line.lstrip(" ")
        indent = max(0, len(line) - len(stripped) + shift)
        lines[at] = " " * indent + stripped
    elif kind == 1:
        del lines[at]
    elif kind == 2:
        lines.insert(at, line)
    elif kind == 3:
        words = [word for word in line.replace("(", " ").replace(")", " ").split() if word.isidentifier()]
        if words:
            lines[at] = line.replace(rng.choice(words), f"unknown_{rng.randrange(100)}", 1)
    elif kind == 4:
        lines[at] = line.rstrip("\n") + rng.choice(["  # noqa", "  # noqa: F821", "  # noqa:E111,E999"]) + "\n"
    else:
        lines[at] = line.replace("(self", "(self, self", 1).replace("(x", "(x, x", 1)
    return lines


@pytest.mark.slow
def test_mutants_of_real_python_files_read_as_flake8_reads_them(tmp_path):
    """A mutant (one or two changes) of every Python file of the package, its own code and its tasks' files: what
    agents edit."""
    rng = random.Random(20261207)
    sources = sorted(Path(mlgym_registry.__file__).parent.rglob("*.py"))
    paths = []
    for index, source in enumerate(sources):
        mutant = source.read_text(encoding="utf-8").splitlines(keepends=True)
        for _ in range(rng.choice([1, 2])):
            mutant = mutate(mutant, rng)
        path = tmp_path / f"m{index:03d}_{source.name}"
        path.write_text("".join(mutant), encoding="utf-8")
        paths.append(path)
    same_output(paths)
    assert len(paths) > 200
    assert sum(1 for line in lint_lines(paths) if " E999 " in line) > 10  # syntax errors among the mutants
