"""Score-delta reward: validate observations and final submission scores, on MLGym's recorded runs and by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import recorded_results
from outside_data import RECORDED, needs_recorded_runs, recorded_run_params

from mlgym_registry import registry
from mlgym_registry.components.rewards import (
    ScoreDeltaReward,
    ScoreError,
    failure_reward,
    metric_delta,
    parse_metrics,
    parse_validation,
    priority_metric,
    score_from_info,
    submission_metrics,
)
from mlgym_registry.components.templates import STATUS_BLOCK
from mlgym_registry.scores import mlgym_ranking_metric
from mlgym_registry.specs import TaskSpec

reward = ScoreDeltaReward()
PD = TaskSpec(id="prisonersDilemma", baseline_scores=[{"Score": 2.3716301918029785}])


def validation_text(baseline: str, evaluation: str, path: str = "/home/agent/workspace/target.py") -> str:
    return (f"Your code produced a valid submission artefact at {path}.\nBaseline Score: {baseline}\n"
            f"Evaluation Score: {evaluation}")


def info(exit_status: str = "", score: list | None = None) -> dict:
    return {"model_stats": {}, "exit_status": exit_status, "submission": None, "score": score or [], "summarizer": {}}


def load_run(path: Path) -> tuple[dict, dict]:
    results = recorded_results(path)
    if results is None:
        pytest.skip(f"no results.json beside {path.name}")
    return json.loads(path.read_text()), json.loads(results.read_text())


def ranking(task_id: str, baseline: dict) -> tuple[str, float]:
    """The metric MLGym ranks the task by and +1 (higher is better) or -1, for the task of a recorded run."""
    known = mlgym_ranking_metric(task_id)
    if known is not None:
        return known.name, -1.0 if known.direction == "min" else 1.0
    if len(baseline) != 1:
        pytest.skip(f"which of {sorted(baseline)} ranks task {task_id!r} is not known")
    return next(iter(baseline)), 1.0


def expected_reward(entry: dict, baseline: dict, task_id: str, non_finite: float = 0.0) -> float:
    """What a scored entry of results.json is worth: its ranking metric's gain over the baseline (``non_finite``
    when that is not a finite number)."""
    name, sign = ranking(task_id, baseline)
    value = sign * (float(entry[name]) - float(baseline.get(name, 0.0)))
    return value if math.isfinite(value) else non_finite


# -- MLGym's recorded runs ---------------------------------------------------------------------------------------------
@pytest.mark.trajectories
@pytest.mark.parametrize("path", recorded_run_params())
def test_recorded_validations_parse(path):
    traj, results = load_run(path)
    parsed = [parse_validation(step["observation"]) for step in traj["trajectory"]]
    parsed = [p for p in parsed if p]
    for item in parsed:
        # the task's submission artefact (target.py, submission.csv, a config...), or nothing for some tasks
        assert item["submission"] == "" or item["submission"].startswith("/home/agent/workspace/")
        assert item["baseline"] == results["baseline"]
    # Every validation's metrics are the next entry of info["score"], in order.
    assert [p["evaluation"] for p in parsed] == traj["info"]["score"][: len(parsed)]


@pytest.mark.trajectories
@pytest.mark.parametrize("path", recorded_run_params())
def test_recorded_episode_rewards_count_every_score_once(path):
    """Replay each run's steps with the per-step info MLGym's env returns; the rewards add up to results.json."""
    traj, results = load_run(path)
    spec = TaskSpec(id=path.parent.name, baseline_scores=[results["baseline"]])
    final = traj["info"]
    steps = traj["trajectory"]
    rewards = []
    for index, step in enumerate(steps):
        validation = parse_validation(step["observation"])
        if index == len(steps) - 1 and final["exit_status"]:
            # The episode's last step: MLGym's env put this step's evaluation (if any) into its info.
            scored = final["exit_status"] == "submitted" or final["exit_status"].startswith("autosubmission")
            step_info = info(final["exit_status"], final["score"][-1:] if scored else [])
        else:
            step_info = info("", [validation["evaluation"]] if validation else [])
        rewards.append(reward(step["observation"], step_info, spec))
    # honest scores are paid no lower than the task's floor; an episode that ends without a scored submission
    # (exit_cost, a failed submit, ...) pays the floor on its last step
    floor = failure_reward(spec)
    expected = [max(expected_reward(entry, results["baseline"], spec.id, floor), floor) for entry in results["agent"]]
    scored_end = final["exit_status"] == "submitted" or final["exit_status"].startswith("autosubmission")
    if final["exit_status"] and not (scored_end and final["score"]):
        expected.append(floor)
    assert [r for r in rewards if r != 0.0] == pytest.approx([e for e in expected if e != 0.0])
    assert sum(rewards) == pytest.approx(sum(expected))


@pytest.mark.trajectories
@needs_recorded_runs
def test_recorded_final_scores_from_info():
    checked = 0
    for path in RECORDED:
        traj, results = load_run(path)
        spec = TaskSpec(id=path.parent.name, baseline_scores=[results["baseline"]])
        status = traj["info"]["exit_status"]
        value = score_from_info(traj["info"], spec)
        if (status == "submitted" or status.startswith("autosubmission")) and results["agent"]:
            assert value == pytest.approx(expected_reward(results["agent"][-1], results["baseline"], spec.id))
            checked += 1
        elif not (status == "submitted" or status.startswith("autosubmission")):
            # "", evaluation_format_error (...): the last score entry is an earlier validation, not a submission
            assert value is None
    assert checked > 0


# -- parse_validation and parse_metrics ------------------------------------------------------------------------------
def test_parse_validation_of_mlgym_message():
    text = validation_text("{'Score': 2.3716301918029785}", "{'Score': 2.3400301933288574}")
    assert parse_validation(text) == {
        "submission": "/home/agent/workspace/target.py",
        "baseline": {"Score": 2.3716301918029785},
        "evaluation": {"Score": 2.3400301933288574},
    }


def test_parse_validation_inside_a_turn_message():
    """TorchRL reads the last history message: the observation followed by the status block."""
    message = validation_text("{'Score': 1.0}", "{'Score': 1.5}") + "\n" + STATUS_BLOCK.format(
        current_step=4, remaining_steps=46, open_file="/w/strategy.py", working_dir="/w")
    assert parse_validation(message)["evaluation"] == {"Score": 1.5}
    assert reward(message, None, PD) == pytest.approx(0.5)


def test_parse_validation_multi_metric_and_no_baseline():
    text = validation_text("NA (no baseline was there)", "{'Time': 16.158, 'Correct': 24000, 'Incorrect': 0}",
                           path="/tmp/ws/solver.py")
    assert parse_validation(text) == {
        "submission": "/tmp/ws/solver.py",
        "baseline": None,
        "evaluation": {"Time": 16.158, "Correct": 24000.0, "Incorrect": 0.0},
    }


def test_last_validation_counts():
    text = validation_text("{'Score': 1}", "{'Score': 2}") + "\n" + validation_text("{'Score': 1}", "{'Score': 3}")
    assert parse_validation(text)["evaluation"] == {"Score": 3.0}


@pytest.mark.parametrize(
    "observation",
    [
        None,
        "",
        "Exited (submit)",
        "Submission artefact not found. You have to produce a valid submission artefact as described in the task "
        "description to validate your results.",
        "Failed to decode metrics from evaluation script. Output:\n---\nTraceback ...\n---\nPlease make sure the "
        "evaluation script prints the metrics in json format.",
        "Error: Timeout reached while reading from subprocess.\nCurrent buffer: ",
        "Evaluation Score: not a dict",
    ],
)
def test_non_validations(observation):
    assert parse_validation(observation) == {}
    assert reward(observation, info(), PD) == 0.0


def test_parse_metrics_variants():
    assert parse_metrics("{'Score': 2.5}") == {"Score": 2.5}
    assert parse_metrics("{'accuracy': np.float64(0.91), 'loss': np.float32(0.3)}") == {"accuracy": 0.91, "loss": 0.3}
    assert parse_metrics('{"rmse": 30000, "ok": True}') == {"rmse": 30000.0, "ok": 1.0}
    odd = parse_metrics("{'Score': nan, 'Best': inf, 'Worst': -inf}")
    assert math.isnan(odd["Score"]) and odd["Best"] == math.inf and odd["Worst"] == -math.inf
    for bad in ("[1, 2]", "{'Score': 'high'}", "{'Score': ", "Score: 1"):
        with pytest.raises(ScoreError):
            parse_metrics(bad)


# -- choosing the metric, direction, baseline ----------------------------------------------------------------------
def test_priority_metric_choice():
    assert priority_metric({"Score": 1.0}) == "Score"
    assert priority_metric({"accuracy": 1.0}) == "accuracy"
    assert priority_metric({"accuracy": 1.0, "Score": 2.0}) == "Score"
    spec = TaskSpec(id="t", extra={"priority_metric": "Correct"})
    assert priority_metric({"Time": 1.0, "Correct": 2.0}, spec) == "Correct"
    with pytest.raises(ScoreError, match="priority_metric"):
        priority_metric({"Time": 1.0, "Correct": 2.0})


def test_multi_metric_reward_uses_priority_metric():
    spec = TaskSpec(id="3SATTime", baseline_scores=[{"Time": 16.158, "Correct": 24000, "Incorrect": 0}],
                    extra={"priority_metric": "Time", "metric_direction": "min"})
    text = validation_text("{'Time': 16.158, 'Correct': 24000, 'Incorrect': 0}",
                           "{'Time': 12.0, 'Correct': 24000, 'Incorrect': 0}")
    assert reward(text, info("", [{"Time": 12.0, "Correct": 24000, "Incorrect": 0}]), spec) == pytest.approx(4.158)
    with pytest.raises(ScoreError, match="priority_metric"):
        reward(text, None, TaskSpec(id="mySatTask"))


@pytest.mark.parametrize(
    ("task_id", "evaluation", "baseline", "expected"),
    [
        # MLGym ranks 3-SAT by Time, lower is better: 4 seconds faster is +4
        ("3SATTime", {"Time": 12.0, "Correct": 24000, "Incorrect": 0}, {"Time": 16.0, "Correct": 24000}, 4.0),
        ("mlgym/regressionKaggleHousePrice", {"rmse": 30000.0, "r2": 0.88}, {"rmse": 30340.1, "r2": 0.88}, 0.0),
        ("regressionKaggleHousePriceL1", {"rmse": 1.0, "r2": 0.9}, {"rmse": 2.0, "r2": 0.8}, 0.1),
        ("mlgym/rlMountainCarContinuous", {"Reward Mean": 60.0, "Reward Std": 5.0}, {"Reward Mean": 33.8}, 26.2),
        # a loss: lower is better even with a single key
        ("languageModelingFineWeb", {"val_loss": 4.0}, {"val_loss": 4.7}, 0.7),
    ],
)
def test_mlgym_tasks_are_scored_by_mlgym_ranking_metric(task_id, evaluation, baseline, expected):
    spec = TaskSpec(id=task_id, baseline_scores=[baseline])
    assert metric_delta(evaluation, baseline, spec) == pytest.approx(expected)
    assert score_from_info(info("submitted", [evaluation]), spec) == pytest.approx(expected)


def test_task_extra_fields_win_over_mlgym_ranking():
    spec = TaskSpec(id="3SATTime", extra={"priority_metric": "Correct", "metric_direction": "maximize"})
    assert metric_delta({"Time": 1.0, "Correct": 10.0}, {"Time": 2.0, "Correct": 8.0}, spec) == pytest.approx(2.0)


def test_metric_direction_min_flips_sign():
    spec = TaskSpec(id="house", baseline_scores=[{"rmse": 30000.0}], extra={"metric_direction": "min"})
    assert metric_delta({"rmse": 28000.0}, {"rmse": 30000.0}, spec) == pytest.approx(2000.0)
    assert score_from_info(info("submitted", [{"rmse": 31000.0}]), spec) == pytest.approx(-1000.0)


def test_missing_baseline_falls_back_to_spec_then_zero():
    text = validation_text("NA (no baseline was there)", "{'Score': 2.5}")
    assert reward(text, None, PD) == pytest.approx(2.5 - 2.3716301918029785)
    assert reward(text, None, TaskSpec(id="fresh")) == pytest.approx(2.5)
    assert reward(text, None, None) == pytest.approx(2.5)


def test_printed_baseline_wins_over_spec():
    text = validation_text("{'Score': 2.0}", "{'Score': 2.5}")
    assert reward(text, None, PD) == pytest.approx(0.5)


def test_spec_as_dict():
    text = validation_text("NA (no baseline was there)", "{'Score': 3.0}")
    assert reward(text, None, PD.to_dict()) == pytest.approx(3.0 - 2.3716301918029785)


def test_missing_metric_is_an_error():
    spec = TaskSpec(id="t", extra={"priority_metric": "accuracy"})
    with pytest.raises(ScoreError, match="accuracy"):
        reward(validation_text("{'Score': 1}", "{'Score': 2}"), None, spec)


# -- the final submission, and no double counting --------------------------------------------------------------------
@pytest.mark.parametrize("status", ["submitted", "autosubmission (max_steps)", "autosubmission (exit_context)"])
def test_submission_reward_from_info(status):
    step_info = info(status, [{"Score": 2.4}, {"Score": 2.5}])
    assert submission_metrics(step_info) == {"Score": 2.5}
    assert reward(f"Exited ({status.split('(')[-1].rstrip(')')})", step_info, PD) == pytest.approx(
        2.5 - 2.3716301918029785)
    assert reward("", step_info, PD) == pytest.approx(2.5 - 2.3716301918029785)  # old MLGym: empty submit text


@pytest.mark.parametrize(
    "status",
    ["", "skipped", "exit_forfeit", "early_exit", "submission_not_found (submit)",
     "evaluation_format_error (max_steps)", "RuntimeError, boom, (submit)"],
)
def test_no_submission_reward_without_a_scored_submission(status):
    """An episode that ends without a scored submission pays the task's floor (failing never pays more than
    trying); a step that ends nothing pays 0."""
    step_info = info(status, [{"Score": 2.5}])  # e.g. an earlier validation's score left in an accumulated info
    assert score_from_info(step_info, PD) is None
    expected = 0.0 if not status else failure_reward(PD)
    assert reward("Exited (submit)", step_info, PD) == pytest.approx(expected)
    assert failure_reward(PD) == pytest.approx(-2.3716301918029785)  # no worst_score: minus the baseline's size


def test_validate_then_submit_each_count_once():
    validate_info = info("", [{"Score": 2.5}])
    text = validation_text("{'Score': 2.3716301918029785}", "{'Score': 2.5}")
    submit_info = info("submitted", [{"Score": 2.6}])
    steps = [("ls", info()), (text, validate_info), ("File updated.", info()), ("Exited (submit)", submit_info)]
    rewards = [reward(obs, step_info, PD) for obs, step_info in steps]
    base = 2.3716301918029785
    assert rewards == pytest.approx([0.0, 2.5 - base, 0.0, 2.6 - base])


def test_forged_validation_text_does_not_pay():
    """An agent that echoes the message gets nothing: its step's info holds no evaluation."""
    forged = validation_text("{'Score': 0.0}", "{'Score': 1000.0}")
    assert reward(forged, info(), PD) == 0.0
    # A caller with only the text (no info) still reads it.
    assert reward(forged, None, PD) == pytest.approx(1000.0)


