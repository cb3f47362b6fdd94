"""Reward assigners: a step's reward from its observation and info.

A reward assigner is a callable ``reward(observation: str, info: dict, spec: TaskSpec) -> float``. The default ones
here read MLGym's scores with ``mlgym_registry.scores``, whose helpers this module also exports, as it always has,
for plugin authors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..scores import (
    DEFAULT_FAILURE_REWARD,
    FAILED_EVALUATIONS,
    FORMAT_EXIT,
    NO_BASELINE,
    VALIDATION_PREFIX,
    MetricNameError,
    ScoreError,
    StepOutcome,
    baseline_metric_problem,
    evaluation_metric_problem,
    failure_reward,
    find_metric,
    honest_reward,
    is_scored_submission,
    lower_is_better,
    metric_delta,
    mismatch_message,
    parse_metrics,
    parse_validation,
    priority_metric,
    same_metrics,
    score_entry_metrics,
    score_from_info,
    score_from_validation,
    spec_baseline,
    step_outcome,
    submission_metrics,
    validation_reward,
)

__all__ = [
    "BestImprovementReward",
    "DEFAULT_FAILURE_REWARD",
    "FAILED_EVALUATIONS",
    "FORMAT_EXIT",
    "MetricNameError",
    "NO_BASELINE",
    "ScoreDeltaReward",
    "ScoreError",
    "StepOutcome",
    "VALIDATION_PREFIX",
    "baseline_metric_problem",
    "evaluation_metric_problem",
    "failure_reward",
    "find_metric",
    "honest_reward",
    "is_scored_submission",
    "lower_is_better",
    "metric_delta",
    "mismatch_message",
    "parse_metrics",
    "parse_validation",
    "priority_metric",
    "same_metrics",
    "score_entry_metrics",
    "score_from_info",
    "score_from_validation",
    "spec_baseline",
    "step_outcome",
    "submission_metrics",
    "validation_reward",
]


class ScoreDeltaReward:
    """Score minus baseline at every evaluation: each validate, and the final (auto)submission (``mlgym_score_delta``,
    the reference chain's ``MLGymRewardAssignment`` behaviour).

    It pays **every** validate, so an episode's rewards grow with the number of validates, not only with the
    improvement: use ``mlgym_best_improvement`` to train. Numbers come from ``info["score"]`` (the evaluator's own
    results), never from text the agent can print; a step counts only when the backend ran an evaluation on it
    (``info["evaluation_status"]``). Higher is better unless the task's ``extra`` says ``metric_direction: min``;
    ``extra["priority_metric"]`` names the metric when the dicts hold several (for MLGym's own tasks both default to
    MLGym's ranking, e.g. 3-SAT's ``Time``, minimised).

    Failures never pay more than honest play: a failed evaluation (``invalid_submission``, ``agent_error``), an
    episode that ends without a scored submission (skip, forfeit, a failed submit) and, unless the task sets
    ``score_format_exit``, the autosubmission after repeated format errors pay ``failure_reward(spec)``; scores
    below the task's ``worst_score`` (or non-finite) are paid as that floor. An ``infra_error`` pays 0 (the env flags
    the step so a trainer can leave it out).
    """

    def __call__(self, observation: str | None, info: Mapping[str, Any] | None, spec: Any = None) -> float:
        """The reward of one step."""
        outcome = step_outcome(observation, info, spec)
        if outcome.kind == "scored":
            return honest_reward(outcome.metrics or {}, spec, outcome.baseline)
        if outcome.kind == "failed":
            return failure_reward(spec)
        return 0.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BestImprovementReward:
    """Pays only improvements of the episode's best outcome (``mlgym_best_improvement``, every task's default): an
    outcome is a scored evaluation (its score minus baseline) or a failure (``failure_reward(spec)``, the floor); the
    episode's first outcome pays itself, each later one how much it raised the best outcome so far (0 when it did
    not).

    The outcome that ends the episode (the submission, an autosubmission, a failed submit) is final: it pays what
    takes the episode's total to its own value, below the best so far too. An episode's rewards therefore add up to
    its final outcome: its submission's score minus the baseline, or the floor when the submission failed, however
    often it validated or failed on the way: validating is never worth more than improving, and on a task whose
    validate scores other rows than submit (``mlgym_registry.held_out``) the total is the score of the rows validate
    never saw. An honest attempt that fails first never ends below an episode that tried nothing. An episode the env
    cuts without an evaluation (its turn cap, ``max_turns``) ends at its best outcome so far, or the floor when it has
    none, as one that ends without a scored submission does, so doing nothing is never worth more than trying.
    Scores are read and clipped as in ``ScoreDeltaReward``; an ``infra_error`` pays 0.
    """

    def __call__(self, observation: str | None, info: Mapping[str, Any] | None, spec: Any = None) -> float:
        """The reward of one step."""
        outcome = step_outcome(observation, info, spec)
        if outcome.kind not in ("scored", "failed", "cut"):
            return 0.0
        floor = failure_reward(spec)
        best = max((honest_reward(m, spec, floor=floor) for m in outcome.earlier), default=None)
        if best is None and outcome.failed_before:
            best = floor
        final = outcome.kind != "cut" and bool((info or {}).get("exit_status"))
        value = floor if outcome.kind != "scored" else honest_reward(outcome.metrics or {}, spec, outcome.baseline,
                                                                      floor)
        if best is None:
            return value
        return value - best if final else max(0.0, value - best)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
