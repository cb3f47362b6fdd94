"""Our own task suite: task files, starter code, evaluators and baselines (the baselines script: tests/evaluation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlgym_registry import Registry, TaskSpec
from mlgym_registry.specs import load_task_yaml
from mlgym_registry.tasks import housing
from mlgym_registry.tasks.suite import TASKS_DIR
from mlgym_registry.tasks.workspace import stage_workspace

GAMES = ["prisonersDilemma", "battleOfSexes", "blotto"]
SUITE = GAMES + ["houseRegression"]
TRAINING = ["capitals"]  # our own tiny tasks for training smoke tests (tests/tasks/test_capitals.py)
HEAVY_MODULES = ("numpy", "torch", "torchrl", "tensordict")


@pytest.fixture(scope="module")
def reg(task_cache):
    return Registry()


def stage(reg: Registry, name: str, folder: Path) -> tuple[TaskSpec, Path]:
    spec = reg.spec(name)
    return spec, stage_workspace(spec, folder / name)


def run_evaluator(spec: TaskSpec, workspace: Path, seed: int | None = 0) -> subprocess.CompletedProcess:
    """Run the evaluator the way the backends do: `python evaluate.py ...` from the workspace, with `seed` as the
    evaluation seed the backend would derive (MLGYM_REGISTRY_EVAL_SEED)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLGYM_REGISTRY_SEED", "MLGYM_REGISTRY_EVAL_SEED")}
    if seed is not None:
        env["MLGYM_REGISTRY_EVAL_SEED"] = str(seed)
    args = ["--submission_file", "submission.csv"] if spec.task_entrypoint == "CSVSubmissionTasks" else []
    return subprocess.run(
        [sys.executable, spec.evaluation_paths[0], *args], cwd=workspace, env=env, capture_output=True, text=True
    )


def score(spec: TaskSpec, workspace: Path, seed: int | None = 0) -> dict[str, float]:
    result = run_evaluator(spec, workspace, seed)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout  # MLGym parses the whole output as one JSON dict
    return json.loads(lines[0])


def write_strategy(workspace: Path, body: str) -> None:
    (workspace / "strategy.py").write_text(f"def row_strategy(history):\n    {body}\n")


# -- registration and task files ---------------------------------------------------------------------------------


def test_every_task_file_is_registered_by_its_id(reg):
    ids = {load_task_yaml(path).id for path in TASKS_DIR.glob("*.yaml")}
    assert ids == set(SUITE + TRAINING)
    rows = {row.name: row for row in reg.describe("task")}
    for name in SUITE + TRAINING:
        assert rows[name].distribution == "mlgym-registry"
        assert rows[name].description and "\n" not in rows[name].description


