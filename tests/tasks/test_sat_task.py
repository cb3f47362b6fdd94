"""MLGym's 3SATTime from a checkout: it runs once ``dataset.pkl`` is in a data folder, where the docs say, and a file
made by ``mlgym_registry.tasks.sat_instances`` (our generator, MLGym's format) plays an episode to a finite score;
without it ``make`` and ``prepare`` name the file, the folder it goes in and the command that makes it. The other data
MLGym's repository does not ship (COCO's, FineWeb's shards) is named with where it goes and where it comes from."""

from __future__ import annotations

import itertools
import math
import pickle
import re
from pathlib import Path

import pytest
from conftest import fresh_registry as fresh
from conftest import run_cli, write

from mlgym_registry.backends.protocol import EVALUATION_STATUS_KEY
from mlgym_registry.errors import TaskFilesMissing
from mlgym_registry.policies.base import fenced
from mlgym_registry.preparation.datasets import dataset_candidates, find_local_dataset, local_datasets
from mlgym_registry.tasks import sat_instances

TASK = """\
id: 3SATTime
name: 3 SAT Heuristic Generation
description: Improve heuristic_fn in heuristic.py, which picks the next variable and its value for a DPLL solver.
dataset_configs:
- datasets/3SAT.yaml
task_entrypoint: PythonSubmissionTasks
training_timeout: 120
use_generic_conda: true
starter_code:
- data/3SATTime/heuristic.py
- data/3SATTime/evaluate.py
- data/3SATTime/solver.py
baseline_paths:
- evaluate.py
baseline_scores:
- Time: 1.0
  Correct: 9
  Incorrect: 0
evaluation_paths:
- evaluate.py
evaluation_read_only: true
"""
DATASET = """\
data_path: data/3SATTime/data
description: Instances of 3 SAT problems.
is_local: true
name: 3 SAT Problem Dataset
"""
HEURISTIC = """\
def heuristic_fn(clauses, assignments):
    free = sorted({abs(lit) for clause in clauses for lit in clause if abs(lit) not in assignments})
    return (free[0], True) if free else (None, True)
"""
SOLVER = """\
def solve(clauses, heuristic, assignments=None):
    assignments = dict(assignments or {})
    open_clauses = [c for c in clauses if not any(assignments.get(abs(lit)) == (lit > 0) for lit in c)]
    if not open_clauses:
        return True
    if any(all(abs(lit) in assignments for lit in c) for c in open_clauses):
        return False
    variable, value = heuristic(open_clauses, assignments)
    if variable is None:
        return False
    return any(solve(clauses, heuristic, {**assignments, variable: choice}) for choice in (value, not value))
"""
# ours, in the spirit of MLGym's: time the solver with the agent's heuristic over the instances after the first
# three, and fail the run on a wrong verdict
EVALUATE = """\
import json, pickle, time
from heuristic import heuristic_fn
from solver import solve

instances = pickle.load(open("data/dataset.pkl", "rb"))
start, correct = time.time(), 0
for _, _, _, clauses, is_sat, _ in instances[3:]:
    if solve(clauses, heuristic_fn) != is_sat:
        print(json.dumps({"Time": 1e8, "Correct": correct, "Incorrect": 1}))
        raise SystemExit
    correct += 1
print(json.dumps({"Time": round(time.time() - start, 3), "Correct": correct, "Incorrect": 0}))
"""
COMMAND = "python -m mlgym_registry.tasks.sat_instances --out"


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """An MLGym-shaped checkout with a 3SATTime task of our own files and no instances; MLGYM_ROOT at it, and an
    empty data folder as $MLGYM_REGISTRY_DATA."""
    root = tmp_path / "MLGym"
    write(root / "configs/tasks/3SATTime.yaml", TASK)
    write(root / "configs/datasets/3SAT.yaml", DATASET)
    write(root / "data/3SATTime/heuristic.py", HEURISTIC)
    write(root / "data/3SATTime/solver.py", SOLVER)
    write(root / "data/3SATTime/evaluate.py", EVALUATE)
    monkeypatch.setenv("MLGYM_ROOT", str(root))
    monkeypatch.setenv("MLGYM_REGISTRY_DATA", str(tmp_path / "data-folder"))
    monkeypatch.setenv("MLGYM_REGISTRY_ENVS", str(tmp_path / "envs"))
    return root


def data_folder(checkout: Path) -> Path:
    """Where the instances go: the dataset's folder in $MLGYM_REGISTRY_DATA."""
    return checkout.parent / "data-folder" / "data/3SATTime/data"


def brute_force(clauses: list[list[int]], num_vars: int) -> bool:
    """Whether some assignment of the variables 1..num_vars satisfies every clause, trying them all."""
    return any(all(any(values[abs(lit) - 1] == (lit > 0) for lit in clause) for clause in clauses)
               for values in itertools.product((False, True), repeat=num_vars))


def test_the_dataset_is_declared_where_the_docs_say(checkout):
    spec = fresh().spec("mlgym/3SATTime")
    [dataset] = spec.datasets
    assert dataset["data_path"] == str(checkout / "data/3SATTime/data") and dataset["is_local"] is True
    assert spec.extra["data_files"] == ["dataset.pkl"]
    places = dataset_candidates(spec, dataset)
    assert places[0] == data_folder(checkout) and places[-1] == checkout / "data/3SATTime/data"
    assert spec.protected_files == ["solver.py"]  # the solver is the evaluator's, the heuristic the agent's


