"""Variants in an MLGym checkout: two task files declaring one id both stay reachable (the first under ``mlgym/<id>``,
the other under its file's name when that is free, both by their paths) with a warning naming both files; and
``check`` of a variant that names no baseline program (MLGym's ``...L1`` tasks) runs the program of the task it
derives from, saying which program it ran and which published scores it compared with."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from conftest import fresh_registry as fresh
from conftest import run_cli, write

from mlgym_registry.evaluation.evaluator_runs import recorded_baseline
from mlgym_registry.tasks.mlgym_source import DuplicateTaskIdWarning
from mlgym_registry.testing import check_task

RMSE = 27.85677655436824
"""The baseline's score: it predicts the mean of train.csv's y (5) for test.csv's houses, whose y are 21 and 41."""

HOUSE = """\
id: houseTask
name: House prices
description: Predict y for data/test.csv; write submission.csv (id, y).
dataset_configs:
- datasets/houseData.yaml
task_entrypoint: CSVSubmissionTasks
training_timeout: 120
starter_code:
- data/house/baseline.py
- data/house/evaluate.py
baseline_paths:
- baseline.py
baseline_scores:
- rmse: 27.85677655436824
evaluation_paths:
- evaluate.py
evaluation_read_only: true
"""
# the variant MLGym calls L1: the same evaluator and data, no baseline program among its files
HOUSE_L1 = (HOUSE.replace("id: houseTask", "id: houseTaskL1")
            .replace("- data/house/baseline.py\n", "").replace("baseline_paths:\n- baseline.py\n", ""))
# a variant that even reuses the id, as MLGym's imageClassificationCifar10L1.yaml does
HOUSE_SAME_ID = HOUSE_L1.replace("id: houseTaskL1", "id: houseTask").replace("House prices", "House prices, bare")

DATASET = """\
name: HouseData
description: houses and their y
data_path: data/house/data
is_local: true
"""
BASELINE = """\
import csv

ys = [float(row["y"]) for row in csv.DictReader(open("data/train.csv"))]
with open("submission.csv", "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow(["id", "y"])
    writer.writerows([row["id"], sum(ys) / len(ys)] for row in csv.DictReader(open("data/test.csv")))
"""
EVALUATE = """\
import csv, json, math, os

workspace = "/home/agent/workspace" if os.path.isdir("/home/agent/workspace") else os.getcwd()
truth = {row["id"]: float(row["y"]) for row in csv.DictReader(open(os.path.join(workspace, "data", "truth.csv")))}
guess = {row["id"]: float(row["y"]) for row in csv.DictReader(open(os.path.join(workspace, "submission.csv")))}
print(json.dumps({"rmse": math.sqrt(sum((guess[k] - y) ** 2 for k, y in truth.items()) / len(truth))}))
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """An MLGym-shaped checkout with a CSV task, its L1 variant and a variant reusing its id; MLGYM_ROOT at it."""
    root = tmp_path / "MLGym"
    write(root / "configs/tasks/houseTask.yaml", HOUSE)
    write(root / "configs/tasks/houseTaskL1.yaml", HOUSE_L1)
    write(root / "configs/tasks/houseTaskVariant.yaml", HOUSE_SAME_ID)
    write(root / "configs/datasets/houseData.yaml", DATASET)
    write(root / "data/house/baseline.py", BASELINE)
    write(root / "data/house/evaluate.py", EVALUATE)
    write(root / "data/house/data/train.csv", "id,x,y\n1,1,3\n2,2,5\n3,3,7\n")
    write(root / "data/house/data/test.csv", "id,x\n4,10\n5,20\n")
    write(root / "data/house/data/truth.csv", "id,y\n4,21\n5,41\n")
    monkeypatch.setenv("MLGYM_ROOT", str(root))
    return root


def task_file(root: Path, stem: str) -> Path:
    return (root / "configs" / "tasks" / f"{stem}.yaml").resolve()


def loaded():
    """A fresh registry and the DuplicateTaskIdWarnings its loading raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = fresh()
    return reg, [str(w.message) for w in caught if issubclass(w.category, DuplicateTaskIdWarning)]


