"""The Gymnasium face (``gymnasium.make("mlgym_registry/<task>")``), the envs as context managers, and the
conversation printer, through the public API: real sandboxes, Gymnasium's own ``check_env``."""

from __future__ import annotations

import io
import json
import os
import warnings

import gymnasium
import pytest
from conftest import run_cli, run_python, write
from gymnasium.utils.env_checker import check_env

from mlgym_registry import InvalidOverrideError, registry
from mlgym_registry.backends.local.resources import MemoryOvercommitWarning
from mlgym_registry.cli import main as cli_main
from mlgym_registry.faces.gymnasium_registration import gym_id, register_envs
from mlgym_registry.records.conversation import format_conversation, print_conversation, render_chat

BUILT_IN = ["battleOfSexes", "blotto", "capitals", "houseRegression", "prisonersDilemma"]

LS = "DISCUSSION\nFirst see what is in the workspace.\n```\nls\n```"
VALIDATE = "DISCUSSION\nScore the starter strategy.\n```\nvalidate\n```"
SUBMIT = "DISCUSSION\nGood enough.\n```\nsubmit\n```"


def test_import_registers_every_task_without_torch():
    result = run_python(
        """
        import sys
        import mlgym_registry
        print(sorted(m for m in ("torch", "torchrl", "tensordict", "gymnasium", "numpy") if m in sys.modules))
        import importlib.util
        assert importlib.util.find_spec("gymnasium") is not None  # asking (as TorchRL does) imports nothing
        import gymnasium
        print(sorted(k for k in gymnasium.registry if k.startswith("mlgym_registry/")))
        print(sorted(m for m in ("torch", "torchrl", "tensordict") if m in sys.modules))
        """
    )
    assert result.returncode == 0, result.stderr
    before, ids, after = result.stdout.strip().splitlines()
    assert before == "[]" and after == "[]"
    assert all(f"mlgym_registry/{name}" in ids for name in BUILT_IN)


