"""The baselines script: recomputing the recorded baseline scores of our own suite (``evaluation.baselines``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlgym_registry.evaluation import baselines
from mlgym_registry.specs import load_task_yaml
from mlgym_registry.tasks.suite import TASKS_DIR


def test_write_baseline_replaces_only_the_block(tmp_path):
    path = tmp_path / "task.yaml"
    source = (TASKS_DIR / "houseRegression.yaml").read_text()
    path.write_text(source)
    baselines.write_baseline(path, {"rmse": 1.5, "r2": 0.25})
    updated = path.read_text()
    assert load_task_yaml(path).baseline_scores == [{"rmse": 1.5, "r2": 0.25}]
    before, after = source.split("baseline_scores:")[0], source.split("evaluation_paths:")[1]
    assert updated.startswith(before) and updated.endswith(after)


def test_baselines_script_runs_the_starter_code(task_cache, capsys):
    assert baselines.main(["--seeds", "2", "prisonersDilemma", "houseRegression"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("prisonersDilemma: Score 2.3") and "over 2 seeds" in out[0]
    assert out[1].startswith("houseRegression: rmse ") and "r2 0.8" in out[1]


def test_summarise():
    summary = baselines.summarise([{"Score": 1.0}, {"Score": 3.0}])
    assert summary == {"Score": (2.0, pytest.approx(2**0.5))}


def test_the_script_runs_at_its_name_and_no_longer_at_its_old_one():
    """``python -m mlgym_registry.evaluation.baselines`` runs the script; its old name went with the 0.1 import-path
    shims (CHANGELOG.md)."""
    result = subprocess.run([sys.executable, "-m", "mlgym_registry.evaluation.baselines", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "python -m mlgym_registry.evaluation.baselines" in result.stdout
    old = subprocess.run([sys.executable, "-m", "mlgym_registry.tasks.baselines", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert old.returncode != 0 and "No module named mlgym_registry.tasks.baselines" in old.stderr
