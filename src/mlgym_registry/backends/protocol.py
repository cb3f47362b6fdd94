"""The MLGym environment contract, as a ``typing.Protocol``.

Every backend honours it, so the chain drives the embedded ``local`` backend and the real MLGym alike. The facts behind
it (formats, step counting, special actions, ``info`` keys) are in MLGym's ``MLGymEnv``; see ``docs/concepts.md``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..scores import (  # the statuses are the scores' facts; the contract names them
    AGENT_ERROR,
    EVALUATION_OK,
    EVALUATION_STATUS_KEY,
    EVALUATION_STATUSES,
    EVALUATIONS_KEY,
    INFRA_ERROR,
    INVALID_SUBMISSION,
)
from ..tool_language import ToolSet

__all__ = ["AGENT_ERROR", "EVALUATION_OK", "EVALUATIONS_KEY", "EVALUATION_STATUSES", "EVALUATION_STATUS_KEY",
           "INFRA_ERROR", "INVALID_SUBMISSION", "Backend", "ToolSet", "new_info"]


@runtime_checkable
class Backend(Protocol):
    """An MLGym-compatible environment: a persistent shell in a task workspace, stepped with text actions.

    - ``reset()`` prepares a fresh workspace and session and returns ``({"observation": None}, {})``.
    - ``install_tools()`` defines the ``state`` command, the tool commands and their env variables in the session
      (what MLGym's agent does after reset) and returns their ``ToolSet``.
    - ``step(action)`` counts the step, autosubmits past ``max_steps``, handles the special actions and the
      validate/submit markers, and returns MLGym's 4-tuple ``(observation, reward, done, info)`` where ``info`` has
      the keys ``model_stats``, ``exit_status``, ``submission``, ``score`` (a list that accumulates), ``summarizer``.
    - ``communicate(cmd)`` runs a command in the session and returns its normalised output; sets ``returncode``.
    - ``close()`` ends every process and removes every file the backend made. It may be called more than once.
    """

    task_workspace: Path
    current_step: int
    max_steps: int
    returncode: int | None
    task: Any

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]: ...

    def install_tools(self) -> ToolSet: ...

    def step(self, action: str) -> tuple[str | None, float, bool, dict[str, Any]]: ...

    def communicate(
        self, input: str, timeout_duration: float = 25, no_output_timeout_duration: float | None = None
    ) -> str: ...

    def add_commands(self, commands: list[dict[str, str]]) -> None: ...

    def close(self) -> None: ...


INFO_KEYS = ("model_stats", "exit_status", "submission", "score", "summarizer")
"""The keys of every ``info`` dict a backend's ``step`` returns (MLGym's ``AgentInfo``)."""


def new_info() -> dict[str, Any]:
    """A fresh ``info`` dict with MLGym's five keys."""
    return {"model_stats": {}, "exit_status": "", "submission": None, "score": [], "summarizer": {}}


def non_finite(metrics: Any) -> bool:
    """True when a metric dict holds a number that is NaN or infinite (a broken submission, never a score)."""
    if not isinstance(metrics, dict):
        return False
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)
               for v in metrics.values())


def infra_errors(info: dict[str, Any]) -> int:
    """How many of the episode's evaluations (``info[EVALUATIONS_KEY]``) failed for reasons not the agent's."""
    return list(info.get(EVALUATIONS_KEY) or []).count(INFRA_ERROR)


_FAILED_VALIDATION_OPENINGS = (
    "Submission artefact not found",
    "Failed to decode metrics from evaluation script",
)
_FAILED_EXITS = ("submission_not_found", "evaluation_format_error", "invalid_submission")
_FAILED_EXIT = re.compile(r", \((?:submit|max_steps|exit_\w+)\)$")
"""MLGym's exit status for any other failed (auto)submission: ``"<Error>, <message>, (<action>)"``."""


def infer_evaluation_status(observation: str | None, info: dict[str, Any], scores_before: int) -> str:
    """How this step's evaluation ended, for a backend whose ``info`` does not say (``EVALUATION_STATUS_KEY``).

    ``ok`` when ``info["score"]`` grew on this step (``invalid_submission`` when the new metrics are not finite);
    ``invalid_submission`` when the step shows one of MLGym's failed-evaluation texts or ended the episode with one
    of its failed-evaluation exit statuses (MLGym's errors do not say whose fault they were: the agent's is assumed,
    so a failure is never excused); else ``""`` (nothing was evaluated).
    """
    scores = info.get("score") or []
    if len(scores) > scores_before:
        return INVALID_SUBMISSION if non_finite(scores[-1]) else EVALUATION_OK
    exit_status = str(info.get("exit_status") or "")
    if exit_status.startswith(_FAILED_EXITS) or _FAILED_EXIT.search(exit_status):
        return INVALID_SUBMISSION
    if (observation or "").lstrip().startswith(_FAILED_VALIDATION_OPENINGS):
        return INVALID_SUBMISSION
    return ""
