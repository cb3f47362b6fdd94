"""MLGym's ML tasks from a checkout: our overlay hides their answers from the agent (the evaluator still reads them),
and metric names that differ between a task's baseline and its evaluator never raise out of ``env.step``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import fresh_registry as fresh
from conftest import write

from mlgym_registry import InvalidTaskError
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.mlgym import refuse_unprotected_files
from mlgym_registry.backends.protocol import EVALUATION_STATUS_KEY, INFRA_ERROR
from mlgym_registry.policies.base import fenced
from mlgym_registry.testing import check_task
from mlgym_registry.transforms.backend_env import EVALUATION_ERROR_KEY

TITANIC = """\
id: titanicSurvival
name: Titanic Survival Prediction
description: Predict 'Survived' for test.csv; write submission.csv (PassengerId, Survived).
task_entrypoint: CSVSubmissionTasks
training_timeout: 600
starter_code:
  - data/titanic/evaluate.py
dataset_configs:
  - datasets/titanic.yaml
baseline_scores:
  - Accuracy: 0.5
evaluation_paths:
  - evaluate.py
sample_submission: data/titanic/sample_submission.csv
evaluation_read_only: true
# MLGym's evaluator imports pandas and sklearn (our overlay declares them); the one below needs the standard library
requirements: []
"""

TITANIC_DATA = """\
name: titanic
description: "train.csv and test.csv"
data_path: "data/titanic/data"
is_local: true
"""

# the real evaluator's behaviour in the standard library only: answers from data/ground_truth.csv, joined on
# PassengerId, printed as {"accuracy": ...}
EVALUATE = """\
import csv, json, os, sys

workspace = "/home/agent/workspace" if os.path.isdir("/home/agent/workspace") else os.getcwd()
truth_path = os.path.join(workspace, "data", "ground_truth.csv")
if not os.path.exists(truth_path):
    sys.exit("Error: Ground truth file not found")
with open(truth_path) as f:
    truth = {row["PassengerId"]: row["Survived"] for row in csv.DictReader(f)}
with open(os.path.join(workspace, "submission.csv")) as f:
    guess = {row["PassengerId"]: row["Survived"] for row in csv.DictReader(f)}
if len(guess) != len(truth):
    sys.exit("Error: Submission file has the incorrect number of rows.")
