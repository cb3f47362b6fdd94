"""Scores: reading MLGym's score text and ``info["score"]``, choosing the metric to reward and its direction,
deltas from the baseline, evaluation statuses and what a failure pays.

One module for these facts, used by the default reward assigners (``components.rewards``), the registry's checks at
``make``, the episode player, the chain's reward stage and the starter-code scorer. MLGym itself always returns a
reward of 0 and reports scores in two places: the text of a ``validate`` observation (baseline and evaluation metric
dicts) and ``info["score"]``, whose last entry is the final submission's metrics when the episode ends in a
(auto)submission. The helpers here read both, for reuse by plugin authors.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EVALUATION_OK = "ok"
INVALID_SUBMISSION = "invalid_submission"
AGENT_ERROR = "agent_error"
INFRA_ERROR = "infra_error"
EVALUATION_STATUSES = (EVALUATION_OK, INVALID_SUBMISSION, AGENT_ERROR, INFRA_ERROR)
"""How an evaluation (a validate, a submit or an autosubmission) ended:

- ``ok``: the pristine evaluator scored the submission with finite metrics (they were appended to ``info["score"]``);
- ``invalid_submission``: there was nothing valid to score (no artefact, a file the evaluator rejects, non-finite
  metrics, a workspace that cannot be read as the agent left it or that is over the env's bounds or disk quota);
- ``agent_error``: the agent's code raised, timed out, ran out of memory or processes, or answered with no valid value;
- ``infra_error``: the evaluation failed for a reason that is not the agent's, judged from the host independently of
  what the agent did (a missing package, the harness or the evaluator itself failing, a backend that cannot evaluate
  the task, a host disk that is full while the env is within its own quota). Never paid as the agent's outcome, so a
  failure the agent's own actions caused (files it locked, its disk quota used up) is never one.
"""

EVALUATION_STATUS_KEY = "evaluation_status"
"""The optional ``info`` key where a backend says how this step's evaluation ended (one of
``EVALUATION_STATUSES``; empty when the step evaluated nothing). The env infers it for backends that do not say."""

EVALUATIONS_KEY = "evaluations"
"""Where the env keeps, in the ``info`` it passes on, the status of every evaluation of the episode so far."""

STOP_REASON_KEY = "stop_reason"
"""The ``info`` key where the env (not the backend) says it ended the episode on this step without an evaluation
(``"max_turns"``: its turn cap); absent on every other step."""


# -- MLGym's ranking metrics -------------------------------------------------------------------------------------------
# The metric MLGym ranks each of its own tasks by, and whether higher or lower is better.
#
# These are facts from MLGym's published analysis (its per-task ``priority_metric`` and ``metric_direction``); MLGym's
# task files do not carry them. A task whose metric dicts hold several keys (3-SAT's ``Time``/``Correct``/
# ``Incorrect``, the regressions' ``rmse``/``r2``, the RL tasks' ``Reward Mean``/``Reward Std``) or whose metric is a
# loss needs them for a reward to point the right way. Variants of a task (``...L1``, ``...Reinforce``) report the
# same metrics as the task they vary.
@dataclass(frozen=True)
class RankingMetric:
    """The metric to reward and its direction: ``"max"`` (higher is better) or ``"min"``."""

    name: str
    direction: str = "max"


_BY_TASK: dict[str, RankingMetric] = {
    "3SATTime": RankingMetric("Time", "min"),
    "battleOfSexes": RankingMetric("Score"),
    "blotto": RankingMetric("Score"),
    "prisonersDilemma": RankingMetric("Score"),
    "imageCaptioningCOCO": RankingMetric("BLEU Score"),
    "imageClassificationCifar10": RankingMetric("accuracy"),
    "imageClassificationCifar10L1": RankingMetric("accuracy"),
    "imageClassificationFMnist": RankingMetric("accuracy"),
    "languageModelingFineWeb": RankingMetric("val_loss", "min"),
    "naturalLanguageInferenceMNLI": RankingMetric("validation_accuracy"),
    "regressionHousePrice": RankingMetric("r2"),
    "regressionHousingPrice": RankingMetric("r2"),
    "regressionKaggleHousePrice": RankingMetric("r2"),
    "regressionKaggleHousePriceL1": RankingMetric("r2"),
    "rlBreakoutMinAtar": RankingMetric("Reward Mean"),
    "rlMetaMazeMisc": RankingMetric("Reward Mean"),
    "rlMountainCarContinuous": RankingMetric("Reward Mean"),
    "rlMountainCarContinuousReinforce": RankingMetric("Reward Mean"),
    "titanicSurvival": RankingMetric("accuracy"),  # what its evaluate.py prints (its baseline says "Accuracy")
}


def mlgym_ranking_metric(task_id: str) -> RankingMetric | None:
    """MLGym's ranking metric for one of its tasks, by MLGym's id (``mlgym/`` prefix allowed), else None."""
    return _BY_TASK.get(task_id.removeprefix("mlgym/"))


VALIDATION_PREFIX = "Your code produced a valid submission artefact at "
"""How MLGym's successful ``validate`` observation starts (an interface string)."""