def test_listing_reads_no_heavy_module():
    code = (
        "import sys\nfrom mlgym_registry import registry\nnames = registry.names('task')\n"
        "registry.spec('prisonersDilemma')\n"
        f"print(names, [m for m in {HEAVY_MODULES!r} if m in sys.modules])"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLGYM_ROOT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip().endswith("[]"), out
    assert all(name in out for name in SUITE)


@pytest.mark.parametrize("name", SUITE)
def test_task_spec_and_files(reg, name):
    spec = reg.spec(name)
    assert spec.id == name and spec.name and spec.max_steps == 50 and spec.backend == "local"
    assert spec.training_timeout == 1800 and spec.use_generic_conda and spec.evaluation_read_only
    assert spec.evaluation_paths == ["evaluate.py"]
    staged = {Path(item).name for item in spec.starter_code}
    for item in spec.starter_code:
        assert spec.resolve_path(item).is_file(), item
    assert "evaluate.py" in staged and spec.baseline_paths[0] in staged
    assert spec.baseline and all(isinstance(v, float) for v in spec.baseline.values())
    text = spec.description
    assert "validate" in text and "submit" in text
    # MLGym formats the description with dataset_docs only: no other braces may appear
    assert text.replace("{dataset_docs}", "").count("{") == 0
    assert TaskSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("name", GAMES)
def test_games_protect_the_opponent(reg, name):
    spec = reg.spec(name)
    assert spec.task_entrypoint == "PythonSubmissionTasks"
    assert spec.protected_files == ["target.py"]
    assert {Path(p).name for p in spec.starter_code} == {"strategy.py", "target.py", "evaluate.py"}
    assert "strategy.py" in spec.description and "row_strategy(history)" in spec.description


# -- game evaluators ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["prisonersDilemma", "battleOfSexes"])
def test_game_evaluator_is_deterministic_when_seeded(reg, tmp_path, name):
    spec, workspace = stage(reg, name, tmp_path)
    first, again, other = score(spec, workspace, 7), score(spec, workspace, 7), score(spec, workspace, 8)
    assert set(first) == {"Score"}
    assert first == again
    assert first != other
    # the recorded baseline is the mean over seeds; a single run is within a few standard deviations (~0.005)
    assert abs(first["Score"] - spec.baseline["Score"]) < 0.03


@pytest.mark.slow
def test_blotto_evaluator_is_deterministic_and_matches_its_baseline(reg, tmp_path):
    spec, workspace = stage(reg, "blotto", tmp_path)
    first, again = score(spec, workspace, 3), score(spec, workspace, 3)
    assert first == again
    assert abs(first["Score"] - spec.baseline["Score"]) < 0.02


def test_seed_covers_numpy_and_import_time_randomness(reg, tmp_path):
    spec, workspace = stage(reg, "prisonersDilemma", tmp_path)
    (workspace / "strategy.py").write_text(
        "import random\nimport numpy as np\nBIAS = random.random()\n"
        "def row_strategy(history):\n    return int(np.random.random() < BIAS)\n"
    )
    assert score(spec, workspace, 11) == score(spec, workspace, 11)


def test_unseeded_runs_differ(reg, tmp_path):
    spec, workspace = stage(reg, "prisonersDilemma", tmp_path)
    assert score(spec, workspace, None) != score(spec, workspace, None)


@pytest.mark.parametrize(
    ("name", "body", "expected"),
    [
        ("prisonersDilemma", "return 1", 2.63),  # always defect: about what the best agents reach in MLGym
        ("battleOfSexes", "return 0", 1.44),  # the partner follows your opening 80% of the time: 0.9 * 0.8 * 2
        ("blotto", "return [0, 0, 30, 30, 30, 30]", 0.25),
    ],
)
def test_better_strategies_beat_the_baseline(reg, tmp_path, name, body, expected):
    spec, workspace = stage(reg, name, tmp_path)
    write_strategy(workspace, body)
    result = score(spec, workspace, 1)["Score"]
    assert result == pytest.approx(expected, abs=0.03)
    assert result > spec.baseline["Score"] + 0.2


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("prisonersDilemma", "return 2", "a move must be 0 (cooperate) or 1 (defect)"),
        ("prisonersDilemma", "return '1'", "a move must be 0 (cooperate) or 1 (defect)"),
        ("battleOfSexes", "return None", "a move must be 0 or 1"),
        ("blotto", "return [60, 60, 10, 0, 0, 0]", "at most 120 are available"),
        ("blotto", "return [20, 20, 20, 20, 20]", "one per battlefield, 6"),
        ("blotto", "return [20.5, 20, 20, 20, 20, 19.5]", "non-negative integers"),
        ("blotto", "return [-10, 50, 20, 20, 20, 20]", "non-negative integers"),
    ],
)
def test_invalid_moves_raise_a_clear_error(reg, tmp_path, name, body, message):
    spec, workspace = stage(reg, name, tmp_path)
    write_strategy(workspace, body)
    result = run_evaluator(spec, workspace)
    assert result.returncode != 0
    assert result.stdout == ""  # nothing that parses as a score
    assert "row_strategy" in result.stderr and message in result.stderr


def test_game_strategy_cannot_rewrite_the_shared_history(reg, tmp_path):
    spec, workspace = stage(reg, "prisonersDilemma", tmp_path)
    honest = score(spec, workspace, 5)["Score"]
    # a strategy that rewrites past rounds to look cooperative to grudge-holding partners gains nothing
    write_strategy(workspace, "history[:] = [(0, 0)] * len(history)\n    return 1")
    cheating = score(spec, workspace, 5)["Score"]
    write_strategy(workspace, "return 1")
    assert cheating == score(spec, workspace, 5)["Score"]
    assert honest != cheating


# -- the CSV-submission task -------------------------------------------------------------------------------------