print(json.dumps({"accuracy": sum(guess.get(k) == v for k, v in truth.items()) / len(truth)}))
"""

PASSENGERS = range(892, 902)  # ten test passengers; four survived
SURVIVED = {892, 895, 898, 900}


def rows(survived: set[int]) -> str:
    return "PassengerId,Survived\n" + "".join(f"{p},{int(p in survived)}\n" for p in PASSENGERS)


@pytest.fixture
def titanic(tmp_path, monkeypatch) -> Path:
    """A checkout holding a titanic-shaped task (MLGym's id, file layout and CSV schema), MLGYM_ROOT at it."""
    root = tmp_path / "MLGym"
    write(root / "configs/tasks/titanic.yaml", TITANIC)
    write(root / "configs/datasets/titanic.yaml", TITANIC_DATA)
    write(root / "data/titanic/evaluate.py", EVALUATE)
    write(root / "data/titanic/sample_submission.csv", rows(set()))
    write(root / "data/titanic/data/train.csv", "PassengerId,Survived,Pclass,Sex,Age\n1,0,3,male,22\n2,1,1,female,38\n")
    write(root / "data/titanic/data/test.csv", "PassengerId,Pclass,Sex,Age\n" + "".join(
        f"{p},3,male,30\n" for p in PASSENGERS))
    write(root / "data/titanic/data/ground_truth.csv", rows(SURVIVED))
    monkeypatch.setenv("MLGYM_ROOT", str(root))
    return root


def shell(backend: LocalBackend, command: str) -> str:
    return str(backend.step(command)[0])


def validate(backend: LocalBackend) -> tuple[str, dict | None]:
    """The validate observation and the score it added (None when the evaluation scored nothing)."""
    observation, _, _, info = backend.step("validate")
    scores = info.get("score") or []
    return str(observation), (dict(scores[-1]) if info.get(EVALUATION_STATUS_KEY) == "ok" else None)


@pytest.fixture
def backend(titanic):
    spec = fresh().spec("mlgym/titanicSurvival")
    env = LocalBackend(spec, seed=0, validation_rows="all")  # accuracies over all ten rows (test_validate_oracle)
    env.reset()
    env.install_tools()
    yield env
    env.close()


def test_the_overlay_names_titanics_answers_and_the_kaggle_answers(titanic):
    spec = fresh().spec("mlgym/titanicSurvival")
    assert spec.secret_files == ["data/ground_truth.csv"]
    assert spec.extra["priority_metric"] == "accuracy"
    refuse_unprotected_files(spec)  # the mlgym backend runs MLGym's task as MLGym does: no refusal


def test_an_own_secret_still_refuses_on_the_mlgym_backend(titanic):
    spec = fresh().spec("mlgym/titanicSurvival")
    with pytest.raises(InvalidTaskError, match="secret_files"):
        refuse_unprotected_files(spec.replace(secret_files=[*spec.secret_files, "data/train.csv"]))


def test_the_agent_cannot_read_the_ground_truth_by_any_path(backend, titanic):
    host_copy = titanic / "data/titanic/data/ground_truth.csv"
    assert "ground_truth" not in shell(backend, "ls data")
    assert "892,1" not in shell(backend, "cat data/ground_truth.csv")
    assert "ground_truth.csv" not in shell(backend, "find / -name 'ground_truth*' 2>/dev/null | head")
    assert "892,1" not in shell(backend, f"cat {host_copy} 2>&1")
    shell(backend, f"ln -s {host_copy} host_link.csv; ln -s data/ground_truth.csv rel_link.csv")
    assert "892,1" not in shell(backend, "cat host_link.csv rel_link.csv 2>&1")
    found = shell(backend, "python -c \"print(open('data/ground_truth.csv').read())\" 2>&1")
    assert "892,1" not in found and "No such file" in found, found
    assert (backend.host_workspace / "data" / "test.csv").is_file()  # the rest of the dataset is there


def test_copying_what_the_agent_finds_buys_nothing_and_honest_work_scores(backend):
    shell(backend, "cp data/ground_truth.csv submission.csv 2>/dev/null; ln -sf data/ground_truth.csv submission.csv")
    observation, score = validate(backend)
    assert score is None or score["accuracy"] < 1.0, observation
    # an honest submission (everyone died) scores 6/10: the evaluator does read the ground truth
    shell(backend, f"rm -f submission.csv; printf '{rows(set())}' > submission.csv")
    observation, score = validate(backend)
    assert score == {"accuracy": pytest.approx(0.6)}, observation
    assert "ground_truth" not in shell(backend, "ls data")  # and the evaluation put nothing back


def env_step(env, td, command: str):
    """Step the chain with a response that runs ``command``; returns (the step's output, the next input)."""
    td.set(env.base_env.layout.response, fenced("Let me do this.", command))
    td = env.step(td)
    return td["next"], env.step_mdp(td)


def test_env_step_rewards_titanic_whose_baseline_says_Accuracy(titanic):
    """The evaluator prints accuracy, the baseline says Accuracy: the same metric, as the reward reads names (every
    row scored, as MLGym does, so that one wrong row of ten is an accuracy of 0.9)."""
    env = fresh().make("mlgym/titanicSurvival", batch_size=(), validation_rows="all")
    try:
        td = env.reset()
        _, td = env_step(env, td, f"printf '{rows(SURVIVED - {892})}' > submission.csv")
        out, td = env_step(env, td, "validate")
        assert env.base_env.last_info[EVALUATION_STATUS_KEY] == "ok"
        assert float(out[env.base_env.layout.reward].sum()) == pytest.approx(0.9 - 0.5)
    finally:
        env.close()


MISMATCH = TITANIC.replace("Accuracy: 0.5", "acc: 0.4").replace("id: titanicSurvival", "id: mismatchTask")


def test_a_priority_metric_the_baseline_lacks_is_refused_at_make_and_in_check(titanic):
    write(titanic / "configs/tasks/mismatch.yaml", MISMATCH + "priority_metric: accuracy\n")
    reg = fresh()
    with pytest.raises(InvalidTaskError) as caught:
        reg.make("mlgym/mismatchTask")
    message = str(caught.value)
    assert "'accuracy'" in message and "['acc']" in message and "priority_metric" in message
    report = check_task(reg.spec("mlgym/mismatchTask"), runs=1, raise_on_failure=False)
    assert not report.ok and any("'accuracy'" in p and "['acc']" in p for p in report.problems)


def test_an_evaluator_naming_its_metric_otherwise_is_an_infra_error_at_step(titanic):
    """The evaluator prints {"accuracy": ...}, the baseline names {"acc": ...}: not knowable before the evaluator
    runs; the scored step is the task's infra_error, with both sides named, and nothing raises."""
    # a submission among the starter files, so that `check` has something to evaluate
    write(titanic / "data/titanic/submission.csv", rows(set()))
    write(titanic / "configs/tasks/mismatch.yaml", MISMATCH.replace(
        "  - data/titanic/evaluate.py\n", "  - data/titanic/evaluate.py\n  - data/titanic/submission.csv\n"))
    reg = fresh()
    env = reg.make("mlgym/mismatchTask", batch_size=())
    try:
        td = env.reset()
        _, td = env_step(env, td, f"printf '{rows(set())}' > submission.csv")
        with pytest.warns(RuntimeWarning, match="cannot be compared"):
            out, td = env_step(env, td, "validate")
        info = env.base_env.last_info
        assert info[EVALUATION_STATUS_KEY] == INFRA_ERROR
        assert "['accuracy']" in info[EVALUATION_ERROR_KEY] and "['acc']" in info[EVALUATION_ERROR_KEY]
        assert float(out[env.base_env.layout.reward].sum()) == 0.0
        assert bool(out["infra_error"].all())
    finally:
        env.close()
    report = check_task(reg.spec("mlgym/mismatchTask"), runs=1, raise_on_failure=False)
    assert not report.ok and any("cannot be compared" in p for p in report.problems)


@pytest.mark.skipif(not os.environ.get("MLGYM_ROOT") or not Path(os.environ.get("MLGYM_ROOT", ""), "data/titanic/data",
                                                                 "ground_truth.csv").is_file(),
                    reason="needs MLGYM_ROOT at an MLGym checkout with titanic's data")
def test_the_real_titanic_hides_its_ground_truth():
    reg = fresh()
    spec = reg.spec("mlgym/titanicSurvival")
    assert "data/ground_truth.csv" in spec.secret_files
    backend = LocalBackend(spec, seed=0, python=sys.executable)  # nothing is evaluated: no pandas needed
    try:
        backend.reset()
        backend.install_tools()
        assert "PassengerId" not in shell(backend, "cat data/ground_truth.csv 2>&1")
        assert "ground_truth.csv" not in shell(backend, "find / -name ground_truth.csv 2>/dev/null | head")
        assert "test.csv" in shell(backend, "ls data")
    finally:
        backend.close()
