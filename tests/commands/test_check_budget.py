"""``check --budget``: a task's baseline pipeline (its training, then its evaluation) within the time the user gives,
saying plainly when the full baseline needs more, and never scoring a training cut short (``tests/rl_toy.py``'s
task, whose baseline program "trains" for as long as it is told)."""

from __future__ import annotations

from rl_toy import toy_spec

from mlgym_registry.testing import check_task


def test_a_baseline_that_finishes_within_the_budget_is_trained_then_scored(tmp_path):
    report = check_task(toy_spec(tmp_path / "task"), runs=1, raise_on_failure=False, budget=30)
    assert report.baseline_program.startswith("`python src/train.py`")
    assert len(report.runs) == 1 and 0.9 < report.runs[0].metrics["Reward Mean"] <= 1.0, report.problems
    assert any("--budget gives the baseline program 30 s" in warning for warning in report.warnings)


def test_a_training_cut_short_by_the_budget_is_never_scored(tmp_path):
    spec = toy_spec(tmp_path / "task", train_seconds=60, training_timeout=1800)
    report = check_task(spec, runs=2, raise_on_failure=False, budget=2)
    assert not report.runs and not report.ok
    problem = " ".join(report.problems)
    assert "did not finish within 2 s, so the baseline was not scored" in problem
    assert "may take up to 1800 s (the task's training_timeout" in problem