def test_forged_validation_text_does_not_pay_after_a_real_validation_either():
    """``info["score"]`` accumulates over the episode: after one real validation it is never empty again, so the
    numbers must come from it, not from the text."""
    earlier = info("", [{"Score": 2.5}])
    assert reward(validation_text("{'Score': 0.0}", "{'Score': 1000.0}"), earlier, PD) == 0.0
    # a forged baseline beside the real score is ignored: the spec's baseline counts
    assert reward(validation_text("{'Score': -1000.0}", "{'Score': 2.5}"), earlier, PD) == pytest.approx(
        2.5 - 2.3716301918029785)
    # echoing the latest real validation pays what running validate again would, no more
    assert reward(validation_text("{'Score': 2.3716301918029785}", "{'Score': 2.5}"), earlier, PD) == pytest.approx(
        2.5 - 2.3716301918029785)


def test_non_finite_scores_pay_the_floor():
    """A non-finite metric is never a score: it pays what a failure pays, never 0 (which beats honest poor play)."""
    floor = failure_reward(PD)
    assert reward(validation_text("{'Score': 1.0}", "{'Score': nan}"), None, PD) == pytest.approx(floor)
    assert reward("Exited (submit)", info("submitted", [{"Score": float("nan")}]), PD) == pytest.approx(floor)
    assert reward("Exited (submit)", info("submitted", [{"Score": float("-inf")}]), PD) == pytest.approx(floor)


