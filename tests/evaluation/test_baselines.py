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


def test_the_script_still_runs_at_its_old_name_for_one_release():
    """``python -m mlgym_registry.tasks.baselines`` runs the script that moved to ``evaluation``, and says so."""
    result = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "mlgym_registry.tasks.baselines",
                             "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "python -m mlgym_registry.evaluation.baselines" in result.stdout
    assert "moved to mlgym_registry.evaluation.baselines" in result.stderr
