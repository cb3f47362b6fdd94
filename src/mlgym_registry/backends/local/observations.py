"""The texts and outcomes the agent observes from the local backend, worded as MLGym words them: malformed edits,
timeouts, restarted shells, and the outcomes table of validate, submit and autosubmission."""

from __future__ import annotations

from typing import Any

from ...scores import validation_text
from .evaluation import EvaluationFormatError, InvalidMetrics, SubmissionNotFoundError

Outcome = tuple[str, float, bool, dict[str, Any]]
"""What ``step`` returns: observation, reward, done, info."""

MALFORMED_EDIT = (
    "Malformed edit command. Please ensure you use the `end_of_edit` keyword to mark the end of your edit."
)
MALFORMED_INSERT = (
    "Malformed insert command. Please ensure you use the `end_of_insert` keyword to mark the end of your insert."
)
SUBMISSION_NOT_FOUND = (
    "Submission artefact not found. You have to produce a valid submission artefact as described in the task "
    "description to validate your results."
)
NO_OUTPUT_TIMEOUT_TEXT = (
    " BECAUSE NO OUTPUT WAS PRODUCED FOR MORE THAN {seconds} SECONDS.\n"
    "PLEASE REFINE YOUR RUNNING COMMAND SO IT WILL PRODUCE OUTPUT IN THE SPECIFIED TIME FRAME."
)
TOTAL_TIMEOUT_TEXT = " BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN {seconds} SECONDS."


class CommandTimeout(TimeoutError):
    """A command ran out of time. Its processes were killed; ``partial`` is what it printed."""

    def __init__(self, kind: str, seconds: float, partial: str, note: str = ""):
        super().__init__(f"command timed out ({kind}) after {seconds} s", partial)
        self.kind, self.seconds, self.partial, self.note = kind, seconds, partial, note


def timed_out(exc: CommandTimeout) -> str:
    """The observation of a step whose command ran out of time: what it printed, then MLGym's timeout text."""
    text = NO_OUTPUT_TIMEOUT_TEXT if exc.kind == "no_output" else TOTAL_TIMEOUT_TEXT
    observation = exc.partial + "\nEXECUTION TIMED OUT" + text.format(seconds=_seconds(exc.seconds))
    if exc.note:
        observation += "\n" + exc.note
    return observation


def restart_note(how: str, status: int | None, workspace: object) -> str:
    """The note shown when the shell session ended (``how``) and a new one was started in ``workspace``."""
    code = ""
    if status is not None:
        code = f" (killed by signal {-status})" if status < 0 else f" (exit status {status})"
    return (
        f"NOTE: the shell session {how}{code}, so a new shell was started in the workspace "
        f"{workspace}. Files are unchanged; the working directory, shell variables and background jobs "
        "were reset, and the tool commands are available again."
    )


def scored(
    info: dict[str, Any], action: str, metrics: Any, submission: str, *, baseline: Any, artefact_exists: bool
) -> Outcome:
    """MLGym's outcome of an evaluation that produced ``metrics`` (``info`` already holds the scores)."""
    if action == "submit":
        info["exit_status"] = "submitted"
        info["submission"] = submission
        return "Exited (submit)", 0, True, info
    if action == "validate":
        # MLGym names <workspace>/target.py for every python task; a task without that file has no artefact to name
        return validation_text(submission if artefact_exists else None, baseline, metrics), 0, False, info
    info["exit_status"] = f"autosubmission ({action})"
    info["submission"] = submission
    return f"Exited ({action})", 0, True, info


def failed_evaluation(info: dict[str, Any], action: str, exc: Exception) -> Outcome:
    """MLGym's observation and ``exit_status`` for an evaluation that produced no score."""
    if isinstance(exc, SubmissionNotFoundError):
        text, status = SUBMISSION_NOT_FOUND, "submission_not_found"
    elif isinstance(exc, EvaluationFormatError):
        text, status = str(exc.args[0]), "evaluation_format_error"
    elif isinstance(exc, InvalidMetrics):
        text, status = str(exc), "invalid_submission"
    else:  # MLGym reports any other failure this way
        text, status = f"Error: {exc}", f"{type(exc).__name__}, {exc},"
    if action == "validate":
        return text, 0, False, info
    info["exit_status"] = f"{status} ({action})"
    return f"Exited ({action})", 0, True, info


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