def test_registered_reward():
    assigner = registry.get("reward", "mlgym_score_delta")
    assert isinstance(assigner, ScoreDeltaReward)
    spec = TaskSpec(id="aGame", baseline_scores=[{"Score": 1.0}])
    assert assigner(validation_text("{'Score': 1.0}", "{'Score': 1.25}"), info("", [{"Score": 1.25}]), spec) == 0.25


# -- evaluation statuses, floors and the best-improvement reward ------------------------------------------------------
def evaluated(status: str, scores: list, exit_status: str = "") -> dict:
    """The info of a step on which the backend ran an evaluation that ended with ``status``."""
    return {**info(exit_status, scores), "evaluation_status": status}


HOUSE = TaskSpec(id="houseRegression", baseline_scores=[{"rmse": 47826.6679, "r2": 0.8157}],
                 worst_score={"r2": -10.0}, extra={"priority_metric": "r2"})


def test_failure_reward_comes_from_the_task():
    assert failure_reward(HOUSE) == pytest.approx(-10.0 - 0.8157)
    assert failure_reward(PD.replace(worst_score={"Score": 0.0})) == pytest.approx(-2.3716301918029785)
    assert failure_reward(PD.replace(failure_reward=-7.5)) == -7.5
    assert failure_reward(PD.replace(failure_reward=3.0)) == 0.0  # a failure never pays above the baseline
    minimised = TaskSpec(id="t", baseline_scores=[{"Time": 16.0}], extra={"metric_direction": "min"})
    assert failure_reward(minimised) == -16.0  # scale-aware default: twice the baseline's time
    assert failure_reward(TaskSpec(id="t")) == -1.0