def test_house_data_is_generated_once_into_the_cache(reg, task_cache):
    spec = reg.spec("houseRegression")
    folder = Path(spec.datasets[0]["data_path"])
    assert folder.is_relative_to(task_cache) and spec.datasets[0]["is_local"]
    names = {"train.csv", "validation.csv", "test.csv", "answer.csv", "sample_submission.csv"}
    assert {p.name for p in folder.iterdir()} == names
    assert Path(spec.sample_submission).parent == folder
    stamp = (folder / "train.csv").stat().st_mtime_ns
    assert housing.data_dir() == folder and (folder / "train.csv").stat().st_mtime_ns == stamp
    train = (folder / "train.csv").read_text().splitlines()
    assert len(train) == housing.SPLITS["train"] + 1 and train[0].endswith(",Price")
    assert "Price" not in (folder / "test.csv").read_text().splitlines()[0]
    assert spec.secret_files == ["data/answer.csv"]


def test_house_data_is_a_pure_function_of_the_seed(tmp_path):
    housing.write_dataset(tmp_path / "a")
    housing.write_dataset(tmp_path / "b")
    housing.write_dataset(tmp_path / "c", seed=housing.SEED + 1)
    for name in ("train.csv", "test.csv", "answer.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


def test_house_baseline_and_evaluator(reg, tmp_path):
    spec, workspace = stage(reg, "houseRegression", tmp_path)
    assert (workspace / "data" / "train.csv").is_file()
    subprocess.run([sys.executable, spec.baseline_paths[0]], cwd=workspace, check=True, capture_output=True)
    metrics = score(spec, workspace)
    assert list(metrics) == ["rmse", "r2"]
    assert metrics == pytest.approx(spec.baseline, rel=1e-4)
    assert 0.7 < metrics["r2"] < 0.9


def test_house_better_model_beats_the_baseline(reg, tmp_path):
    spec, workspace = stage(reg, "houseRegression", tmp_path)
    (workspace / "better.py").write_text(
        "import csv\nimport numpy as np\n"
        "def rows(name):\n    return list(csv.DictReader(open(f'data/{name}.csv')))\n"
        "train, test = rows('train'), rows('test')\nhoods = sorted({r['Neighbourhood'] for r in train})\n"
        "def features(r):\n"
        "    liv, q, year = np.log(float(r['LivingArea'])), float(r['Quality']), float(r['YearBuilt'])\n"
        "    lot = np.log(float(r['LotArea'] or 7500))\n"
        "    return [1, liv, lot, q, q * liv, float(r['Bathrooms']), float(r['GarageCars']), float(r['HasPool']),\n"
        "            min(2024 - year, 90), year < 1925, float(r['DistanceKm'])] + \\\n"
        "           [r['Neighbourhood'] == h for h in hoods]\n"
        "w = np.linalg.lstsq(np.array([features(r) for r in train], dtype=float),\n"
        "                    np.log([float(r['Price']) for r in train]), rcond=None)[0]\n"
        "with open('submission.csv', 'w') as out:\n    out.write('Id,Price\\n')\n"
        "    for r in test:\n        out.write(f\"{r['Id']},{np.exp(np.array(features(r), dtype=float) @ w)}\\n\")\n"
    )
    subprocess.run([sys.executable, "better.py"], cwd=workspace, check=True, capture_output=True)
    metrics = score(spec, workspace)
    assert metrics["r2"] > spec.baseline["r2"] + 0.08
    assert metrics["rmse"] < 0.7 * spec.baseline["rmse"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("Id,Value\n1,2\n", "columns Id and Price"),
        ("Id,Price\n1001,abc\n", "is not a number"),
        ("Id,Price\n1001,5\n", "missing"),
    ],
)
def test_house_evaluator_rejects_bad_submissions(reg, tmp_path, content, message):
    spec, workspace = stage(reg, "houseRegression", tmp_path)
    if content is not None:
        (workspace / "submission.csv").write_text(content)
    result = run_evaluator(spec, workspace)
    assert result.returncode != 0 and result.stdout == ""
    assert message in result.stderr


def test_house_sample_submission_is_valid(reg, tmp_path):
    spec, workspace = stage(reg, "houseRegression", tmp_path)
    (workspace / "submission.csv").write_bytes(Path(spec.sample_submission).read_bytes())
    metrics = score(spec, workspace)
    assert metrics["r2"] < 0.05  # a constant guess explains (almost) nothing
