"""``mlgym-registry report``: MLGym's leaderboard tables over recorded runs.

A tiny tree built here (checked against numbers worked out by hand) and the recorded runs in ../shared. MLGym's rules
and the acceptance check against MLGym's published tables are in test_mlgym_tables.py.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
from outside_data import RECORDED, TRAJECTORIES, missing_recorded_runs

from mlgym_registry.cli import main as cli_main
from mlgym_registry.evaluation import metrics
from mlgym_registry.evaluation.report import build_report
from mlgym_registry.evaluation.runs import find_runs

GRID_STEP = 0.5 / 499  # the fixture's tau grid: 500 points from 0 to 0.5


def write_run(root: Path, model: str, task: str, run: int, results=None, exit_status="submitted", raw=None) -> Path:
    """One run in MLGym's layout; ``results`` (a dict) or ``raw`` (text) for results.json, neither for none."""
    folder = root / f"metagen-{model}__{task}__default__t-0.00__p-0.95__c-4.00__install-0__parallel_agents_run_{run}"
    folder.mkdir(parents=True)
    traj = {"environment": "mlgym_main", "trajectory": [], "history": [],
            "info": {"exit_status": exit_status, "score": (results or {}).get("agent", [])}}
    (folder / f"{task}.traj").write_text(json.dumps(traj, indent=2))
    if raw is not None:
        (folder / "results.json").write_text(raw)
    elif results is not None:
        (folder / "results.json").write_text(json.dumps(results))
    return folder


@pytest.fixture
def tree(tmp_path) -> Path:
    """Three models on two tasks, with a failed run, runs without a score and two corrupt files.

    blotto (Score, higher is better; baseline 0.5):
      alpha: [0.6, 0.9, 0.7] -> best 0.9, last 0.7; [0.8] -> 0.8, 0.8 (its .traj is truncated)   => best 0.9, last 0.8
      beta:  [0.4, 0.55] -> 0.55, 0.55; failed run [0.6] -> 0.6, 0.6 (counted); corrupt results   => best 0.6, last 0.6
      gamma: a run with no results.json                                                          => no score
    3SATTime (Time, lower is better; baseline 10):
      alpha: [12, 8, 9] -> best 8, last 9; [] (no agent score)                                   => best 8, last 9
      beta:  [5, 6] -> best 5, last 6                                                            => best 5, last 6
    """
    root = tmp_path / "runs"
    blotto = {"baseline": {"Score": 0.5}}
    sat = {"baseline": {"Time": 10.0, "Correct": 24000, "Incorrect": 0}}
    write_run(root, "alpha", "blotto", 0, {**blotto, "agent": [{"Score": 0.6}, {"Score": 0.9}, {"Score": 0.7}]})
    truncated = write_run(root, "alpha", "blotto", 1, {**blotto, "agent": [{"Score": 0.8}]})
    traj = truncated / "blotto.traj"
    traj.write_text(traj.read_text()[:40])
    write_run(root, "beta", "blotto", 0, {**blotto, "agent": [{"Score": 0.4}, {"Score": 0.55}]})
    write_run(root, "beta", "blotto", 1, {**blotto, "agent": [{"Score": 0.6}], "failed": "worker died"}, "")
    write_run(root, "beta", "blotto", 2, raw='{"agent": [{"Score": 5.0}', exit_status="submitted")
    write_run(root, "gamma", "blotto", 0, None, exit_status="early_exit")
    sat_runs = [("alpha", [12.0, 8.0, 9.0]), ("alpha", []), ("beta", [5.0, 6.0])]
    for index, (model, times) in enumerate(sat_runs):
        agent = [{"Time": t, "Correct": 24000, "Incorrect": 0} for t in times]
        write_run(root, model, "3SATTime", index, {**sat, "agent": agent}, "submitted" if times else "early_exit")
    return root


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def as_table(rows: list[list[str]]) -> dict[str, dict[str, str]]:
    header = rows[0]
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in rows[1:]}


def number(text: str) -> float | None:
    return float(text) if text else None


def area(log_ratios: list[float], tasks: int = 2, end: float = 0.5) -> float:
    """The area under a profile worked out by hand: each task adds (end - log10 ratio) / tasks."""
    return sum(end - x for x in log_ratios if x <= end) / tasks