@pytest.mark.parametrize("name", ["mlgym_score_delta", "mlgym_best_improvement"])
def test_a_failed_evaluation_never_pays_more_than_an_honest_poor_one(name):
    assigner = registry.get("reward", name)
    poorest_honest = assigner("", evaluated("ok", [{"r2": -1e6}], "submitted"), HOUSE)
    for status in ("invalid_submission", "agent_error"):
        assert assigner("Exited (submit)", evaluated(status, [], "evaluation_format_error (submit)"), HOUSE) \
            <= poorest_honest
    assert poorest_honest == pytest.approx(failure_reward(HOUSE))  # honest scores below the floor are clipped
    # breaking the metric (a price of 1e308 scores r2 = -inf) is a failure, not a 0
    assert assigner("", evaluated("ok", [{"rmse": float("inf"), "r2": float("-inf")}], "submitted"), HOUSE) \
        == pytest.approx(failure_reward(HOUSE))


@pytest.mark.parametrize("name", ["mlgym_score_delta", "mlgym_best_improvement"])
def test_infra_errors_are_never_paid(name):
    assigner = registry.get("reward", name)
    assert assigner("Error: no module named pandas", evaluated("infra_error", []), PD) == 0.0
    assert assigner("Exited (submit)", evaluated("infra_error", [], "ModuleNotFoundError, x, (submit)"), PD) == 0.0


