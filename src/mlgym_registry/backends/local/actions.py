"""What an agent's action is, read as MLGym reads it: a training command, a special exit, a malformed edit, a marker in
its output, or a line bash would refuse."""

from __future__ import annotations

import re
import shlex
import subprocess

from .output import normalise

TRAIN_COMMANDS = frozenset({"torchrun", "python", "python3", "accelerate", "deepspeed"})
"""Programs whose commands get the long (training) timeout, as MLGym gives them; only as a command, not any word."""
EDIT_PATTERN = re.compile(r"^edit\s+(\d+):(\d+)(?:\n|$|\s)", re.MULTILINE)
INSERT_PATTERN = re.compile(r"^insert\s+(\d+)(?:\n|$|\s)", re.MULTILINE)
LONE_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
"""Surrogates that are not ``surrogateescape``'s stand-ins for raw bytes: they cannot be sent to the shell."""
VALIDATION = re.compile(r"<<VALIDATION\|\|(.*)\|\|VALIDATION>>", re.DOTALL)
SUBMISSION = re.compile(r"<<SUBMISSION\|\|(.*)\|\|SUBMISSION>>", re.DOTALL)
"""MLGym's validate and submit markers, as it searches for them; ``has_marker`` decides the same in linear time."""

# a single line of plain words (no quotes, operators, expansions or reserved words) cannot be a syntax error
_PLAIN_COMMAND = re.compile(r"[A-Za-z0-9_./:=,+@%-]+(?: +[A-Za-z0-9_./:=,+@%-]+)*")
_RESERVED = frozenset(
    "if then else elif fi case esac for select while until do done in function time coproc { } ! [[ ]]".split()
)
_COMMAND_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", "|&", ";;", "then", "do", "else"})
_WRAPPERS = frozenset({"nohup", "time", "env", "exec", "nice", "stdbuf", "command"})
_PYTHON = re.compile(r"python[0-9.]*")


def has_marker(text: str, name: str) -> bool:
    """Whether MLGym's marker pattern ``<<NAME||(.*)||NAME>>`` (DOTALL) occurs in ``text``, in linear time.

    The group matches anything, so there is a match exactly when an opener is followed, anywhere later, by a closer:
    the first opener decides. Searching the pattern itself backtracks to the text's end from every opener (7,000
    unclosed openers took 8 s).
    """
    opener = text.find(f"<<{name}||")
    return opener >= 0 and text.find(f"||{name}>>", opener + len(name) + 4) >= 0


def runs_training(action: str) -> bool:
    """Whether a command line runs a training program (``python ...``, ``torchrun ...``) as one of its commands.

    Only the program position counts: ``sleep 12 # python`` or ``echo python`` is an ordinary command.
    """
    for line in action.splitlines():
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
        except ValueError:
            tokens = line.split()
        at_start = True
        for token in tokens:
            if token in _COMMAND_SEPARATORS:
                at_start = True
                continue
            if not at_start:
                continue
            if "=" in token.split("/")[0] or token in _WRAPPERS:
                continue  # VAR=value prefixes and wrappers: the program comes next
            name = token.rsplit("/", 1)[-1]
            if name in TRAIN_COMMANDS or _PYTHON.fullmatch(name):
                return True
            at_start = False
    return False


def syntax_error(command: str, *, bash: str, timeout: float) -> tuple[int, str] | None:
    """``bash -n`` over ``command``: its exit status and normalised error text when the syntax is wrong, else None
    (also when ``bash -n`` gives no verdict within ``timeout``: the command then runs, under its own time limit)."""
    line = command.strip()
    if "\n" not in line and _PLAIN_COMMAND.fullmatch(line) and not _RESERVED.intersection(line.split()):
        return None
    try:
        done = subprocess.run(
            [bash, "-n"], input=command.encode("utf-8", errors="surrogateescape"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode == 0:
        return None
    return done.returncode, normalise(done.stdout)