NO_BASELINE = "NA (no baseline was there)"
"""What MLGym prints as the baseline when the task has none."""

BASELINE_LABEL = "Baseline Score: "
EVALUATION_LABEL = "Evaluation Score: "
"""The labels of the two lines of MLGym's successful ``validate`` observation that hold the metric dicts."""


def validation_text(submission: str | None, baseline: Any, metrics: Any) -> str:
    """MLGym's successful ``validate`` observation: the artefact line (when there is an artefact to name), then the
    baseline's and the evaluation's metrics."""
    artefact = f"{VALIDATION_PREFIX}{submission}.\n" if submission is not None else ""
    return f"{artefact}{BASELINE_LABEL}{baseline}\n{EVALUATION_LABEL}{metrics}".strip()

# Each pattern takes the whole rest of its line, which costs linear time in any text (the agent prints these lines
# too: lazy groups followed by optional whitespace backtracked quadratically on a long line); ``_trim`` then drops
# what MLGym's patterns leave out of the value (a trailing "\r", trailing spaces and tabs, the artefact's full stop).
_SUBMISSION = re.compile(rf"^{re.escape(VALIDATION_PREFIX)}(.*)$", re.MULTILINE)
_BASELINE = re.compile(rf"^{re.escape(BASELINE_LABEL)}(.*)$", re.MULTILINE)
_EVALUATION = re.compile(rf"^{re.escape(EVALUATION_LABEL)}(.*)$", re.MULTILINE)
# numpy scalar reprs (numpy >= 2 prints ``np.float64(2.5)``) and non-finite floats, which literal_eval rejects.
# The argument is stripped in code: ``\s*`` around a lazy group backtracked cubically on a long run of spaces.
_NUMPY_SCALAR = re.compile(r"\b(?:np|numpy)\.\w+\(([^()]*)\)")
_NON_FINITE = re.compile(r"(?<![\w'\".])(-?(?:inf|nan))(?![\w'\"])")


class ScoreError(ValueError):
    """A score that cannot be turned into a reward (unreadable metrics, or no way to choose the metric)."""


class MetricNameError(ScoreError):
    """The metric to reward is not among an evaluation's (or the baseline's) metrics: the task names its metric one
    way and its evaluator another. The task's fault, never the agent's."""


