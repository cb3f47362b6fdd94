"""What kind of observation a step produced, told from its text alone (for replay reports and statistics).

The kinds follow the observation formats of MLGym's environment and tools, which the local backend reproduces:

- ``empty``: no output (``None`` or ``""``)
- ``submitted``: ``Exited (submit)``
- ``exit``: any other end of episode (``Exited (max_steps)``, ``Exited (exit_context)``, ``Skipped``, ...)
- ``validate_score``: a successful ``validate`` (``Your code produced a valid submission artefact at ...``, or only
  its score lines for a task without that artefact)
- ``validate_error``: a ``validate`` that could not score (metrics not decodable, no artefact, evaluator error)
- ``malformed_edit``: an ``edit`` without its ``end_of_edit`` line
- ``lint_rejection``: an edit or insertion undone because flake8 found new errors
- ``read_only_edit``: an edit refused because the file is read-only
- ``timeout``: the command ran out of time (``EXECUTION TIMED OUT ...``)
- ``session_restart``: the shell died and was restarted (local backend)
- ``syntax_error``: bash rejected the command's syntax (``bash -n``), so it did not run
- ``file_window``: the editor window of a file (``[File: <path> (<n> lines total)]``)
- ``plain``: anything else (ordinary command output)
"""

from __future__ import annotations

import re

from ..scores import BASELINE_LABEL, EVALUATION_LABEL, VALIDATION_PREFIX

KINDS = (
    "empty",
    "submitted",
    "exit",
    "validate_score",
    "validate_error",
    "malformed_edit",
    "lint_rejection",
    "read_only_edit",
    "timeout",
    "session_restart",
    "syntax_error",
    "file_window",
    "plain",
)

_EXIT = re.compile(r"^(Exited \([a-z_]+\)|Skipped)$")
_VALIDATE_ERRORS = (
    "Failed to decode metrics from evaluation script.",
    "Evaluation failed: your code raised an exception",
    "Submission artefact not found.",
    "Error: Timeout reached while reading from subprocess.",
    "Error: the evaluation did not finish",
    "Error: the local backend cannot evaluate",
)
_LINT = re.compile(r"^ERRORS:\n- ", re.MULTILINE)
_SYNTAX = re.compile(r"^(?:/bin/|/usr/bin/)?bash: line \d+: (?:syntax error|unexpected EOF while looking for)")
_WINDOW = re.compile(r"^\[File: .+ \(\d+ lines total\)\]$", re.MULTILINE)
_SCORES = re.compile(rf"{re.escape(BASELINE_LABEL)}.*\n{re.escape(EVALUATION_LABEL)}\{{", re.DOTALL)
"""A successful validate of a task that has no artefact to name: only the baseline and evaluation score lines."""


def observation_kind(observation: str | None) -> str:
    """One of ``KINDS`` for ``observation``."""
    if observation is None or observation.strip() == "":
        return "empty"
    text = observation.strip()
    if text == "Exited (submit)":
        return "submitted"
    if _EXIT.match(text):
        return "exit"
    if text.startswith(VALIDATION_PREFIX) or _SCORES.match(text):
        return "validate_score"
    if text.startswith(_VALIDATE_ERRORS):
        return "validate_error"
    if text.startswith(("Malformed edit command.", "Malformed insert command.")):
        return "malformed_edit"
    if _LINT.search(text) and "would have looked if applied" in text:
        return "lint_rejection"
    if text.startswith("Error: You cannot edit read-only file"):
        return "read_only_edit"
    if "EXECUTION TIMED OUT" in text:
        return "timeout"
    if "NOTE: the shell session " in text and "a new shell was started" in text:
        return "session_restart"
    if _SYNTAX.match(text):
        return "syntax_error"
    if _WINDOW.search(text):
        return "file_window"
    return "plain"


def recorded_kind(observation: str | None, action: str, *, final: bool = False, exit_status: str = "") -> str:
    """The kind of an observation recorded by MLGym, allowing for its older versions.

    Older MLGym versions recorded an empty observation for the step that ended the episode by evaluation: a submit
    (``Exited (submit)`` today) or, on the last step, an autosubmission (``Exited (max_steps)``, ...).
    """
    if not observation and final and exit_status:
        return "submitted" if exit_status == "submitted" else "exit"
    if not observation and action.strip() == "submit":
        return "submitted"
    return observation_kind(observation)