def test_gymnasium_imported_first_also_gets_the_tasks():
    result = run_python(
        "import gymnasium, mlgym_registry, sys\n"
        "print('mlgym_registry/blotto' in gymnasium.registry, 'torch' in sys.modules)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]


def test_namespaced_tasks_map_to_valid_ids(tmp_path):
    assert gym_id("prisonersDilemma") == "mlgym_registry/prisonersDilemma"
    assert gym_id("mlgym/titanicSurvival") == "mlgym_registry/mlgym.titanicSurvival"
    assert gym_id("has space") is None
    root = tmp_path / "MLGym"
    write(root / "configs/tasks/game.yaml", "id: gameId\nname: A Game\ndescription: Play.\n"
          "task_entrypoint: PythonSubmissionTasks\nstarter_code:\n- data/game/strategy.py\n")
    write(root / "data/game/strategy.py", "def row_strategy(history):\n    return 0\n")
    result = run_python(
        "import gymnasium, mlgym_registry\n"
        "spec = gymnasium.spec('mlgym_registry/mlgym.gameId')\n"
        "print(spec.kwargs['task'])\n",
        env={**os.environ, "MLGYM_ROOT": str(root)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "mlgym/gameId"


def test_register_envs_is_idempotent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Gymnasium warns when an id is registered twice
        ids = register_envs()
        assert register_envs() == ids
    assert ids["mlgym_registry/blotto"] == "blotto"


@pytest.mark.parametrize("task", BUILT_IN)
def test_check_env_passes(task):
    env = gymnasium.make(f"mlgym_registry/{task}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any of check_env's warnings fails the test
            # not the machine's state: other tests' envs, running beside this one, may hold its memory
            warnings.simplefilter("ignore", MemoryOvercommitWarning)
            check_env(env.unwrapped)
        assert isinstance(env.observation_space, gymnasium.spaces.Text)
        assert isinstance(env.action_space, gymnasium.spaces.Text)
    finally:
        env.close()


def test_an_episode_of_text_actions_reaches_a_scored_validate_and_a_submit():
    env = gymnasium.make("mlgym_registry/prisonersDilemma", max_steps=10)
    observation, info = env.reset(seed=0)
    assert "TASK DESCRIPTION" in observation and observation in env.observation_space
    assert info["task"] == "prisonersDilemma" and "researcher" in info["system"] and info["score"] == []

    observation, reward, terminated, truncated, info = env.step(LS)
    assert "strategy.py" in observation and "strategy.py" in info["output"]
    assert (reward, terminated, truncated, info["action"].strip(), info["format_error"]) == (0.0, False, False,
                                                                                             "ls", "")

    observation, reward, terminated, truncated, info = env.step("no command in this answer")
    # format_error says what was wrong with the answer (TurnFacts.format_error); the observation shows the fix
    assert info["format_error"] == "No action found in model response." and "could not be used" in observation
    assert info["action"] == "" and not (terminated or truncated)

    # the parser reads this reply, but the isolator refuses its unterminated insert: a format error all the same
    observation, reward, terminated, truncated, info = env.step("DISCUSSION\nadd a line\n```\ninsert 3\nfoo\n```")
    assert info["format_error"] and info["action"] == ""
    assert "could not be used" in observation and not (terminated or truncated)

    observation, reward, terminated, truncated, info = env.step(VALIDATE)
    assert info["evaluation_status"] == "ok" and len(info["score"]) == 1 and "Evaluation Score" in observation
    baseline = registry.spec("prisonersDilemma").baseline["Score"]
    assert reward == pytest.approx(info["score"][-1]["Score"] - baseline, abs=1e-5)
    assert not (terminated or truncated)

    # an answer without a command keeps the episode's info as it stands: its score, nothing evaluated now
    scored = info["score"]
    *_, info = env.step("still no command")
    assert info["score"] == scored and info["evaluation_status"] == "" and info["evaluations"] == ["ok"]

    observation, reward, terminated, truncated, info = env.step(SUBMIT)
    assert terminated and not truncated and info["exit_status"] == "submitted"
    assert info["evaluations"] == ["ok", "ok"] and isinstance(reward, float)
    env.close()


def test_make_keywords_are_registry_overrides():
    with pytest.raises(InvalidOverrideError, match="no_such_optio"):
        gymnasium.make("mlgym_registry/blotto", no_such_optio=1)
    env = gymnasium.make("mlgym_registry/blotto", max_steps=1)
    env.reset(seed=1)
    env.step(LS)
    *_, terminated, truncated, info = env.step(LS)  # the step after the last one autosubmits
    assert truncated and not terminated and info["exit_status"] == "autosubmission (max_steps)"
    env.close()


def test_render_ansi_and_human(capsys):
    env = gymnasium.make("mlgym_registry/prisonersDilemma", render_mode="ansi")
    env.reset(seed=0)
    first = env.render()
    assert first.startswith("=== system ===") and "=== user ===" in first
    env.step(LS)
    turn = env.render()
    assert turn.startswith("=== assistant ===") and "--- action ---\nls" in turn and "strategy.py" in turn
    env.close()

    env = gymnasium.make("mlgym_registry/prisonersDilemma", render_mode="human")
    env.reset(seed=0)
    env.step(LS)
    assert env.render() is None
    printed = capsys.readouterr().out
    assert "=== system ===" in printed and printed.count("--- action ---\nls") == 2  # by step, then by render()
    env.close()


def test_envs_are_context_managers():
    with registry.make("blotto") as env:
        env.reset()
        assert not env.is_closed
    assert env.is_closed
    with registry.make("blotto"):
        pass  # closing an env that never ran is fine

    with gymnasium.make("mlgym_registry/blotto") as gym_env:
        gym_env.reset(seed=0)
        chain = gym_env.unwrapped.chain
        assert not chain.is_closed
    assert chain.is_closed
    gym_env.close()  # twice is fine


def test_conversation_of_the_env(capsys):
    with registry.make("prisonersDilemma") as env:
        td = env.reset()
        td["text", "response"] = LS
        td = env.step_mdp(env.step(td))
        text = format_conversation(td)
        assert text.splitlines()[0] == "=== system ===" and "--- thought ---" in text
        assert "--- action ---\nls" in text
        assert format_conversation(td["history", "prompt"]) == text
        prompt = render_chat(td, add_generation_prompt=False)
        assert prompt.startswith("<|im_start|>system") and "ls" in prompt
    with gymnasium.make("mlgym_registry/prisonersDilemma") as gym_env:
        gym_env.reset(seed=0)
        gym_env.step(LS)
        assert format_conversation(gym_env.unwrapped.messages) == text


def test_conversation_of_a_recorded_traj(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(["run", "prisonersDilemma", "--policy", "scripted", "--seed", "0", "--max-steps", "2",
                     "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    traj = out / "prisonersDilemma.traj"
    text = format_conversation(traj)
    recorded = json.loads(traj.read_text())
    first = recorded["trajectory"][0]
    assert text.startswith("=== system ===")
    assert f"=== assistant (step 1) ===\n--- thought ---\n{first['thought'].rstrip()}" in text
    assert f"--- action ---\n{first['action'].rstrip()}" in text
    assert "=== observation (step 1) ===" in text and first["observation"].splitlines()[0] in text
    assert "=== end ===\n--- exit_status ---\nautosubmission (max_steps)" in text

    buffer = io.StringIO()
    print_conversation(traj, file=buffer, max_chars=200)
    assert "characters cut ...]" in buffer.getvalue()

    shown = run_cli("show", str(traj), "--max-chars", "200")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == buffer.getvalue().strip()
    missing = run_cli("show", str(tmp_path / "absent.traj"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