def find_metric(name: str, metrics: Mapping[str, Any]) -> str | None:
    """The key of ``metrics`` that holds the metric ``name``: ``name`` itself, else the only key equal to it ignoring
    case (titanic's evaluator prints ``accuracy`` where its baseline says ``Accuracy``), else None.

    MLGym looks a metric up by its exact name and skips a result without it; it never compares the evaluator's
    names with the baseline's (``validate`` prints both dicts side by side). Matching case-insensitively is ours, so
    a task whose two dicts differ only in case still has a baseline to beat.
    """
    if name in metrics:
        return name
    folded = [key for key in metrics if str(key).casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else None


def parse_metrics(text: str) -> dict[str, float]:
    """A metric dict printed as a Python repr (``{'Score': 2.37}``) as a dict of floats.

    Accepts numpy scalar reprs and ``nan``/``inf``; raises ``ScoreError`` on anything that is not a flat dict of
    numbers.
    """
    cleaned = _NUMPY_SCALAR.sub(lambda match: match.group(1).strip(), text.strip())
    cleaned = _NON_FINITE.sub(r"'\1'", cleaned)
    try:
        value = ast.literal_eval(cleaned)
    except (ValueError, SyntaxError, RecursionError, MemoryError) as exc:  # the text may be anything an agent printed
        raise ScoreError(f"cannot read a metric dict from {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise ScoreError(f"expected a metric dict like {{'Score': 1.0}}, got {text!r}")
    metrics: dict[str, float] = {}
    for key, number in value.items():
        if isinstance(number, bool):
            number = float(number)
        try:
            metrics[str(key)] = float(number)
        except (TypeError, ValueError, OverflowError):
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
    submission = _last_before(_SUBMISSION, observation, evaluation.start(), full_stop=True)
    baseline_text = baseline if baseline is not None else NO_BASELINE
    try:
        return {
            "submission": submission,
            "baseline": None if baseline_text.startswith("NA") else parse_metrics(baseline_text),
            "evaluation": parse_metrics(_trim(evaluation.group(1))),
        }
    except ScoreError:
        return {}  # not MLGym's message: it always prints metric dicts


def _trim(value: str) -> str:
    """A line's value as MLGym's patterns capture it: without one trailing "\\r", then trailing spaces and tabs."""
    if value.endswith("\r"):
        value = value[:-1]
    return value.rstrip(" \t")


def _last_before(pattern: re.Pattern[str], text: str, end: int, *, full_stop: bool = False) -> str | None:
    """The trimmed value of the last line ``pattern`` matches before ``end``; with ``full_stop`` only lines whose
    value ends with "." count, and the value is returned without it."""
    found = None
    for match in pattern.finditer(text, 0, end):
        value = _trim(match.group(1))
        if not full_stop:
            found = value
        elif value.endswith("."):
            found = value[:-1]
    return found


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
    if known is not None and find_metric(known.name, metrics) is not None:
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
    key = find_metric(metric, evaluation)
    if key is None:
        raise MetricNameError(mismatch_message(metric, evaluation, baseline, spec))
    base_key = find_metric(metric, baseline or {})
    base = (baseline or {})[base_key] if base_key is not None else 0.0
    delta = float(evaluation[key]) - float(base)
    return -delta if lower_is_better(spec) else delta


def mismatch_message(
    metric: str, evaluation: Mapping[str, Any], baseline: Mapping[str, Any] | None, spec: Any = None
) -> str:
    """Why an evaluation cannot be rewarded: the names on both sides, and the fix."""
    task = _field(spec, "id") or "?"
    return (
        f"task {task!r} is rewarded on the metric {metric!r}; its evaluator printed the metrics {sorted(evaluation)} "
        f"and its baseline holds {sorted(baseline or {})}, so the two cannot be compared. This is the task's fault, "
        f"not the agent's: name one metric the same way (up to case) in the evaluator's output, the baseline_scores "
        f"and extra.priority_metric (e.g. priority_metric: {sorted(evaluation)[0] if evaluation else metric})"
    )


def evaluation_metric_problem(metrics: Mapping[str, float], spec: Any = None) -> str | None:
    """Why an evaluation's metrics cannot be rewarded on ``spec``, or None when they can: no metric to choose, or
    the chosen one is missing (even ignoring case) from them or from the spec's baseline, when it has one."""
    try:
        metric = priority_metric(metrics, spec)
    except ScoreError as exc:
        return f"task {_field(spec, 'id') or '?'!r}: {exc}"
    baseline = spec_baseline(spec)
    if find_metric(metric, metrics) is None or (baseline and find_metric(metric, baseline) is None):
        return mismatch_message(metric, metrics, baseline, spec)
    return None


def baseline_metric_problem(spec: Any) -> str | None:
    """Why the spec's baseline cannot be compared with any score, known before anything runs: the task names a
    metric to reward (``extra.priority_metric``, or MLGym's ranking metric of that task id) that its baseline lacks,
    even ignoring case. None when there is no baseline, no named metric, or the baseline holds it."""
    baseline = spec_baseline(spec)
    if not baseline:
        return None
    named = _extra(spec).get("priority_metric")
    if not named:
        known = _mlgym_metric(spec)
        named = known.name if known is not None else None
    if not named or find_metric(str(named), baseline) is not None:
        return None
    return (
        f"task {_field(spec, 'id') or '?'!r} is rewarded on the metric {str(named)!r}, which its baseline_scores "
        f"{sorted(baseline)} do not hold (not even ignoring case), so no score could be compared with the baseline. "
        f"Name the metric the same way (up to case) in baseline_scores and extra.priority_metric, and in what the "
        f"evaluator prints (e.g. priority_metric: {sorted(baseline)[0]})"
    )


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


DEFAULT_FAILURE_REWARD = -1.0
"""The least a failure costs on a task that declares neither ``worst_score`` nor ``failure_reward``."""

FORMAT_EXIT = "autosubmission (exit_format)"
"""MLGym's ``exit_status`` when the episode ended on repeated format errors (the backend autosubmitted)."""

FAILED_EVALUATIONS = (INVALID_SUBMISSION, AGENT_ERROR)
"""Evaluation statuses that are the agent's failure (paid as the task's floor)."""


def failure_reward(spec: Any = None) -> float:
    """What a failed evaluation, or an episode that ends without a scored submission, pays.

    The spec's ``failure_reward`` when set; else its ``worst_score`` measured against the baseline like any score;
    else minus the baseline's size on the priority metric, at least 1 (a task whose metric is in the thousands gets
    a floor in the thousands: a score twice as far from perfect as the baseline, for a minimised metric). Never above
    0: failing never pays more than matching the baseline.
    """
    explicit = _field(spec, "failure_reward")
    if explicit is not None:
        return min(float(explicit), 0.0)
    worst = _field(spec, "worst_score") or {}
    if worst:
        try:
            delta = metric_delta({k: float(v) for k, v in dict(worst).items()}, spec_baseline(spec), spec)
        except (ScoreError, TypeError, ValueError):
            delta = None
        if delta is not None and math.isfinite(delta):
            return min(delta, 0.0)
    baseline = spec_baseline(spec) or {}
    try:
        size = abs(float(baseline[find_metric(priority_metric(baseline, spec), baseline)])) if baseline else 0.0
    except (ScoreError, KeyError, TypeError, ValueError):
        size = 0.0
    return -max(-DEFAULT_FAILURE_REWARD, size) if math.isfinite(size) else DEFAULT_FAILURE_REWARD


def honest_reward(
    metrics: Mapping[str, float],
    spec: Any = None,
    baseline: Mapping[str, float] | None = None,
    floor: float | None = None,
) -> float:
    """A scored evaluation's reward: score minus baseline (``baseline``, else the spec's) on the priority metric,
    never below ``floor`` (default ``failure_reward(spec)``: a score worse than the task's worst honest value is paid
    as that value; a non-finite one as a failure)."""
    floor = failure_reward(spec) if floor is None else floor
    delta = metric_delta(metrics, baseline if baseline is not None else spec_baseline(spec), spec)
    return max(delta, floor) if math.isfinite(delta) else floor


@dataclass(frozen=True)
class StepOutcome:
    """What a step means for the reward, read from the ``info`` the backend returned.

    ``kind`` is ``none`` (nothing was evaluated and the episode goes on), ``scored`` (the evaluator scored a
    submission: ``metrics``, and ``earlier``, the scores of the episode before it), ``failed`` (an evaluation was the
    agent's failure, or the episode ended without a scored submission, or on repeated format errors when the task
    does not score that autosubmission: ``earlier`` holds the episode's scores so far), ``cut`` (the env, not the
    backend, ended the episode without an evaluation, e.g. at its turn cap: ``earlier`` holds the episode's scores)
    or ``infra`` (the evaluation failed for a reason that is not the agent's: never paid). ``failed_before`` says
    whether an evaluation of the episode before this step was the agent's failure.
    """

    kind: str
    metrics: dict[str, float] | None = None
    earlier: tuple[dict[str, float], ...] = ()
    baseline: dict[str, float] | None = None
    """The baseline to score against, when the text is all there is (the printed one); None: the spec's."""
    failed_before: bool = False


def step_outcome(observation: str | None, info: Mapping[str, Any] | None, spec: Any = None) -> StepOutcome:
    """The ``StepOutcome`` of one step.

    The backend's ``info["evaluation_status"]`` says whether this step ran an evaluation and how it ended (the env
    fills it in for backends that do not), so a validation the agent merely printed again (``echo``) is no
    evaluation. Without that key, a validation counts when the text shows the evaluator's latest metrics
    (``validation_reward``'s rule) and a final submission when ``info`` holds its score.
    """
    if not isinstance(info, Mapping) or "score" not in info:
        # a caller with only the text (no evaluator results to check it against) is trusted, as in MLGym
        parsed = parse_validation(observation)
        if not parsed:
            return StepOutcome("none")
        return StepOutcome("scored", parsed["evaluation"], baseline=parsed["baseline"])
    scores = list(info.get("score") or [])
    status = info.get(EVALUATION_STATUS_KEY)
    ended = bool(info.get("exit_status"))
    before = _failed_before(info)
    if status == INFRA_ERROR:
        return StepOutcome("infra")
    if status in FAILED_EVALUATIONS:
        return StepOutcome("failed", earlier=_readable(scores, spec), failed_before=before)
    if status == EVALUATION_OK or (status is None and _shows_new_score(observation, info, spec)):
        earlier = _readable(scores[:-1], spec)
        if info.get("exit_status") == FORMAT_EXIT and not _field(spec, "score_format_exit"):
            return StepOutcome("failed", earlier=earlier, failed_before=before)
        try:
            metrics = score_entry_metrics(scores[-1])
        except (IndexError, TypeError, ValueError):
            return StepOutcome("infra")  # the backend said "scored" but kept no readable score
        if evaluation_metric_problem(metrics, spec) is not None:
            return StepOutcome("infra")  # the task's metric names do not match its evaluator's: not the agent's doing
        return StepOutcome("scored", metrics, earlier, failed_before=before)
    if ended:
        return StepOutcome("failed", earlier=_readable(scores, spec), failed_before=before)
    if info.get(STOP_REASON_KEY):
        return StepOutcome("cut", earlier=_readable(scores, spec), failed_before=before)
    return StepOutcome("none")


def _failed_before(info: Mapping[str, Any]) -> bool:
    """Whether an evaluation before this step's was the agent's failure: ``info[EVALUATIONS_KEY]`` lists the statuses
    of the episode's evaluations, this step's last when it evaluated."""
    statuses = list(info.get(EVALUATIONS_KEY) or [])
    if info.get(EVALUATION_STATUS_KEY) and statuses:
        statuses = statuses[:-1]
    return any(status in FAILED_EVALUATIONS for status in statuses)


def _shows_new_score(observation: str | None, info: Mapping[str, Any], spec: Any) -> bool:
    """For a backend that gives no evaluation status: a validation showing the latest score, or a scored submission."""
    return validation_reward(observation, info, spec) is not None or is_scored_submission(info)


def _readable(scores: list[Any], spec: Any = None) -> tuple[dict[str, float], ...]:
    """The entries of ``scores`` that can be rewarded on ``spec`` (readable, with the metric the task names)."""
    readable = []
    for entry in scores:
        try:
            metrics = score_entry_metrics(entry)
        except (TypeError, ValueError):
            continue
        if evaluation_metric_problem(metrics, spec) is None:
            readable.append(metrics)
    return tuple(readable)


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
    if not same_metrics(parsed["evaluation"], latest) or evaluation_metric_problem(latest, spec) is not None:
        return None
    return metric_delta(latest, spec_baseline(spec), spec)
