"""Reward assigners: a step's reward from its observation and info.

A reward assigner is a callable ``reward(observation: str, info: dict, spec: TaskSpec) -> float``. MLGym itself always
returns 0 and reports scores in two places: the text of a ``validate`` observation (baseline and evaluation metric
dicts) and ``info["score"]``, whose last entry is the final submission's metrics when the episode ends in a
(auto)submission. The helpers here read both, for reuse by plugin authors.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from typing import Any

from ..tasks.mlgym_metrics import RankingMetric, mlgym_ranking_metric

VALIDATION_PREFIX = "Your code produced a valid submission artefact at "
"""How MLGym's successful ``validate`` observation starts (an interface string)."""

NO_BASELINE = "NA (no baseline was there)"
"""What MLGym prints as the baseline when the task has none."""

_SUBMISSION = re.compile(rf"^{re.escape(VALIDATION_PREFIX)}(.*)\.[ \t]*\r?$", re.MULTILINE)
_BASELINE = re.compile(r"^Baseline Score: (.*?)[ \t]*\r?$", re.MULTILINE)
_EVALUATION = re.compile(r"^Evaluation Score: (.*?)[ \t]*\r?$", re.MULTILINE)
# numpy scalar reprs (numpy >= 2 prints ``np.float64(2.5)``) and non-finite floats, which literal_eval rejects.
_NUMPY_SCALAR = re.compile(r"\b(?:np|numpy)\.\w+\(\s*([^()]*?)\s*\)")
_NON_FINITE = re.compile(r"(?<![\w'\".])(-?(?:inf|nan))(?![\w'\"])")


class ScoreError(ValueError):
    """A score that cannot be turned into a reward (unreadable metrics, or no way to choose the metric)."""


