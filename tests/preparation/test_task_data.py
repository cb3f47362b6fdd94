"""Where tasks find their data (a data folder, then the task's root), how a task makes data its repository does not
ship (``prepare_data``), how ``check`` reproduces a published baseline, and the refusals: a dataset that is nowhere,
a Hugging Face dataset the local backend cannot serve, GPUs on a host without any."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import fresh_registry as fresh
from conftest import write

from mlgym_registry import TaskFilesMissing
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.local import sandbox as sandbox_mod
from mlgym_registry.backends.local.data_script import run_data_script
from mlgym_registry.errors import BackendUnavailable
from mlgym_registry.preparation.datasets import DATA_ENV, data_folders, prepare_data
from mlgym_registry.testing import check_task, run_evaluator

TASK = """\
id: splitTask
name: Predict y
description: Predict y for data/test.csv; write submission.csv (id, y).
task_entrypoint: CSVSubmissionTasks
training_timeout: 120
starter_code:
  - data/splitTask/baseline.py
  - data/splitTask/evaluate.py
dataset_configs:
  - datasets/split.yaml
baseline_paths:
  - baseline.py
baseline_scores:
  - Error: 2.5
evaluation_paths:
  - evaluate.py
"""

DATASET = """\
name: splitData
description: rows of x and y
data_path: data/splitTask/data
is_local: true
"""

# writes ../data/{train,test,answer}.csv from its own rows, as a repository's helper script that splits a dataset
SPLIT = """\
import os
os.makedirs("../data", exist_ok=True)
rows = [(i, 2 * i + 1) for i in range(10)]
with open("../data/train.csv", "w") as f:
    f.write("id,x,y\\n" + "".join(f"{i},{i},{y}\\n" for i, y in rows[:6]))
with open("../data/test.csv", "w") as f:
    f.write("id,x\\n" + "".join(f"{i},{i}\\n" for i, _ in rows[6:]))
with open("../data/answer.csv", "w") as f:
    f.write("id,y\\n" + "".join(f"{i},{y}\\n" for i, y in rows[6:]))
"""

# the baseline predicts the mean y of the training rows (7.0 here)
BASELINE = """\
import csv
train = list(csv.DictReader(open("data/train.csv")))
mean = sum(float(r["y"]) for r in train) / len(train)
with open("submission.csv", "w") as f:
    f.write("id,y\\n" + "".join(f"{r['id']},{mean}\\n" for r in csv.DictReader(open("data/test.csv"))))