def test_the_generator_writes_mlgyms_format_with_true_verdicts_and_the_same_file_for_the_same_seed(tmp_path):
    assert sat_instances.main(["--out", str(tmp_path / "a"), "--count", "40", "--vars", "5", "--seed", "3"]) == 0
    sat_instances.main(["--out", str(tmp_path / "b"), "--count", "40", "--vars", "5", "--seed", "3"])
    sat_instances.main(["--out", str(tmp_path / "c"), "--count", "40", "--vars", "5", "--seed", "4"])
    written = (tmp_path / "a/dataset.pkl").read_bytes()
    assert written == (tmp_path / "b/dataset.pkl").read_bytes() != (tmp_path / "c/dataset.pkl").read_bytes()
    made = pickle.loads(written)
    assert isinstance(made, list) and [item[0] for item in made] == list(range(40))
    for index, num_vars, num_clauses, clauses, is_sat, solution in made:
        assert (num_vars, num_clauses, solution) == (5, 21, None) and len(clauses) == 21
        assert all(len({abs(lit) for lit in clause}) == 3 and all(1 <= abs(lit) <= 5 for lit in clause)
                   for clause in clauses)
        assert is_sat is brute_force(clauses, num_vars), index
    assert {item[4] for item in made} == {True, False}  # near the phase transition both verdicts occur


def test_without_its_data_make_names_the_file_the_folder_and_the_command(checkout):
    reg = fresh()
    with pytest.raises(TaskFilesMissing) as caught:
        reg.make("mlgym/3SATTime", batch_size=())
    message = str(caught.value)
    folder = data_folder(checkout)
    assert "'3 SAT Problem Dataset'" in message and "It must hold dataset.pkl" in message
    assert "data/dataset.pkl" in message and str(folder) in message
    assert f"{COMMAND} {folder} --count 1000 --vars 12 --seed 0" in message
    folder.mkdir(parents=True)  # an empty folder is not the data either
    with pytest.raises(TaskFilesMissing, match="it lacks dataset.pkl"):
        reg.make("mlgym/3SATTime", batch_size=())


def test_prepare_lists_the_missing_instances_as_a_data_blocker_and_exits_1(checkout):
    done = run_cli("prepare", "mlgym/3SATTime", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    blocked = [line for line in done.stderr.splitlines() if "still blocked by" in line]
    assert len(blocked) == 1 and "still blocked by data:" in blocked[0], done.stderr
    assert f"{COMMAND} {data_folder(checkout)}" in done.stderr and "dataset.pkl" in done.stderr


def env_step(env, td, command: str):
    """Step the chain with a response that runs ``command``; returns (the step's output, the next input)."""
    td.set(env.base_env.layout.response, fenced("Let me do this.", command))
    td = env.step(td)
    return td["next"], env.step_mdp(td)


def test_generated_instances_play_an_episode_to_a_finite_score(checkout):
    assert sat_instances.main(["--out", str(data_folder(checkout)), "--count", "12", "--vars", "6",
                               "--seed", "1"]) == 0
    env = fresh().make("mlgym/3SATTime", batch_size=())
    try:
        td = env.reset()
        _, td = env_step(env, td, "ls data")
        assert "dataset.pkl" in env.base_env.last_observation
        out, td = env_step(env, td, "validate")
        info = env.base_env.last_info
        assert info[EVALUATION_STATUS_KEY] == "ok", info
        score = info["score"][-1]
        assert score["Correct"] == 9 and score["Incorrect"] == 0 and math.isfinite(score["Time"])
        assert 0 <= score["Time"] < 60
        out, td = env_step(env, td, "submit")
        assert bool(out["done"].all())
        assert math.isfinite(float(out[env.base_env.layout.reward].sum()))
        assert env.base_env.last_info["score"][-1]["Correct"] == 9
    finally:
        env.close()


@pytest.mark.parametrize(("task_id", "named"), [
    ("imageCaptioningCOCO", ["train_images.parquet, val_images.parquet, train, val", "cocodataset.org"]),
    ("languageModelingFineWeb", ["fineweb10B/fineweb_train_*.bin, fineweb10B/fineweb_val_*.bin", "llm.c's format"]),
])
def test_coco_and_fineweb_name_the_files_they_lack_where_they_go_and_where_they_come_from(checkout, task_id, named):
    folder = f"data/{task_id}/data"
    write(checkout / f"configs/tasks/{task_id}.yaml", f"id: {task_id}\ndataset_configs: [datasets/{task_id}.yaml]\n"
          "task_entrypoint: CSVSubmissionTasks\nstarter_code: []\nevaluation_paths: [evaluate.py]\n")
    write(checkout / f"configs/datasets/{task_id}.yaml", f"name: TheData\ndata_path: {folder}\nis_local: true\n")
    spec = fresh().spec(f"mlgym/{task_id}")
    [dataset] = local_datasets(spec)
    goes = checkout.parent / "data-folder" / folder
    with pytest.raises(TaskFilesMissing) as caught:
        find_local_dataset(spec, dataset)
    message = str(caught.value)
    assert all(words in message for words in named) and f"in {goes}" in message, message
    write(goes / ("fineweb10B/fineweb_train_000001.bin" if "FineWeb" in task_id else "train_images.parquet"), "")
    with pytest.raises(TaskFilesMissing, match=re.escape(f"{goes} (there, but it lacks ")):
        find_local_dataset(spec, dataset)