def test_score_delta_pays_every_validate_and_best_improvement_only_improvements():
    base = 2.3716301918029785
    steps = [  # (observation, info): three validates of the same code, an improvement, a worse one, the submit
        ("v", evaluated("ok", [{"Score": 2.4}])),
        ("v", evaluated("ok", [{"Score": 2.4}] * 2)),
        ("echo", {**info("", [{"Score": 2.4}] * 2), "evaluation_status": ""}),
        ("v", evaluated("ok", [{"Score": 2.4}] * 3)),
        ("v", evaluated("ok", [{"Score": 2.4}] * 3 + [{"Score": 2.6}])),
        ("v", evaluated("ok", [{"Score": 2.4}] * 3 + [{"Score": 2.6}, {"Score": 2.5}])),
        ("Exited (submit)", evaluated("ok", [{"Score": 2.4}] * 3 + [{"Score": 2.6}, {"Score": 2.5}, {"Score": 2.5}],
                                      "submitted")),
    ]
    delta = [registry.get("reward", "mlgym_score_delta")(o, i, PD) for o, i in steps]
    best = [registry.get("reward", "mlgym_best_improvement")(o, i, PD) for o, i in steps]
    assert delta == pytest.approx([2.4 - base, 2.4 - base, 0.0, 2.4 - base, 2.6 - base, 2.5 - base, 2.5 - base])
    assert best == pytest.approx([2.4 - base, 0.0, 0.0, 0.0, 0.2, 0.0, -0.1])
    # the submission's score minus the baseline, however often and however well it validated before
    assert sum(best) == pytest.approx(2.5 - base)