"""

# mean absolute error against the answers, which only the evaluator may read
EVALUATE = """\
import argparse, csv, json
parser = argparse.ArgumentParser()
parser.add_argument("--submission_file")
args = parser.parse_args()
truth = {r["id"]: float(r["y"]) for r in csv.DictReader(open("data/answer.csv"))}
guess = {r["id"]: float(r["y"]) for r in csv.DictReader(open(args.submission_file))}
print(json.dumps({"Error": sum(abs(guess[k] - v) for k, v in truth.items()) / len(truth)}))
"""
# the baseline's error: answers 13, 15, 17, 19 against 6.0 (the mean of 1, 3, ..., 11): 7, 9, 11, 13 -> 10.0


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """An MLGym-shaped checkout whose task ships a split script but not the split, with our kind of recipe."""
    root = tmp_path / "MLGym"
    write(root / "configs/tasks/splitTask.yaml", TASK.replace("Error: 2.5", "Error: 10.0") + (
        "secret_files:\n  - data/answer.csv\n"
        "prepare_data:\n  script: data/splitTask/_helpers/split.py\n  output: data/splitTask/data\n"))
    write(root / "configs/datasets/split.yaml", DATASET)
    write(root / "data/splitTask/_helpers/split.py", SPLIT)
    write(root / "data/splitTask/baseline.py", BASELINE)
    write(root / "data/splitTask/evaluate.py", EVALUATE)
    monkeypatch.setenv("MLGYM_ROOT", str(root))
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data-folder"))
    return root


def test_a_missing_dataset_is_refused_at_make_naming_every_place_and_the_command(checkout, tmp_path):
    with pytest.raises(TaskFilesMissing) as caught:
        fresh().make("mlgym/splitTask")
    message = str(caught.value)
    assert str(tmp_path / "data-folder" / "data/splitTask/data") in message
    assert str(checkout / "data/splitTask/data") in message
    assert "mlgym-registry prepare mlgym/splitTask" in message


def test_prepare_data_makes_the_split_in_the_data_folder_and_never_in_the_checkout(checkout, tmp_path):
    import sys

    spec = fresh().spec("mlgym/splitTask")
    made = prepare_data(spec, sys.executable, run_script=run_data_script, echo=lambda line: None)
    assert made == tmp_path / "data-folder" / "data/splitTask/data"
    assert sorted(p.name for p in made.iterdir()) == ["answer.csv", "test.csv", "train.csv"]
    assert not (checkout / "data/splitTask/data").exists()
    again = prepare_data(spec, sys.executable, run_script=run_data_script, echo=lambda line: None)
    assert again == made  # present: not made again


def test_the_agent_sees_the_prepared_data_less_its_answers_and_the_baseline_is_reproduced(checkout):
    import sys

    spec = fresh().spec("mlgym/splitTask")
    prepare_data(spec, sys.executable, run_script=run_data_script, echo=lambda line: None)
    backend = LocalBackend(spec, seed=0)
    try:
        backend.reset()
        backend.install_tools()
        assert backend.communicate("ls data").split() == ["test.csv", "train.csv"]
        assert "answer" not in backend.communicate("find / -name 'answer*' 2>/dev/null | head")
    finally:
        backend.close()
    assert run_evaluator(spec, seed=0) == {"Error": pytest.approx(10.0)}
    report = check_task(spec, runs=1, raise_on_failure=False)
    assert report.ok and not report.known_differences, report.problems
    assert any(note.startswith("Error: recorded 10") for note in report.notes)


def test_a_data_folder_wins_over_the_checkout_so_users_can_bring_real_labels(checkout, tmp_path):
    import sys

    spec = fresh().spec("mlgym/splitTask")
    prepare_data(spec, sys.executable, run_script=run_data_script, echo=lambda line: None)
    mine = tmp_path / "mine" / "data/splitTask/data"
    mine.mkdir(parents=True)
    for name in ("train.csv", "test.csv"):
        (mine / name).write_text((tmp_path / "data-folder/data/splitTask/data" / name).read_text())
    (mine / "answer.csv").write_text("id,y\n6,6\n7,6\n8,6\n9,6\n")  # the baseline's own predictions: error 0
    assert data_folders(str(tmp_path / "mine"))[0] == tmp_path / "mine"
    assert run_evaluator(spec, seed=0, backend_options={"data_dir": str(tmp_path / "mine")}) == {"Error": 0.0}


def test_a_data_folder_holding_other_data_at_the_same_path_is_not_taken_for_a_shipped_dataset(tmp_path):
    from mlgym_registry.preparation.datasets import find_local_dataset
    from mlgym_registry.specs import TaskSpec

    own = tmp_path / "task" / "data"
    own.mkdir(parents=True)
    (own / "answer.csv").write_text("id,label\n1,0\n")
    dataset = {"name": "labels", "data_path": "data", "is_local": True}
    spec = TaskSpec(id="ships", task_entrypoint="CSVSubmissionTasks", root=str(tmp_path / "task"), datasets=[dataset])
    suite = tmp_path / "suite-data"
    (suite / "data" / "otherTask" / "data").mkdir(parents=True)  # what prepare leaves for MLGym's tasks
    assert find_local_dataset(spec, dataset, str(suite)) == own
    (suite / "data" / "answer.csv").write_text("id,label\n1,1\n")  # a complete copy of the dataset wins
    assert find_local_dataset(spec, dataset, str(suite)) == suite / "data"


def test_a_stated_cause_makes_a_baseline_difference_known_not_a_problem(checkout):
    import sys

    reg = fresh()
    spec = reg.spec("mlgym/splitTask")
    prepare_data(spec, sys.executable, run_script=run_data_script, echo=lambda line: None)
    off = spec.replace(baseline_scores=[{"Error": 3.0}])
    report = check_task(off, runs=2, raise_on_failure=False)  # two runs: a spread (0 here) to judge by
    assert not report.ok and "baseline does not match: Error: recorded 3" in report.problems[0]
    explained = off.replace(extra={**off.extra, "baseline_note": "the published run used other data"})
    report = check_task(explained, runs=2, raise_on_failure=False)
    assert report.ok and "the published run used other data" in report.known_differences[0]
    command = explained.replace(extra={**explained.extra, "baseline_command": "printf 'id,y\\n6,13\\n7,15\\n8,17\\n"
                                                                              "9,19\\n' > submission.csv"})
    assert run_evaluator(command, seed=0) == {"Error": 0.0}  # the task's own baseline program, not baseline.py


def test_a_hugging_face_dataset_without_declared_answers_is_refused_at_make_by_the_local_backend(tmp_path,
                                                                                                monkeypatch):
    root = tmp_path / "MLGym"
    write(root / "configs/tasks/hub.yaml", TASK.replace("splitTask", "hubTask").replace("split.yaml", "hub.yaml"))
    write(root / "configs/datasets/hub.yaml", "name: hub\ndescription: images\ndata_path: someone/images\n"
                                              "is_local: false\n")
    write(root / "data/hubTask/baseline.py", BASELINE)
    write(root / "data/hubTask/evaluate.py", EVALUATE)
    monkeypatch.setenv("MLGYM_ROOT", str(root))
    with pytest.raises(TaskFilesMissing, match="'someone/images' by name and does not say which of its splits"):
        fresh().make("mlgym/hubTask")


@pytest.mark.skipif(bool(sandbox_mod.gpu_devices()), reason="this host has NVIDIA devices")
def test_gpus_on_a_host_without_any_is_a_clear_error():
    with pytest.raises(BackendUnavailable, match=r"gpus=True.*/dev/nvidia"):
        fresh().make("prisonersDilemma", gpus=True)


@pytest.mark.skipif(not sandbox_mod.gpu_devices(), reason="needs a host with NVIDIA devices")
def test_gpus_shows_the_devices_to_the_sandbox():
    env = fresh().make("prisonersDilemma", gpus=True)
    try:
        env.reset()
        backend = env.base_env.backend
        listing = backend.communicate("ls /dev")
        assert all(Path(device).name in listing for device in sandbox_mod.gpu_devices() if "/" not in
                   device.removeprefix("/dev/"))
    finally:
        env.close()


@pytest.mark.skipif(not os.environ.get("MLGYM_ROOT"), reason="needs MLGYM_ROOT at an MLGym checkout")
def test_the_real_kaggle_task_has_a_recipe_and_hides_its_answers():
    spec = fresh().spec("mlgym/regressionKaggleHousePrice")
    assert spec.extra["prepare_data"]["output"] == "data/regressionKaggleHousePrice/data"
    assert "data/answer.csv" in spec.secret_files


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MLGYM_ROOT") or not Path(os.environ.get("MLGYM_ROOT", ""),
                    "data/regressionKaggleHousePrice/_helpers/train.csv").is_file(),
                    reason="needs MLGYM_ROOT at an MLGym checkout with the Kaggle house-price helper data")
def test_the_real_ml_tasks_prepared_reproduce_or_explain_their_published_baselines(tmp_path, monkeypatch):
    from mlgym_registry import MissingTaskPackages, prepare

    monkeypatch.setenv("MLGYM_REGISTRY_ENVS", str(tmp_path / "envs"))
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data"))
    reg = fresh()
    with pytest.raises(MissingTaskPackages, match="mlgym-registry prepare mlgym/regressionKaggleHousePrice"):
        reg.make("mlgym/regressionKaggleHousePrice")
    python = prepare("mlgym/regressionKaggleHousePrice", echo=lambda line: None)
    assert python == prepare("mlgym/titanicSurvival", echo=lambda line: None)  # one environment for the same set
    kaggle = reg.spec("mlgym/regressionKaggleHousePrice")
    assert (tmp_path / "data/data/regressionKaggleHousePrice/data/answer.csv").is_file()
    report = check_task(kaggle, runs=1, raise_on_failure=False)
    assert report.ok and not report.known_differences, report.problems
    assert run_evaluator(kaggle, seed=0) == {"rmse": pytest.approx(30340.111853413255, rel=1e-9),
                                             "r2": pytest.approx(0.8799891474739243, rel=1e-9)}
    titanic = check_task(reg.spec("mlgym/titanicSurvival"), runs=1, raise_on_failure=False)
    assert titanic.ok and "Kaggle's example submission" in titanic.known_differences[0]
    backend = LocalBackend(kaggle, seed=0)
    try:
        backend.reset()
        backend.install_tools()
        assert "answer" not in backend.communicate("ls data; find / -name 'answer*' 2>/dev/null | head")
        assert "SalePrice" not in backend.communicate(f"cat {tmp_path}/data/data/regressionKaggleHousePrice/data/"
                                                      "answer.csv 2>&1")
    finally:
        backend.close()