def test_tables_of_a_small_tree(tree, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli_main(["report", str(tree), "--out", str(out), "--include-failed"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line]
    assert len(warnings) == 2, captured.err
    assert all(line.startswith("mlgym-registry: warning: ") for line in warnings)
    assert any("run_2/results.json is not valid JSON" in line for line in warnings)
    assert any("run_1/blotto.traj is not valid JSON" in line for line in warnings)
    assert "9 runs (6 with a score)" in captured.out

    best = as_table(read_csv(out / "best_scores.csv"))
    last = as_table(read_csv(out / "last_scores.csv"))
    assert read_csv(out / "best_scores.csv")[0] == ["Task", "baseline", "alpha", "beta", "gamma"]
    assert list(best) == ["3-SAT", "Blotto"]  # MLGym's row names, in MLGym's row order
    assert best["Blotto"] == {"baseline": "0.5", "alpha": "0.9", "beta": "0.6", "gamma": ""}
    assert last["Blotto"] == {"baseline": "0.5", "alpha": "0.8", "beta": "0.6", "gamma": ""}
    assert best["3-SAT"] == {"baseline": "10.0", "alpha": "8.0", "beta": "5.0", "gamma": ""}
    assert last["3-SAT"] == {"baseline": "10.0", "alpha": "9.0", "beta": "6.0", "gamma": ""}

    ranks = read_csv(out / "best_ranks.csv")
    assert ranks[0] == ["Rank", "1", "2", "3", "4"]
    assert ranks[1] == ["3-SAT", "beta", "alpha", "baseline", "gamma"]
    assert ranks[2] == ["Blotto", "alpha", "beta", "baseline", "gamma"]
    # alpha and beta both average 1.5: the tie keeps the first task's order
    assert ranks[3] == ["Plackett-Luce", "beta", "alpha", "baseline", "gamma"]
    assert ranks[4] == ["BORDA", "beta", "alpha", "baseline", "gamma"]
    assert read_csv(out / "last_ranks.csv")[1:3] == [
        ["3-SAT", "beta", "alpha", "baseline", "gamma"], ["Blotto", "alpha", "beta", "baseline", "gamma"]
    ]

    # Ratios, by hand. Best: 3-SAT (lower is better) best 5, worst feasible 10 -> alpha 8/5, beta 1, baseline 2,
    # gamma 2 * 1.05; Blotto best 0.9, worst 0.5 -> alpha 1, beta 1.5, baseline 1.8, gamma 1.8 * 1.05. Last: 3-SAT
    # best 6 -> alpha 1.5, beta 1, baseline 10/6, gamma 10/6 * 1.05; Blotto best 0.8 -> alpha 1, beta 4/3,
    # baseline 1.6, gamma 1.6 * 1.05. The largest penalty, 2.1, has ceiling 3: tau runs to log10(3) rounded up, 0.5.
    lg = math.log10
    expected = {
        "alpha": (area([lg(1.6), 0]), area([lg(1.5), 0])),
        "beta": (area([0, lg(1.5)]), area([0, lg(4 / 3)])),
        "gamma": (area([lg(2.1), lg(1.89)]), area([lg(1.75), lg(1.68)])),
        "baseline": (area([lg(2), lg(1.8)]), area([lg(10 / 6), lg(1.6)])),
    }
    aup = read_csv(out / "aup_scores.csv")
    assert aup[0] == ["Model", "Best AUP", "Last AUP"]
    assert [row[0] for row in aup[1:]] == ["alpha", "beta", "gamma", "baseline"]
    for name, best_aup, last_aup in aup[1:]:
        # the sum over the 500-point grid differs from the exact area by less than one grid step
        assert float(best_aup) == pytest.approx(expected[name][0], abs=GRID_STEP + 5e-4), name
        assert float(last_aup) == pytest.approx(expected[name][1], abs=GRID_STEP + 5e-4), name

    summary = (out / "summary.md").read_text()
    assert "worker died" in summary  # the failed run, listed
    unscored = summary.split("## Runs without a score")[1]
    suffix = "__default__t-0.00__p-0.95__c-4.00__install-0__parallel_agents_run_"
    for folder in ("gamma__blotto", f"alpha__3SATTime{suffix}1", f"beta__blotto{suffix}2"):
        assert folder in unscored, folder
    assert "no results.json" in summary and "no agent score" in summary
    assert "| alpha | 1/2 | 2/2 | 3/4 |" in summary  # runs with a score / runs: 3-SAT, Blotto, in all
    assert (out / "performance_profiles.png").read_bytes().startswith(b"\x89PNG")


def test_metric_functions_by_hand():
    assert metrics.run_score([{"Time": 3.0}, {"Other": 1.0}, {"Time": 2.0}, {"Time": 4.0}], "Time", False) == (2.0, 4.0)
    assert metrics.run_score([{"Other": 1.0}], "Time", False) is None
    scores = {"baseline": 1.0, "a": 2.0, "b": None, "c": 2.0, "d": 0.5}
    assert metrics.rank_order(scores, True) == ["a", "c", "baseline", "d", "b"]
    assert metrics.rank_order(scores, False) == ["d", "baseline", "a", "c", "b"]
    # columns without a score share the last positions (here 4 and 5 -> 4.5 each)
    two_missing = {"baseline": 1.0, "a": 3.0, "b": None, "c": 2.0, "d": None}
    assert metrics.positions(two_missing, True) == {"a": 1.0, "c": 2.0, "baseline": 3.0, "b": 4.5, "d": 4.5}
    # lower is better: d (0.5) is the best, a and c are worse than the baseline and so infeasible
    ratios, ceiling = metrics.performance_ratios(scores, False)
    assert ratios == {"baseline": 2.0, "a": 2.1, "b": 2.1, "c": 2.1, "d": 1.0} and ceiling == 3
    # negative scores and zero are infeasible; with nothing feasible, nobody solves the task
    ratios, ceiling = metrics.performance_ratios({"baseline": -1.0, "a": 0.0, "b": -0.5}, True)
    assert ratios == {"baseline": math.inf, "a": math.inf, "b": math.inf} and ceiling is None
    taus = metrics.tau_grid([3, 2, None])
    assert len(taus) == 500 and taus[-1] == 0.5
    assert metrics.aup(metrics.profiles([{"x": 1.0}], ["x"], taus)["x"], taus) == pytest.approx(0.5)


def test_no_runs_is_an_error(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert cli_main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlgym-registry: error: no runs found in ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert cli_main(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unknown_task_needs_a_metric(tmp_path, capsys):
    root = tmp_path / "runs"
    write_run(root, "alpha", "myTask", 0, {"agent": [{"loss": 2.0, "acc": 0.5}], "baseline": {"loss": 3.0, "acc": 0.4}})
    write_run(root, "alpha", "blotto", 0, {"agent": [{"Score": 0.3}], "baseline": {"Score": 0.1}})
    assert cli_main(["report", str(root), "--out", str(tmp_path / "a"), "--no-plot"]) == 0
    err = capsys.readouterr().err
    assert "no ranking metric known for 'myTask'" in err and "--metric myTask=METRIC" in err
    assert [row[0] for row in read_csv(tmp_path / "a" / "best_scores.csv")] == ["Task", "Blotto"]
    assert "Not ranked" in (tmp_path / "a" / "summary.md").read_text()
    out = tmp_path / "b"
    assert cli_main(["report", str(root), "--out", str(out), "--metric", "myTask=loss:min", "--no-plot"]) == 0
    assert as_table(read_csv(out / "best_scores.csv"))["myTask"] == {"baseline": "3.0", "alpha": "2.0"}
    assert not (out / "performance_profiles.png").exists()


def test_without_matplotlib_everything_else_is_written(tree, tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes ``import matplotlib`` raise ImportError
    out = tmp_path / "report"
    assert cli_main(["report", str(tree), "--out", str(out)]) == 0
    assert "pip install 'mlgym-registry[report]'" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [
        "accounting.csv", "aup_scores.csv", "best_ranks.csv", "best_scores.csv", "last_ranks.csv", "last_scores.csv",
        "noise_band.csv", "runs.csv", "spread.csv", "summary.md"
    ]
    assert "mlgym-registry[report]" in (out / "summary.md").read_text()


def test_models_option_orders_and_filters_columns(tree, tmp_path):
    report = build_report([tree], models=["gamma", "alpha"])
    assert report.board.columns == ["baseline", "gamma", "alpha"]
    assert {run.model for run in report.left_out} == {"beta"}
    # a folder given twice is read once
    assert len(find_runs([tree, tree / ".."]).runs) == len(find_runs([tree]).runs)


@pytest.mark.trajectories
def test_recorded_runs_give_mlgyms_numbers(tmp_path, capsys):
    """The shared recorded runs (MLGym's published runs of 3 models on the 3 games, in a flat layout)."""
    if not RECORDED:
        pytest.skip(missing_recorded_runs())
    out = tmp_path / "report"
    assert cli_main(["report", str(TRAJECTORIES), "--out", str(out), "--no-plot"]) == 0
    assert "36 runs (36 with a score) of 3 models on 3 tasks" in capsys.readouterr().out
    best = as_table(read_csv(out / "best_scores.csv"))
    last = as_table(read_csv(out / "last_scores.csv"))
    # the cells of MLGym's published tables for these models and tasks
    assert best["Blotto"] == {"baseline": "-0.248", "claude-35-sonnet-new": "0.576", "gpt4o2": "0.047",
                              "llama4-17b-16": "0.023"}
    assert last["Blotto"] == {"baseline": "-0.248", "claude-35-sonnet-new": "0.228", "gpt4o2": "0.047",
                              "llama4-17b-16": "0.019"}
    assert best["Prisoners Dilemma"] == {"baseline": "2.372", "claude-35-sonnet-new": "2.567", "gpt4o2": "2.6",
                                         "llama4-17b-16": "2.634"}
    assert best["Battle of Sexes"]["gpt4o2"] == "1.149"
    ranks = read_csv(out / "best_ranks.csv")
    assert all(row[-1] == "baseline" for row in ranks[1:])  # every model beats the baseline on every game
    aup = {row[0]: (float(row[1]), float(row[2])) for row in read_csv(out / "aup_scores.csv")[1:]}
    assert max(aup, key=lambda name: aup[name][0]) == "claude-35-sonnet-new"
    assert all(1.0 <= value <= 1.6 for name, pair in aup.items() if name != "baseline" for value in pair)
