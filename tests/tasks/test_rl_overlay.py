"""MLGym's RL tasks as our overlay gives them: our evaluation program instead of MLGym's (which imports the agent's
network into the evaluator), the agent's side declared, pinned packages, and no trust flag needed."""

from __future__ import annotations

from pathlib import Path

from conftest import fresh_registry, write

from mlgym_registry.backends.local import task_checks
from mlgym_registry.tasks.mlgym_overlay import RL_DATA, RL_FILES, RL_PINS


def test_the_rl_tasks_get_our_evaluator_and_need_no_trust(tmp_path, monkeypatch):
    checkout = tmp_path / "MLGym"
    write(checkout / "configs/tasks/maze.yaml",
          "id: rlMetaMazeMisc\ntask_entrypoint: ModelSubmissionTasks\nrequirements_path: data/maze/requirements.txt\n"
          "starter_code: [data/maze/src, data/maze/evaluate.py]\nevaluation_paths: [evaluate.py]\n"
          "baseline_paths: [src/train.py]\n")
    write(checkout / "data/maze/requirements.txt", "jax[cuda12]\ngymnax\n")
    write(checkout / "data/maze/evaluate.py", "import src.networks\n")
    write(checkout / "data/maze/src/networks.py", "")
    monkeypatch.setenv("MLGYM_ROOT", str(checkout))
    spec = fresh_registry().spec("mlgym/rlMetaMazeMisc")
    ours = [RL_DATA / "rlMetaMazeMisc" / "evaluate.py", *(RL_DATA / name for name in RL_FILES)]
    assert spec.starter_code == ["data/maze/src", *map(str, ours)] and all(path.is_file() for path in ours)
    assert 'main("MetaMaze-misc", max_frames=199)' in ours[0].read_text()
    assert spec.protected_files == list(RL_FILES) and task_checks.agent_side_files(spec) == ["rl_policy.py"]
    assert not task_checks.agent_code_in_evaluator(spec)
    assert "trust" not in {blocker.kind for blocker in task_checks.blockers(spec)}
    assert set(RL_PINS[1:]) <= set(spec.requirements or []) and spec.requirements[0].endswith("==0.4.35")


def test_other_tasks_keep_their_files(tmp_path, monkeypatch):
    checkout = tmp_path / "MLGym"
    # a game of a checkout's own, not one of MLGym's three (tests/tasks/test_game_overlay.py: those get ours)
    write(checkout / "configs/tasks/pd.yaml", "id: stagHunt\nstarter_code: [data/pd/evaluate.py, "
          "data/pd/strategy.py, data/pd/target.py]\nevaluation_paths: [evaluate.py]\n"
          "description: change strategy.py\n")
    monkeypatch.setenv("MLGYM_ROOT", str(checkout))
    spec = fresh_registry().spec("mlgym/stagHunt")
    assert spec.starter_code == ["data/pd/evaluate.py", "data/pd/strategy.py", "data/pd/target.py"]
    assert spec.protected_files == ["target.py"] and not task_checks.agent_side_files(spec)
    assert not Path(spec.starter_code[0]).is_absolute()
