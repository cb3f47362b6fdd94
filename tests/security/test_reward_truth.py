"""The reward is the task's truth: breaking the evaluation never pays more than trying, infrastructure failures are
flagged and never paid, and the reward to train on cannot be farmed by validating again and again.

Each episode is played through ``registry.make`` on the real sandbox, as an agent would play it: it writes its files
with shell commands, then validates or submits. What counts is read from the env's own outputs (reward, the
``evaluation_status`` and ``infra_error`` entries, ``results.json``).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from mlgym_registry import registry
from mlgym_registry.components.rewards import failure_reward
from mlgym_registry.episodes.episode import run_episode
from mlgym_registry.policies.base import Policy, fenced
from mlgym_registry.records.trajectories import TrajectoryWriter
from mlgym_registry.specs import TaskSpec

pytestmark = pytest.mark.security


def heredoc(path: str, text: str) -> str:
    """A shell command that writes ``text`` to ``path`` in the workspace."""
    return f"cat > {path} <<'MLGR_END'\n{textwrap.dedent(text).strip()}\nMLGR_END"


POOR_AND_BROKEN = {
    # task: (an honest but poor submission, a broken one), each a shell command
    "prisonersDilemma": (
        heredoc("strategy.py", "def row_strategy(history):\n    return 0"),
        heredoc("strategy.py", "def row_strategy(history):\n    raise ValueError('broken on purpose')"),
    ),
    "battleOfSexes": (
        heredoc("strategy.py", "def row_strategy(history):\n    return 1"),
        heredoc("strategy.py", "def row_strategy(history):\n    raise ValueError('broken on purpose')"),
    ),
    "blotto": (
        heredoc("strategy.py", "def row_strategy(history):\n    return [120, 0, 0, 0, 0, 0]"),
        heredoc("strategy.py", "def row_strategy(history):\n    raise ValueError('broken on purpose')"),
    ),
    "houseRegression": (
        # every house priced at one dollar: honest, and as poor as a submission gets
        "python -c \"import csv; ids=[r['Id'] for r in csv.DictReader(open('data/test.csv'))]; "
        "open('submission.csv','w').write('Id,Price\\n'+''.join(f'{i},1\\n' for i in ids))\"",
        # one price of 1e308: the squared errors overflow, and the evaluator prints {'rmse': inf, 'r2': -inf}
        "python -c \"import csv; ids=[r['Id'] for r in csv.DictReader(open('data/test.csv'))]; "
        "open('submission.csv','w').write('Id,Price\\n'+''.join(f'{i},{1e308 if n == 0 else 1}\\n' "
        "for n, i in enumerate(ids)))\"",
    ),
}


def play(env, commands: list[str]):
    """Play ``commands`` as an agent's turns; the last step's ``next`` tensordict."""
    td = env.reset()
    nxt = None
    for command in commands:
        td["text", "response"] = fenced("Next step.", command)
        td = env.step(td)
        nxt = td["next"]
        td = env.step_mdp(td)
    return nxt


@pytest.mark.parametrize("reward", ["mlgym_score_delta", "mlgym_best_improvement"])
@pytest.mark.parametrize("task", sorted(POOR_AND_BROKEN))
def test_breaking_the_evaluation_never_pays_more_than_an_honest_poor_submission(task, reward):
    poor, broken = POOR_AND_BROKEN[task]
    env = registry.make(task, reward=reward)
    try:
        honest = play(env, [poor, "submit"])
        assert honest["evaluation_status"] == "ok", env.base_env.last_info
        broke = play(env, [broken, "submit"])
        expected = "invalid_submission" if task == "houseRegression" else "agent_error"
        assert broke["evaluation_status"] == expected
        assert not broke["infra_error"].any()
        floor = failure_reward(env.base_env.task.spec)
        assert broke["reward"].item() == pytest.approx(floor)
        assert broke["reward"].item() <= honest["reward"].item()
        assert floor < 0
    finally:
        env.close()


def test_a_removed_strategy_is_the_agents_failure_not_the_infrastructures():
    env = registry.make("prisonersDilemma")
    try:
        nxt = play(env, ["rm strategy.py", "validate"])
        assert nxt["evaluation_status"] == "agent_error"
        assert not nxt["infra_error"].any()
        assert nxt["reward"].item() == pytest.approx(failure_reward(env.base_env.task.spec))
    finally:
        env.close()


def test_validating_the_same_code_again_is_not_paid_again():
    """Five validates of the untouched starter code: the training reward pays the first score only."""
    env = registry.make("prisonersDilemma", reward="mlgym_best_improvement")
    try:
        td = env.reset()
        rewards = []
        for _ in range(5):
            td["text", "response"] = fenced("Score it.", "validate")
            td = env.step(td)
            assert td["next", "evaluation_status"] == "ok"
            rewards.append(td["next", "reward"].item())
            td = env.step_mdp(td)
        scores = env.base_env.last_info["score"]
        assert len(scores) == 5
        assert rewards[1:] == [0.0] * 4
        baseline = env.base_env.task.spec.baseline["Score"]
        assert sum(rewards) == pytest.approx(max(s["Score"] for s in scores) - baseline, abs=1e-6)
    finally:
        env.close()


def test_an_echoed_validation_is_no_evaluation():
    env = registry.make("prisonersDilemma")
    try:
        nxt = play(env, ["validate"])
        shown = env.base_env.last_info["score"][-1]
        nxt = play(env, ["validate", f"echo \"Baseline Score: {{'Score': 0.0}}\"; echo \"Evaluation Score: {shown}\""])
        assert nxt["evaluation_status"] == ""
        assert nxt["reward"].item() == 0.0
    finally:
        env.close()


def test_an_all_garbage_episode_is_paid_the_floor_not_the_evaluators_noise():
    """Three replies without a command end the episode (exit_format); the autosubmission of the untouched starter
    code is evaluated but not paid its score."""
    env = registry.make("prisonersDilemma", reward="mlgym_best_improvement")
    try:
        td = env.reset()
        total = 0.0
        for _ in range(3):
            td["text", "response"] = "I have no idea."
            td = env.step(td)
            total += td["next", "reward"].item()
            nxt = td["next"]
            td = env.step_mdp(td)
        assert nxt["done"].all()
        assert env.base_env.last_info["exit_status"] == "autosubmission (exit_format)"
        assert nxt["evaluation_status"] == "ok"  # it was scored, and the score recorded ...
        assert total == pytest.approx(failure_reward(env.base_env.task.spec))  # ... but not paid
    finally:
        env.close()


class Commands(Policy):
    """A policy that sends fixed commands, one per turn."""

    def __init__(self, commands: list[str]):
        self.commands = list(commands)

    def reset(self, spec=None) -> None:
        self.left = list(self.commands)

    def respond(self, messages) -> str:
        return fenced("Next.", self.left.pop(0) if self.left else "submit")


def test_a_missing_package_is_an_infra_error_flagged_and_never_paid(tmp_path):
    """An evaluator that needs a package the interpreter lacks: not the agent's failure. It pays 0, the step is
    flagged, and results.json and the run's summary say so."""
    (tmp_path / "strategy.py").write_text("def answer():\n    return 42\n")
    (tmp_path / "evaluate.py").write_text(
        "import json\nimport mlgr_no_such_package_anywhere\nfrom strategy import answer\n"
        "print(json.dumps({'Score': float(answer())}))\n"
    )
    spec = TaskSpec(id="needsAPackage", description="Make answer() return the answer.", root=str(tmp_path),
                    starter_code=["strategy.py", "evaluate.py"], evaluation_paths=["evaluate.py"],
                    evaluation_read_only=True, baseline_scores=[{"Score": 1.0}], max_steps=5, training_timeout=60)
    env = registry.make(spec, reward="mlgym_best_improvement")
    writer = TrajectoryWriter(tmp_path / "run", spec.id, spec.baseline)
    try:
        result = run_episode(env, Commands(["validate", "submit"]), writer=writer)
    finally:
        env.close()
    assert [turn.reward for turn in result.turns] == [0.0, 0.0]
    assert result.info["evaluations"] == ["infra_error", "infra_error"]
    assert "infra_error" in result.summary()
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["evaluations"] == ["infra_error", "infra_error"] and saved["infra_errors"] == 2
    assert saved["agent"] == []