def test_a_reused_id_is_warned_about_and_both_files_stay_reachable(checkout):
    reg, messages = loaded()
    [message] = messages
    assert "houseTask.yaml and houseTaskVariant.yaml" in message and "both declare id 'houseTask'" in message
    assert "mlgym/houseTask is houseTask.yaml's" in message
    assert "registered as mlgym/houseTaskVariant (its file's name)" in message
    assert str(task_file(checkout, "houseTaskVariant")) in message  # how to reach it by its path
    assert [n for n in reg.names("task") if n.startswith("mlgym/")] == [
        "mlgym/houseTask", "mlgym/houseTaskL1", "mlgym/houseTaskVariant"]

    first, variant = reg.spec("mlgym/houseTask"), reg.spec("mlgym/houseTaskVariant")
    assert first.source == str(task_file(checkout, "houseTask")) and first.name == "House prices"
    assert variant.source == str(task_file(checkout, "houseTaskVariant")) and variant.name == "House prices, bare"
    assert variant.id == "houseTask" and variant.starter_code == ["data/house/evaluate.py"]
    by_path = reg.spec(task_file(checkout, "houseTaskVariant"))
    assert by_path.source == variant.source and by_path.starter_code == variant.starter_code
    assert reg.spec(task_file(checkout, "houseTask")).starter_code == first.starter_code

    rows = {row.name: row for row in reg.describe("task")}
    assert rows["mlgym/houseTaskVariant"].description == (
        "House prices, bare (the variant in houseTaskVariant.yaml, which declares id 'houseTask')")
    assert rows["mlgym/houseTask"].meta == {"task_file": first.source, "id_also_declared_by": ["houseTaskVariant.yaml"]}
    assert "task_file" not in rows["mlgym/houseTaskL1"].meta  # an id of its own

    env = reg.make(str(task_file(checkout, "houseTaskVariant")), max_steps=2)
    try:
        env.reset()
        assert env.base_env.backend.spec.source == variant.source
    finally:
        env.close()


GAME = """\
id: {id}
name: {name}
description: Play; edit strategy.py.
task_entrypoint: PythonSubmissionTasks
starter_code:
- data/game/strategy.py
evaluation_paths:
- evaluate.py
"""


def test_a_variant_whose_file_name_is_another_tasks_id_is_reached_by_its_path(checkout):
    write(checkout / "configs/tasks/a.yaml", GAME.format(id="sharedId", name="A"))
    write(checkout / "configs/tasks/b.yaml", GAME.format(id="sharedId", name="B"))
    write(checkout / "configs/tasks/c.yaml", GAME.format(id="b", name="C"))
    write(checkout / "data/game/strategy.py", "def row_strategy(history):\n    return 0\n")
    reg, messages = loaded()
    [message] = [m for m in messages if "sharedId" in m]
    assert "a.yaml and b.yaml" in message and "mlgym/sharedId is a.yaml's" in message
    assert "mlgym/b (its file's name) is another task's id, so it has no name of its own" in message
    assert reg.spec("mlgym/sharedId").name == "A" and reg.spec("mlgym/b").name == "C"
    assert reg.spec(task_file(checkout, "b")).name == "B"


