"""Runs that say how they were made: the ``"run"`` record of ``results.json`` and the ``.traj``, replays that play a
recorded run again from it alone, ``report`` placing runs by their records, and the human policy writing in the
episode's parser's format."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from mlgym_registry import registry
from mlgym_registry.episodes.episode import run_episode
from mlgym_registry.policies.human import HumanPolicy
from mlgym_registry.records.trajectories import TrajectoryWriter


def run(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / name
    result = run_cli("run", "prisonersDilemma", "--out", str(out), "--max-steps", "3", "--quiet", *args)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A scripted run with no seed given (``scripted-run``) and a replay of it (``replayed``), played once for the
    module: every test here reads them, none writes into them."""
    folder = tmp_path_factory.mktemp("runs")
    run(folder, "scripted-run", "--policy", "scripted", "--reward", "mlgym_best_improvement")
    run(folder, "replayed", "--policy", f"replay:{folder / 'scripted-run' / 'prisonersDilemma.traj'}")
    return folder


def results_of(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def test_a_run_records_task_components_seed_policy_versions_and_times(runs):
    results = results_of(runs / "scripted-run")
    record = results["run"]
    assert record["task"]["name"] == record["task"]["id"] == "prisonersDilemma"
    assert record["task"]["hash"].startswith("sha256:") and record["task"]["file"].endswith("prisonersDilemma.yaml")
    assert record["components"]["reward"] == {"name": "mlgym_best_improvement", "distribution": "mlgym-registry",
                                              "version": record["versions"]["mlgym-registry"]}
    assert record["components"]["parser"]["name"] == "thought_action"
    assert isinstance(record["seed"], int)  # none given: one was drawn, and recorded
    assert record["max_steps"] == 3 and record["policy"] == {"name": "scripted"}
    assert record["versions"]["torch"] and record["started"] < record["ended"]
    traj = json.loads((runs / "scripted-run" / "prisonersDilemma.traj").read_text())
    assert traj["run"] == record


@pytest.mark.slow
def test_a_replay_of_a_recorded_run_plays_it_again_from_its_record_alone(runs, tmp_path):
    first = results_of(runs / "scripted-run")
    traj = runs / "scripted-run" / "prisonersDilemma.traj"
    again = results_of(runs / "replayed")
    assert again["agent"] == first["agent"]
    assert again["run"]["seed"] == first["run"]["seed"]
    assert again["run"]["components"]["reward"]["name"] == "mlgym_best_improvement"
    assert again["run"]["policy"] == {"name": "replay", "source": str(traj)}
    result = run_cli("replay", str(traj), "--out", str(tmp_path / "replayed"), "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "replayed" / "replay-report.json").read_text())
    assert report["our_scores"] == first["agent"] and report["task"] == "prisonersDilemma"


@pytest.mark.slow
def test_report_takes_models_from_records_leaves_replays_out_and_names_folders_it_cannot_place(runs, tmp_path):
    runs = Path(shutil.copytree(runs, tmp_path / "runs"))  # the shared runs, and a folder of this test's own
    unplaced = runs / "someone"
    unplaced.mkdir()
    (unplaced / "results.json").write_text(json.dumps({"agent": [{"Score": 2.5}], "baseline": {"Score": 2.376}}))
    (unplaced / "prisonersDilemma.traj").write_text((runs / "scripted-run" / "prisonersDilemma.traj").read_text())
    result = run_cli("report", str(runs), "--out", str(tmp_path / "report"), "--no-noise-band")
    assert result.returncode == 0, result.stderr
    best = (tmp_path / "report" / "best_scores.csv").read_text()
    assert "scripted" in best and "replayed" not in best and "scripted-run" not in best
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "left out 1 replay(s)" in summary
    assert f"{unplaced}: neither its folder name" in summary


def test_the_human_policy_types_in_the_episodes_parser_format(tmp_path):
    spec = registry.spec("prisonersDilemma").replace(parser="xml_thought_action", max_steps=3)
    policy = HumanPolicy(stdin=io.StringIO("validate\nsubmit\n"), stdout=io.StringIO())
    env = registry.make(spec, batch_size=())
    try:
        result = run_episode(env, policy, spec=spec, writer=TrajectoryWriter(tmp_path, spec.id), seed=0)
    finally:
        env.close()
    assert [turn.format_error for turn in result.turns] == [False, False]
    assert result.info["exit_status"] == "submitted" and len(result.info["score"]) == 2