def test_best_improvement_pays_the_floor_before_any_score_and_an_ending_failure_brings_the_total_to_it():
    assigner = registry.get("reward", "mlgym_best_improvement")
    floor = failure_reward(PD)
    scored = 2.4 - 2.3716301918029785
    assert assigner("", evaluated("agent_error", []), PD) == pytest.approx(floor)
    assert assigner("", evaluated("agent_error", [{"Score": 2.4}]), PD) == 0.0  # a failed validate: the best stays
    assert assigner("Exited (exit_forfeit)", info("exit_forfeit", []), PD) == pytest.approx(floor)
    # the episode ends without a scored submission: its total is the floor, whatever it validated before
    ended = assigner("Exited (exit_forfeit)", info("exit_forfeit", [{"Score": 2.4}]), PD)
    assert ended == pytest.approx(floor - scored)


@pytest.mark.parametrize("name", ["mlgym_score_delta", "mlgym_best_improvement"])
def test_format_exit_autosubmission_pays_no_evaluator_score_by_default(name):
    assigner = registry.get("reward", name)
    step_info = evaluated("ok", [{"Score": 2.38}], "autosubmission (exit_format)")
    assert assigner("Exited (exit_format)", step_info, PD) == pytest.approx(failure_reward(PD))
    scoring = PD.replace(score_format_exit=True)
    assert assigner("Exited (exit_format)", step_info, scoring) == pytest.approx(2.38 - 2.3716301918029785)