def test_check_of_a_variant_without_a_baseline_program_runs_the_one_it_derives_from(checkout):
    reg, _ = loaded()
    own = check_task(reg.spec("mlgym/houseTask"), runs=1, raise_on_failure=False)
    assert own.ok, own.problems
    assert own.baseline_program == "`python baseline.py` (the task's baseline program baseline.py)"

    report = check_task(reg.spec("mlgym/houseTaskL1"), runs=1, raise_on_failure=False)
    assert report.ok, report.problems
    assert report.runs[0].metrics == {"rmse": pytest.approx(RMSE, rel=1e-12)}
    assert report.baseline_program == (
        f"`python baseline.py` (data/house/baseline.py), borrowed from task 'houseTask' "
        f"({task_file(checkout, 'houseTask')}): this task names no baseline program, and that task has the same "
        "evaluator, datasets and task class")
    assert report.compared_with == (
        f"rmse {RMSE!r}: baseline_scores[0] of task 'houseTaskL1' ({task_file(checkout, 'houseTaskL1')})")
    assert any(line.startswith("rmse: recorded 27.8568, fresh 27.8568") for line in report.notes), report.notes

    # the variant reusing the id borrows from the task of that id; the variant itself is checked by its path
    same_id = check_task(task_file(checkout, "houseTaskVariant"), runs=1, raise_on_failure=False)
    assert same_id.ok, same_id.problems
    assert "borrowed from task 'houseTask'" in same_id.baseline_program


def test_a_published_score_the_borrowed_program_does_not_make_is_a_mismatch_naming_the_program(checkout):
    write(checkout / "configs/tasks/houseTaskL2.yaml", HOUSE_L1.replace("houseTaskL1", "houseTaskL2").replace(
        "rmse: 27.85677655436824", "rmse: 3.5"))
    reg, _ = loaded()
    report = check_task(reg.spec("mlgym/houseTaskL2"), runs=2, raise_on_failure=False)
    assert report.problems == [f"baseline does not match: rmse: recorded 3.5, fresh {RMSE:.6g} +/- 0 over 2 run(s) "
                               "(allowed difference 0.0035)"]
    assert "borrowed from task 'houseTask'" in report.baseline_program
    assert report.compared_with.startswith("rmse 3.5: baseline_scores[0] of task 'houseTaskL2'")


def test_a_task_without_a_baseline_program_or_a_task_to_borrow_from_says_so(checkout):
    write(checkout / "configs/tasks/lonely.yaml", HOUSE_L1.replace("houseTaskL1", "lonely").replace(
        "datasets/houseData.yaml", "datasets/lonelyData.yaml"))
    write(checkout / "configs/datasets/lonelyData.yaml", DATASET.replace("HouseData", "LonelyData"))
    from mlgym_registry.evaluation.evaluator_runs import baseline_run

    reg, _ = loaded()
    run = baseline_run(reg.spec("mlgym/lonely"))  # other datasets: not derived from houseTask
    assert run.command is None and run.description == "none: the starter code is scored as it is"


def test_the_compared_scores_name_the_metrics_our_overlay_adds(checkout):
    write(checkout / "configs/tasks/kaggle.yaml", HOUSE.replace("id: houseTask", "id: regressionKaggleHousePrice"))
    reg, _ = loaded()
    spec = reg.spec("mlgym/regressionKaggleHousePrice")
    assert recorded_baseline(spec) == (
        f"r2 0.8799891474739243, rmse {RMSE!r}: baseline_scores[0] of task 'regressionKaggleHousePrice' "
        f"({task_file(checkout, 'kaggle')}); r2 from our overlay (mlgym_overlay.BASELINE_METRICS), since the task "
        "file omits it")


@pytest.mark.slow
def test_the_check_command_prints_what_it_ran_and_compared(checkout):
    done = run_cli("check", "mlgym/houseTaskL1", "--runs", "1", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("  baseline program: `python baseline.py` (data/house/baseline.py), borrowed from task 'houseTask'"
            in done.stdout), done.stdout
    assert f"  compared with: rmse {RMSE!r}: baseline_scores[0] of task 'houseTaskL1'" in done.stdout
    assert "houseTaskVariant" not in done.stderr  # the reused id is shown by `info` and `list`, not on every command
    done = run_cli("check", "mlgym/houseTaskL1", "--runs", "1", "--json", timeout=300)
    report = json.loads(done.stdout)
    assert "borrowed from task 'houseTask'" in report["baseline_program"]
    assert report["compared_with"].startswith(f"rmse {RMSE!r}: baseline_scores[0] of task 'houseTaskL1'")
