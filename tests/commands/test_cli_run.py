"""`mlgym-registry run`: the demo episode, its recording, num-envs, and what an interrupted run leaves behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import default_sigint, run_cli

from mlgym_registry.cli import main as cli_main
from mlgym_registry.records.trajectories import load_results, load_traj

GAMES = ("prisonersDilemma", "battleOfSexes", "blotto")


def baseline_and_score(out: Path) -> tuple[float, float]:
    results = load_results(out / "results.json")
    return results["baseline"]["Score"], results["agent"][-1]["Score"]


@pytest.mark.slow
def test_demo_episode_shows_each_turn_beats_the_baseline_and_is_replayable(tmp_path, capsys):
    out = tmp_path / "demo"
    # make demo's command in a fresh process, as a user runs it (no wall-clock bound: the suite runs on loaded
    # machines, and what the demo costs is bench/'s business)
    result = run_cli("run", "prisonersDilemma", "--policy", "scripted", "--seed", "0", "--out", str(out))
    assert result.returncode == 0, result.stderr
    shown = result.stdout
    assert "[  1] ls -a" in shown and "validate" in shown and "reward +" in shown
    assert "above the baseline" in shown.splitlines()[-2]
    trajectory = load_traj(out / "prisonersDilemma.traj")
    assert trajectory.info["exit_status"] == "submitted"
    assert [step.action.split("\n")[0] for step in trajectory.steps[:3]] == ["ls -a", 'open "strategy.py"', "edit 1:24"]
    baseline, score = baseline_and_score(out)
    assert score > baseline
    assert cli_main(["replay", str(out / "prisonersDilemma.traj"), "--out", str(tmp_path / "replay"), "--seed", "0",
                     "--quiet"]) == 0
    report = capsys.readouterr().out
    assert f"same observation kind on {len(trajectory.steps)} of {len(trajectory.steps)} steps" in report
    assert (tmp_path / "replay" / "replay-report.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("task", GAMES[1:])
def test_scripted_agent_beats_the_baseline_of_every_game(task, tmp_path):
    out = tmp_path / task
    assert cli_main(["run", task, "--seed", "1", "--out", str(out), "--quiet"]) == 0
    baseline, score = baseline_and_score(out)
    assert score > baseline


def test_max_steps_autosubmits(tmp_path, capsys):
    assert cli_main(["run", "blotto", "--max-steps", "2", "--out", str(tmp_path), "--quiet"]) == 0
    trajectory = load_traj(tmp_path / "blotto.traj")
    assert trajectory.info["exit_status"] == "autosubmission (max_steps)"
    assert len(trajectory.steps) == 3  # two executed steps, then the one that triggers autosubmission


def test_bad_arguments(tmp_path):
    assert run_cli("run", "prisonersDilemma", "--num-envs", "0").returncode != 0
    result = run_cli("run", "prisonersDilema", "--out", str(tmp_path))
    assert result.returncode == 2 and "Did you mean 'prisonersDilemma'" in result.stderr
    result = run_cli("run", "prisonersDilemma", "--policy", "replay", "--out", str(tmp_path))
    assert result.returncode != 0 and "needs a path" in result.stderr


def test_episodes_that_do_not_divide_among_the_envs_are_refused_before_any_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli_main(["run", "prisonersDilemma", "--num-envs", "2", "--episodes", "3", "--out", str(out)]) == 2
    assert "--episodes 3 does not divide among --num-envs 2" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_one_env_plays_several_episodes_in_a_row(tmp_path):
    out = tmp_path / "out"
    result = run_cli("run", "battleOfSexes", "--episodes", "2", "--seed", "3", "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "env 0 episode 1: exit status: submitted" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["env0-0", "env0-1"]
    for folder in ("env0-0", "env0-1"):
        baseline, score = baseline_and_score(out / folder)
        assert score > baseline


def workspace_processes(root: Path) -> list[psutil.Process]:
    """Processes whose working directory is under ``root`` (the sandbox around the backend's shell) and everything
    they started (inside the sandbox, working directories are the sandbox's own paths)."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            if str(root) in proc.cwd():
                found[proc.pid] = proc
                found.update((child.pid, child) for child in proc.children(recursive=True))
        except (psutil.Error, OSError):
            continue
    return list(found.values())


@pytest.mark.slow
def test_sigint_mid_episode_keeps_the_steps_and_leaves_nothing_behind(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "run"
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlgym_registry.cli", "run", "prisonersDilemma", "--policy", "human", "--out", str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=default_sigint,
    )
    traj = out / "prisonersDilemma.traj"
    try:
        proc.stdin.write("ls -a\n")
        proc.stdin.write("sleep 600\n")  # the second step is still running when Ctrl-C arrives
        proc.stdin.flush()
        deadline = time.monotonic() + 300  # a ceiling for a loaded machine: the loop ends at the second step
        while time.monotonic() < deadline and not any(p.name() == "sleep" for p in workspace_processes(temp)):
            time.sleep(0.2)
        assert workspace_processes(temp), "the episode never got to its second step"
        proc.send_signal(signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=300)  # a ceiling for a loaded machine, not a timing
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    trajectory = load_traj(traj)  # complete and loadable
    assert [step.action for step in trajectory.steps] == ["ls -a\n"]
    assert "strategy.py" in trajectory.steps[0].observation
    assert load_results(out / "results.json")["agent"] == []
    assert not workspace_processes(temp), "processes were left running"
    assert not list(temp.glob("mlgym-registry-*")), "the workspace was left on disk"  # torch keeps its own caches


@pytest.mark.slow
def test_num_envs_runs_episodes_in_workers_and_records_each(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "out"
    result = run_cli("run", "prisonersDilemma", "--num-envs", "2", "--seed", "0", "--out", str(out),
                     timeout=300, env={**os.environ, "TMPDIR": str(temp)})
    assert result.returncode == 0, result.stderr
    final = result.stderr.split("episodes done")[-1]  # the bar's last state, written when the run ends
    assert final.startswith(": 100%") and " 2/2 [" in final and " steps]\n" in final
    assert not list(temp.glob("mlgym-registry-*")), "a worker left its workspace behind"
    for index in range(2):
        folder = out / f"env{index}"
        assert load_traj(folder / "prisonersDilemma.traj").info["exit_status"] == "submitted"
        baseline, score = baseline_and_score(folder)
        assert score > baseline


def test_a_component_swapped_in_from_the_command_line_runs_the_episode(tmp_path, capsys):
    out = tmp_path / "xml"
    # the scripted policy writes in the swapped parser's format (<command> tags): no format error, the steps run out
    assert cli_main(["run", "blotto", "--parser", "xml_thought_action", "--max-steps", "2", "--out", str(out),
                     "--quiet"]) == 0
    trajectory = load_traj(out / "blotto.traj")
    assert trajectory.info["exit_status"] == "autosubmission (max_steps)"
    assert [step.action for step in trajectory.steps][:1] == ["ls -a"]
    assert all("<command>" in step.response and "```" not in step.response for step in trajectory.steps)
    assert cli_main(["run", "blotto", "--reward", "mlgym_score_delt", "--out", str(tmp_path / "bad")]) == 2
    assert "unknown reward 'mlgym_score_delt'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


CSV_TASK = """\
id: lineCsv
name: Line CSV
description: Predict y for every id of data/test.csv and write submission.csv (header id,y).
task_entrypoint: CSVSubmissionTasks
training_timeout: 60
starter_code: [baseline.py, evaluate.py, data]
baseline_paths: [baseline.py]
baseline_scores: [{mae: 0.5}]
evaluation_paths: [evaluate.py]
evaluation_read_only: true
secret_files: [data/answer.csv]
metric_direction: min
max_steps: 6
"""
CSV_BASELINE = """\
import csv
rows = list(csv.DictReader(open("data/test.csv")))
with open("submission.csv", "w") as out:
    out.write("id,y\\n" + "".join(f"{row['id']},{2 * int(row['id']) + 1}\\n" for row in rows))
"""
CSV_EVALUATOR = """\
import argparse, csv, json
parser = argparse.ArgumentParser()
parser.add_argument("--submission_file", default="submission.csv")
answers = {row["id"]: float(row["y"]) for row in csv.DictReader(open("data/answer.csv"))}
got = {row["id"]: float(row["y"]) for row in csv.DictReader(open(parser.parse_args().submission_file))}
print(json.dumps({"mae": sum(abs(got[key] - value) for key, value in answers.items()) / len(answers)}))
"""


def csv_task(folder: Path) -> Path:
    """A plugin-style CSV task whose baseline program writes the submission (none is in the starter files)."""
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "test.csv").write_text("id\n6\n7\n8\n")
    (folder / "data" / "answer.csv").write_text("id,y\n6,13\n7,15\n8,18\n")
    (folder / "baseline.py").write_text(CSV_BASELINE)
    (folder / "evaluate.py").write_text(CSV_EVALUATOR)
    (folder / "lineCsv.yaml").write_text(CSV_TASK)
    return folder / "lineCsv.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("task", ["houseRegression", "lineCsv"])
def test_the_scripted_policy_runs_a_csv_tasks_baseline_program_and_ends_with_its_score(task, tmp_path):
    name = str(csv_task(tmp_path / "task")) if task == "lineCsv" else task
    out = tmp_path / "run"
    result = run_cli("run", name, "--policy", "scripted", "--seed", "0", "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr
    assert "runs the task's baseline program" in result.stderr
    trajectory = load_traj(out / f"{task}.traj")
    actions = [step.action.strip() for step in trajectory.steps]
    assert actions == ["ls -a", "python baseline.py", "validate", "submit"]
    assert trajectory.info["exit_status"] == "submitted"
    results = load_results(out / "results.json")
    metric = "r2" if task == "houseRegression" else "mae"
    scores = [entry[metric] for entry in results["agent"]]
    assert len(scores) == 2  # the validate and the submission both scored the baseline's file
    if task == "lineCsv":
        assert scores == pytest.approx([1 / 3, 1 / 3])  # the baseline's line misses the third answer by 1
    else:
        assert all(0.5 < score < 1 for score in scores)  # houseRegression's evaluator samples with its own seed
    assert "no score" not in result.stdout and f"{metric}: " in result.stdout
