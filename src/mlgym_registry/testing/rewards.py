"""Conformance checks for reward assigners: every exit and evaluation status the env produces."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from ..specs import TaskSpec
from ._common import _fail, _name


def _reward_cases(spec: TaskSpec) -> list[tuple[str, str, dict[str, Any]]]:
    """Every kind of step the env hands a reward: each exit status the backends produce (``""``, ``submitted``,
    ``skipped``, ``exit_forfeit``, the autosubmissions, MLGym's failed-evaluation exits) with each evaluation status
    (``ok``, ``invalid_submission``, ``agent_error``, ``infra_error``, none), with and without earlier scores."""
    from ..backends.protocol import (
        AGENT_ERROR,
        EVALUATION_OK,
        EVALUATION_STATUS_KEY,
        EVALUATIONS_KEY,
        INFRA_ERROR,
        INVALID_SUBMISSION,
        new_info,
    )

    def step_info(status: str = "", exit_status: str = "", scores: list | None = None,
                  earlier: tuple[str, ...] = ()) -> dict[str, Any]:
        """The info the env hands a reward: the backend's, with this step's evaluation status and the episode's."""
        info = new_info()
        info.update(exit_status=exit_status, score=list(scores or []))
        info[EVALUATION_STATUS_KEY] = status
        info[EVALUATIONS_KEY] = [*earlier, status] if status else list(earlier)
        return info

    baseline = spec.baseline or {"Score": 1.0}
    better = {key: float(value) + 1.0 for key, value in baseline.items()}
    validated = step_info(EVALUATION_OK, scores=[better])
    submitted = step_info(EVALUATION_OK, "submitted", [better])
    submitted["submission"] = "target.py"
    validate_text = (f"Your code produced a valid submission artefact at /w/target.py.\nBaseline Score: {baseline}\n"
                     f"Evaluation Score: {better}")
    failed_text = "Failed to decode metrics from evaluation script. Output:\n---\nTraceback ...\n---"
    not_found = "Submission artefact not found."
    ok = (EVALUATION_OK,)
    cases = [
        ("a plain observation", "file.txt\nstrategy.py", step_info()),
        ("an empty observation", "", step_info()),
        ("a validate observation", validate_text, validated),
        ("the final submit", "Exited (submit)", submitted),
        ("a format error", "Malformed edit command.", step_info()),
        ("a failed validate (agent_error, no score yet)", failed_text, step_info(AGENT_ERROR)),
        ("a failed submit (invalid_submission, no score)", "Exited (submit)",
         step_info(INVALID_SUBMISSION, "evaluation_format_error (submit)")),
        ("a failed validate after a scored one (agent_error)", failed_text,
         step_info(AGENT_ERROR, scores=[better], earlier=ok)),
        ("a validate without the submission artefact (invalid_submission)", not_found,
         step_info(INVALID_SUBMISSION)),
        ("an infra_error validate", "Error: the evaluation did not finish", step_info(INFRA_ERROR)),
        ("a validate that timed out (agent_error)", "Error: Timeout reached while reading from subprocess.",
         step_info(AGENT_ERROR)),
        ("a skip", "Skipped", step_info(exit_status="skipped")),
        ("a skip after a scored validate", "Skipped", step_info(exit_status="skipped", scores=[better], earlier=ok)),
        ("a forfeit", "Exited (exit_forfeit)", step_info(exit_status="exit_forfeit")),
        ("a forfeit after a scored validate", "Exited (exit_forfeit)",
         step_info(exit_status="exit_forfeit", scores=[better], earlier=ok)),
    ]
    for action in ("submit", "max_steps", "exit_format", "exit_context", "exit_cost", "exit_error", "exit_api"):
        exited = f"Exited ({action})"
        if action != "submit":
            cases.append((f"the autosubmission ({action})", exited,
                          step_info(EVALUATION_OK, f"autosubmission ({action})", [better])))
        if action != "submit":  # (the failed submit without a score is among the first cases)
            cases.append((f"a failed {action} (evaluation_format_error, no score)", exited,
                          step_info(INVALID_SUBMISSION, f"evaluation_format_error ({action})")))
        cases += [
            (f"a failed {action} after a scored validate (evaluation_format_error)", exited,
             step_info(INVALID_SUBMISSION, f"evaluation_format_error ({action})", [better], ok)),
            (f"a {action} without the submission artefact (submission_not_found)", exited,
             step_info(INVALID_SUBMISSION, f"submission_not_found ({action})")),
            (f"a {action} with non-finite metrics (invalid_submission)", exited,
             step_info(INVALID_SUBMISSION, f"invalid_submission ({action})")),
            (f"a {action} that timed out (agent_error)", exited,
             step_info(AGENT_ERROR, f"EvaluationTimeout, the evaluation ran out of time, ({action})")),
            (f"a {action} the infrastructure failed (infra_error)", exited,
             step_info(INFRA_ERROR, f"EvaluationUnsupported, the backend cannot evaluate this task, ({action})")),
        ]
    return cases


def check_reward_assigner(reward: Callable[..., Any], spec: TaskSpec | None = None) -> None:
    """Check ``reward(observation, info, spec) -> float`` on every kind of step the env produces (``_reward_cases``):
    plain, empty, validate, submit and format-error steps; failed, timed-out and infra-failed evaluations (with and
    without earlier scores: ``info["score"]`` need not hold this step's); skips and forfeits; every autosubmission and
    every failed-evaluation exit status, for ``submit``, ``max_steps`` and each ``exit_*`` action.

    Each call must return a finite real number, leave ``info`` unchanged and give the same value when repeated.
    """
    what = f"reward assigner {_name(reward)}"
    if not callable(reward):
        _fail(what, "is not callable; a reward assigner is reward(observation, info, spec) -> float")
    spec = spec or _example_spec()
    for label, observation, info in _reward_cases(spec):
        before = copy.deepcopy(info)
        values = []
        for _ in range(2):
            try:
                value = reward(observation, info, spec)
            except Exception as exc:  # noqa: BLE001 - reported as the failure
                _fail(what, f"raised {type(exc).__name__}: {exc} on {label} (exit_status="
                            f"{info['exit_status']!r}, evaluation_status={info['evaluation_status']!r}, score="
                            f"{info['score']}); it must return a float for every step: read info['score'][-1] only "
                            f"when info['evaluation_status'] == 'ok' (this step was scored)")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                _fail(what, f"returned {value!r} ({type(value).__name__}) on {label}; it must return a finite float")
            values.append(float(value))
        if info != before:
            _fail(what, f"changed the info dict on {label} ({before} -> {info}); it must only read it")
        if values[0] != values[1]:
            _fail(what, f"returned {values[0]} then {values[1]} for the same {label}; it must be a pure function")


def _example_spec() -> TaskSpec:
    return TaskSpec(id="conformance", name="conformance", description="A task used by the conformance kit.",
                    baseline_scores=[{"Score": 1.0}])
