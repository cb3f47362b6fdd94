"""``mlgym-registry bench``: K runs per task in MLGym's layout, seeded per run, resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlgym_registry.cli import main
from mlgym_registry.evaluation.suite import batches, plan, policy_model_name, run_finished, safe_name
from mlgym_registry.registry import registry


def scores(folder: Path) -> list[dict[str, float]]:
    return json.loads((folder / "results.json").read_text())["agent"]


def test_model_names_come_from_the_policy_and_fit_in_one_folder_field():
    assert policy_model_name("openai:meta-llama/Llama-3.1-8B") == "meta-llama-Llama-3.1-8B"
    assert policy_model_name("transformers:/ckpt/tiny-model/") == "tiny-model"
    assert policy_model_name("replay:/runs/x/blotto.traj") == "replay-blotto"
    assert policy_model_name("scripted") == "scripted"
    assert safe_name("my__model v2") == "my_model-v2"  # "__" separates the folder name's fields
    with pytest.raises(ValueError, match="--model-name"):
        safe_name("//")


def test_batches_hold_consecutive_runs_of_one_task():
    specs = [registry.spec("blotto"), registry.spec("prisonersDilemma")]
    runs = plan(specs, "m", 4, Path("/out"))
    assert runs[0].folder == Path("/out/m__blotto__run_0")
    pending = [runs[i] for i in (0, 1, 3, 4, 5, 6, 7)]  # blotto run 2 finished earlier
    groups = [[(r.spec.id, r.number) for r in group] for group in batches(pending, 2)]
    assert groups == [
        [("blotto", 0), ("blotto", 1)], [("blotto", 3)],
        [("prisonersDilemma", 0), ("prisonersDilemma", 1)], [("prisonersDilemma", 2), ("prisonersDilemma", 3)],
    ]


def test_a_run_is_finished_only_with_an_exit_status_and_no_failure(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"agent": [], "baseline": {}}))
    (tmp_path / "t.traj").write_text(json.dumps({"info": {"exit_status": "submitted"}}))
    assert run_finished(tmp_path, "t.traj")
    (tmp_path / "results.json").write_text(json.dumps({"agent": [], "baseline": {}, "failed": "its actor died"}))
    assert not run_finished(tmp_path, "t.traj")
    (tmp_path / "results.json").write_text('{"agent": [')
    assert not run_finished(tmp_path, "t.traj")
    (tmp_path / "results.json").write_text(json.dumps({"agent": [], "baseline": {}}))
    (tmp_path / "t.traj").write_text(json.dumps({"info": {}}))  # interrupted: the episode never ended
    assert not run_finished(tmp_path, "t.traj")


def test_an_unknown_task_fails_before_the_folder_is_made(tmp_path, capsys):
    out = tmp_path / "suite"
    assert main(["bench", "prisonersDilema", "--out", str(out)]) == 2
    assert "prisonersDilemma" in capsys.readouterr().err  # did you mean
    assert not out.exists()


@pytest.mark.slow
def test_runs_in_workers_and_resumed_in_process_get_the_same_seeded_scores(tmp_path, capsys):
    out = tmp_path / "suite"
    args = ["bench", "prisonersDilemma", "--runs", "2", "--max-steps", "4", "--seed", "5", "--out", str(out)]
    assert main([*args, "--num-envs", "2", "--quiet"]) == 0
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["scripted__prisonersDilemma__run_0", "scripted__prisonersDilemma__run_1"]
    first = {name: scores(out / name) for name in folders}
    assert all(first.values()) and first[folders[0]] != first[folders[1]]  # each run its own seed

    # run 0 was interrupted (its results cut short), run 1 finished: a second call plays run 0 only, in this process
    (out / folders[0] / "results.json").write_text('{"agent": [')
    capsys.readouterr()
    assert main([*args, "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "2 runs in" in printed and "1 already finished, 1 played now" in printed
    assert scores(out / folders[0]) == first[folders[0]]  # seeded seed + 0 in a worker and here alike
    trajectory = json.loads((out / folders[0] / "prisonersDilemma.traj").read_text())
    assert trajectory["info"]["exit_status"] in ("submitted", "autosubmission (max_steps)")
