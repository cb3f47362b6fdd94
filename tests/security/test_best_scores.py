"""A score past the best value its metric can take is an invalid submission, never paid: an evaluator whose
arithmetic the submission breaks (an int64 sum that wraps, a weight past 1) must not pay "better than perfect"."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.best_scores import past_best
from mlgym_registry.scores import EVALUATION_STATUS_KEY, INVALID_SUBMISSION
from mlgym_registry.specs import TaskSpec

from .helpers import open_backend, write_file

pytestmark = pytest.mark.security

TRUTH = [3, 1, 4, 1, 5]
WRAPPING_EVALUATOR = '''
import argparse, csv, json
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--submission_file")
args = parser.parse_args()
with open("data/answer.csv", newline="") as handle:
    truth = [int(row["y"]) for row in csv.DictReader(handle)]
with open(args.submission_file, newline="") as handle:
    predicted = [int(row["y"]) for row in csv.DictReader(handle)]
errors = np.array(predicted, dtype=np.int64) - np.array(truth, dtype=np.int64)
print(json.dumps({"mae": float(np.abs(errors).sum()) / len(truth)}))
'''


def wrapping_task(folder: Path, **changes) -> TaskSpec:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(WRAPPING_EVALUATOR)
    (folder / "data" / "answer.csv").write_text("id,y\n" + "".join(f"{i},{y}\n" for i, y in enumerate(TRUTH)))
    return TaskSpec(
        id="wrappingMae", task_entrypoint="CSVSubmissionTasks", training_timeout=60, max_steps=20,
        starter_code=["evaluate.py"], evaluation_paths=["evaluate.py"], evaluation_read_only=True,
        secret_files=["data/answer.csv"], root=str(folder), requirements=["numpy"],
        datasets=[{"name": "answers", "description": "", "data_path": "data", "is_local": True}],
        baseline_scores=[{"mae": 2.8}], best_score={"mae": 0.0}, **changes,
    )


def submit(env, values) -> tuple[str, dict]:
    write_file(env, "submission.csv", "id,y\n" + "".join(f"{i},{v}\n" for i, v in enumerate(values)))
    obs, _, _, info = env.step("validate")
    return obs, info


@pytest.mark.slow
def test_a_wrapped_sum_better_than_perfect_is_an_invalid_submission(tmp_path):
    env = open_backend(wrapping_task(tmp_path / "task"))
    try:
        obs, info = submit(env, [0] * len(TRUTH))  # honest and poor: the mean of the truth
        assert info[EVALUATION_STATUS_KEY] == "ok" and info["score"][-1] == {"mae": 2.8}, obs
        # two errors of 2**62 sum to 2**63, which wraps to -2**63 in int64: an MAE far below 0
        obs, info = submit(env, [TRUTH[0] + 2**62, TRUTH[1] + 2**62, *TRUTH[2:]])
        assert info[EVALUATION_STATUS_KEY] == INVALID_SUBMISSION, obs
        assert "past its best value 0.0" in obs and len(info["score"]) == 1, obs
        assert "Evaluation Score" not in obs
    finally:
        env.close()


@pytest.mark.parametrize("metrics, declared, baseline, worst, past", [
    ({"accuracy": 1.2}, {"accuracy": 1.0}, {"accuracy": 0.5}, {}, ["accuracy"]),
    ({"accuracy": 1.0}, {"accuracy": 1.0}, {"accuracy": 0.5}, {}, []),
    ({"Accuracy": 1.01}, {"accuracy": 1.0}, {}, {"accuracy": 0.0}, ["Accuracy"]),  # direction from the worst score
    ({"rmse": -3.0, "r2": 0.9}, {"rmse": 0.0, "r2": 1.0}, {"rmse": 10.0, "r2": 0.5}, {}, ["rmse"]),
    ({"rmse": 3.0, "r2": 1.5}, {"rmse": 0.0, "r2": 1.0}, {"rmse": 10.0, "r2": 0.5}, {}, ["r2"]),
    ({"Score": -0.5}, {"Score": 0.0}, {}, {}, []),  # nothing tells the direction (the task is maximised): not past
    ({"loss": -0.5}, {"loss": 0.0}, {}, {}, ["loss"]),  # the rewarded metric of a minimised task
    ({"Score": True}, {"Score": 0.0}, {"Score": 1.0}, {}, []),  # not a number: the evaluator's own check's business
])
def test_past_best_reads_each_metrics_direction_from_an_honest_value(metrics, declared, baseline, worst, past):
    extra = {"metric_direction": "min"} if "loss" in metrics else {}
    spec = TaskSpec(id="bounds", best_score=declared, baseline_scores=[baseline] if baseline else [],
                    worst_score=worst, extra=extra)
    assert [entry.split(" = ")[0] for entry in past_best(metrics, spec)] == past


@pytest.mark.parametrize("task", ["prisonersDilemma", "battleOfSexes", "blotto", "capitals", "houseRegression"])
def test_every_built_in_task_declares_its_best_values(task):
    spec = registry.spec(task)
    assert spec.best_score
    assert past_best(spec.baseline_scores[0], spec) == []