def parse_metrics(text: str) -> dict[str, float]:
    """A metric dict printed as a Python repr (``{'Score': 2.37}``) as a dict of floats.

    Accepts numpy scalar reprs and ``nan``/``inf``; raises ``ScoreError`` on anything that is not a flat dict of
    numbers.
    """
    cleaned = _NUMPY_SCALAR.sub(r"\1", text.strip())
    cleaned = _NON_FINITE.sub(r"'\1'", cleaned)
    try:
        value = ast.literal_eval(cleaned)
    except (ValueError, SyntaxError) as exc:
        raise ScoreError(f"cannot read a metric dict from {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise ScoreError(f"expected a metric dict like {{'Score': 1.0}}, got {text!r}")
    metrics: dict[str, float] = {}
    for key, number in value.items():
        if isinstance(number, bool):
            number = float(number)
        try:
            metrics[str(key)] = float(number)
        except (TypeError, ValueError):
            raise ScoreError(f"metric {key!r} in {text!r} is not a number") from None
    return metrics


def parse_validation(observation: str | None) -> dict[str, Any]:
    """Read MLGym's successful ``validate`` observation (also inside a longer message).

    Returns ``{"submission": path, "baseline": metrics or None, "evaluation": metrics}``, where ``baseline`` is None
    when MLGym printed ``Baseline Score: NA (no baseline was there)``; returns ``{}`` when ``observation`` is not a
    successful validation (including a score line whose metrics are not a readable dict). When the text holds
    several validations, the last one counts.
    """
    if not observation:
        return {}
    evaluations = list(_EVALUATION.finditer(observation))
    if not evaluations:
        return {}
    evaluation = evaluations[-1]
    baseline = _last_before(_BASELINE, observation, evaluation.start())
    submission = _last_before(_SUBMISSION, observation, evaluation.start())
    baseline_text = baseline.group(1) if baseline is not None else NO_BASELINE
    try:
        return {
            "submission": submission.group(1) if submission is not None else None,
            "baseline": None if baseline_text.startswith("NA") else parse_metrics(baseline_text),
            "evaluation": parse_metrics(evaluation.group(1)),
        }
    except ScoreError:
        return {}  # not MLGym's message: it always prints metric dicts


def _last_before(pattern: re.Pattern[str], text: str, end: int) -> re.Match[str] | None:
    matches = list(pattern.finditer(text, 0, end))
    return matches[-1] if matches else None


def is_scored_submission(info: Mapping[str, Any] | None) -> bool:
    """True when ``info`` ends an episode with a scored (auto)submission: ``exit_status`` is ``submitted`` or
    ``autosubmission (...)`` and ``info["score"]`` is not empty."""
    if not info:
        return False
    status = info.get("exit_status") or ""
    return (status == "submitted" or status.startswith("autosubmission")) and bool(info.get("score"))


def submission_metrics(info: Mapping[str, Any] | None) -> dict[str, float] | None:
    """The final submission's metric dict (the last entry of ``info["score"]``), or None when there is none."""
    if not is_scored_submission(info):
        return None
    return score_entry_metrics(info["score"][-1])  # type: ignore[index]


def score_entry_metrics(entry: Any) -> dict[str, float]:
    """One entry of ``info["score"]`` (a metric dict, or its repr as MLGym sometimes stores it) as a dict of floats."""
    if isinstance(entry, str):
        return parse_metrics(entry)
    return {str(k): float(v) for k, v in dict(entry).items()}


def priority_metric(metrics: Mapping[str, float], spec: Any = None) -> str:
    """The metric a reward reads: ``spec.extra["priority_metric"]``, else the only key, else the metric MLGym ranks
    its task of that id by, else ``"Score"``; ``ScoreError`` when none of these decides."""
    chosen = _extra(spec).get("priority_metric")
    if chosen:
        return str(chosen)
    if len(metrics) == 1:
        return next(iter(metrics))
    known = _mlgym_metric(spec)
    if known is not None and known.name in metrics:
        return known.name
    if "Score" in metrics:
        return "Score"
    raise ScoreError(
        f"cannot choose the metric to reward among {sorted(metrics)}; set 'priority_metric' in the task's extra "
        f"fields (e.g. priority_metric: {sorted(metrics)[0]}) to name it"
    )


def lower_is_better(spec: Any = None) -> bool:
    """Whether the task's metric is minimised: ``spec.extra["metric_direction"]`` (``min``/``minimize``), else MLGym's
    direction for its task of that id, else False."""
    direction = _extra(spec).get("metric_direction")
    if direction is None:
        known = _mlgym_metric(spec)
        direction = known.direction if known is not None else "max"
    return str(direction).lower().startswith("min")


def metric_delta(evaluation: Mapping[str, float], baseline: Mapping[str, float] | None, spec: Any = None) -> float:
    """Evaluation minus baseline on the priority metric, sign flipped when lower is better (see ``lower_is_better``).
    A missing baseline (or baseline metric) counts as 0."""
    metric = priority_metric(evaluation, spec)
    if metric not in evaluation:
        raise ScoreError(f"metric {metric!r} is not among the evaluation metrics {sorted(evaluation)}")
    base = (baseline or {}).get(metric, 0.0)
    delta = float(evaluation[metric]) - float(base)
    return -delta if lower_is_better(spec) else delta


def spec_baseline(spec: Any) -> dict[str, float] | None:
    """The spec's first baseline metric dict (MLGym uses ``baseline_scores[0]``), or None."""
    scores = _field(spec, "baseline_scores") or []
    return dict(scores[0]) if scores else None


def score_from_info(info: Mapping[str, Any] | None, spec: Any = None) -> float | None:
    """The reward of a final (auto)submission: its score (``info["score"][-1]``) minus the spec's baseline.

    None when ``info`` does not end the episode with a scored submission (validate steps, failed submissions).
    """
    metrics = submission_metrics(info)
    if metrics is None:
        return None
    return metric_delta(metrics, spec_baseline(spec), spec)


def score_from_validation(observation: str | None, spec: Any = None) -> float | None:
    """The reward of a ``validate`` observation: evaluation minus baseline (the printed baseline, else the spec's).

    None when ``observation`` is not a successful validation.
    """
    parsed = parse_validation(observation)
    if not parsed:
        return None
    baseline = parsed["baseline"] if parsed["baseline"] is not None else spec_baseline(spec)
    return metric_delta(parsed["evaluation"], baseline, spec)


class ScoreDeltaReward:
    """Score minus baseline, read from a ``validate`` observation or from the final submission's ``info["score"]``.

    Each step is scored on its own: a validate step gets its validation's delta, the step that (auto)submits gets the
    submission's delta, and every other step gets 0. Higher is better unless the task's ``extra`` says
    ``metric_direction: min``; ``extra["priority_metric"]`` names the metric when the dicts hold several (for
    MLGym's own tasks both default to MLGym's ranking, e.g. 3-SAT's ``Time``, minimised). A
    non-finite score (an evaluator that printed ``nan``) gives 0.

    Validation text can be forged by the agent (``echo`` the message, with any baseline and score), so when ``info``
    carries a ``score`` list the numbers never come from the text: a validation counts only when the metrics it shows
    are those of the evaluator's latest run (``info["score"][-1]``, which the backend appends to after every real
    evaluation), and it is compared with the spec's baseline, not the printed one. Echoing the latest real validation
    again pays what running ``validate`` again would. Without a ``score`` key (a caller that has only the text) the
    text is trusted.
    """

    def __call__(self, observation: str | None, info: Mapping[str, Any] | None, spec: Any = None) -> float:
        """The reward of one step."""
        reward = validation_reward(observation, info, spec)
        if reward is None:
            reward = score_from_info(info, spec)
        if reward is None or not math.isfinite(reward):
            return 0.0
        return reward

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def validation_reward(observation: str | None, info: Mapping[str, Any] | None, spec: Any = None) -> float | None:
    """The reward of a ``validate`` step, or None when ``observation`` shows no validation the evaluator ran.

    With ``info["score"]`` (the evaluator's results so far), the shown metrics must be its latest entry, and the
    delta is taken against the spec's baseline: neither number can come from text the agent printed. Without it,
    ``score_from_validation`` reads the text.
    """
    if not isinstance(info, Mapping) or "score" not in info:
        return score_from_validation(observation, spec)
    scores = info["score"]
    if not scores:
        return None
    parsed = parse_validation(observation)
    if not parsed:
        return None
    try:
        latest = score_entry_metrics(scores[-1])
    except (TypeError, ValueError):
        return None
    if not same_metrics(parsed["evaluation"], latest):
        return None
    return metric_delta(latest, spec_baseline(spec), spec)


def same_metrics(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """True when two metric dicts hold the same metrics with the same values (NaN equal to NaN)."""
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        both_nan = math.isnan(value) and math.isnan(other)
        if not (both_nan or math.isclose(value, other, rel_tol=1e-9, abs_tol=0.0)):
            return False
    return True


def _field(spec: Any, name: str) -> Any:
    """A field of a ``TaskSpec`` or of its ``to_dict()``."""
    if isinstance(spec, Mapping):
        return spec.get(name)
    return getattr(spec, name, None)


def _extra(spec: Any) -> Mapping[str, Any]:
    return _field(spec, "extra") or {}


def _mlgym_metric(spec: Any) -> RankingMetric | None:
    task_id = _field(spec, "id")
    return mlgym_ranking_metric(str(task_id)) if task_id else None
