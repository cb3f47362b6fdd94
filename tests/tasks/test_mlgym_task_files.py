"""A task file that lies in an MLGym checkout is read the way MLGym reads it (its paths relative to the checkout's
root, not to the file), by every command that takes a task file and by ``registry.make(path)``; a task file
elsewhere keeps our rule (paths relative to the file)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from mlgym_registry import registry
from mlgym_registry.tasks.mlgym_source import checkout_of

PACKAGE_DATA = Path(registry.spec("prisonersDilemma").source).parent / "data" / "prisonersDilemma"

TASK = """\
id: toyDilemma
name: Toy Dilemma
description: Play the iterated prisoner's dilemma; edit strategy.py.
task_entrypoint: PythonSubmissionTasks
training_timeout: 120
use_generic_conda: true
starter_code:
- data/toyDilemma/target.py
- data/toyDilemma/evaluate.py
- data/toyDilemma/strategy.py
baseline_paths:
- evaluate.py
baseline_scores:
- Score: 2.376
evaluation_paths:
- evaluate.py
"""


@pytest.fixture
def task_file(tmp_path, monkeypatch) -> Path:
    """``configs/tasks/toyDilemma.yaml`` of an MLGym-shaped checkout (not $MLGYM_ROOT: the user names the file)."""
    monkeypatch.delenv("MLGYM_ROOT", raising=False)
    root = tmp_path / "MLGym"
    (root / "configs" / "tasks").mkdir(parents=True)
    shutil.copytree(PACKAGE_DATA, root / "data" / "toyDilemma")
    path = root / "configs" / "tasks" / "toyDilemma.yaml"
    path.write_text(TASK)
    return path


def test_the_spec_of_a_checkout_file_resolves_its_paths_from_the_checkout_root(task_file):
    root = task_file.parents[2]
    assert checkout_of(task_file) == root
    spec = registry.spec(task_file)
    assert Path(spec.root) == root and "mlgym" in spec.tags
    assert all(spec.resolve_path(path).is_file() for path in spec.starter_code)
    env = registry.make(str(task_file), max_steps=3)
    try:
        td = env.reset()
        assert td["query"] == "toyDilemma"
    finally:
        env.close()


def test_a_task_file_outside_a_checkout_keeps_paths_relative_to_itself(tmp_path):
    folder = tmp_path / "mine"
    shutil.copytree(PACKAGE_DATA, folder / "data" / "toyDilemma")
    (folder / "toyDilemma.yaml").write_text(TASK)
    assert checkout_of(folder / "toyDilemma.yaml") is None
    spec = registry.spec(folder / "toyDilemma.yaml")
    assert Path(spec.root) == folder and all(spec.resolve_path(p).is_file() for p in spec.starter_code)


@pytest.mark.slow
def test_every_command_that_takes_a_task_file_reads_a_checkout_file_as_mlgym_does(task_file, tmp_path):
    done = run_cli("info", str(task_file), "--json")
    assert done.returncode == 0 and str(task_file.parents[2]) in done.stdout, done.stderr
    done = run_cli("run", str(task_file), "--policy", "scripted", "--max-steps", "3", "--seed", "0",
                   "--out", str(tmp_path / "run"), "--quiet", timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "toyDilemma.traj").is_file()
    done = run_cli("check", str(task_file), "--runs", "1", timeout=300)
    assert "starter files missing" not in done.stdout and "evaluator run (seed 0)" in done.stdout, done.stdout
    done = run_cli("bench", str(task_file), "--policy", "scripted", "--runs", "1", "--max-steps", "2",
                   "--out", str(tmp_path / "bench"), timeout=300)
    assert done.returncode == 0, done.stderr
    done = run_cli("prepare", str(task_file), timeout=300)
    assert done.returncode == 0 and "does not exist" not in done.stderr, done.stderr
