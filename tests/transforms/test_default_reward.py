"""Every task's default reward is one a trainer can use as it is: whole episodes on the real local backend, where
validating again is never worth more than improving, and doing nothing is never worth more than trying and failing.

The reference chain's reward (``mlgym_score_delta``) is one option away, and keeps its own behaviour."""

from __future__ import annotations

import pytest

from mlgym_registry import registry
from mlgym_registry.components.rewards import failure_reward

TASK = "prisonersDilemma"
TURNS = 5


def fenced(command: str) -> str:
    return f"DISCUSSION\nNext.\n```\n{command}\n```"


LS = fenced("ls")
VALIDATE = fenced("validate")
BREAK = fenced("printf 'def row_strategy(history):\\n    raise ValueError(\"oops\")\\n' > strategy.py")
COOPERATE = fenced("printf 'def row_strategy(history):\\n    return 0\\n' > strategy.py")
NO_COMMAND = "I will think about it first."


@pytest.fixture(scope="module")
def envs():
    """One env per reward, each capped at ``TURNS`` turns with no format-error limit, so the cap ends every episode
    below; they are reset between episodes."""
    options = {"max_turns": TURNS, "max_format_errors": None, "seed": 0}
    made = {None: registry.make(TASK, **options), "mlgym_score_delta": registry.make(TASK, reward="mlgym_score_delta",
                                                                                     **options)}
    yield made
    for env in made.values():
        env.close()


def play(env, replies: list[str]) -> tuple[list[float], list[dict]]:
    """The rewards and ``last_info`` of each turn of one episode of ``replies``."""
    td = env.reset()
    rewards, infos = [], []
    for reply in replies:
        td["text", "response"] = reply
        td = env.step(td)
        rewards.append(td["next", "reward"].item())
        infos.append(env.base_env.last_info)
        done = bool(td["next", "done"].any())
        td = env.step_mdp(td)
        if done:
            break
    return rewards, infos


def test_every_task_defaults_to_the_reward_that_pays_no_farming():
    for name in registry.names("task"):
        assert registry.spec(name).reward == "mlgym_best_improvement", name
    meta = registry.entry("reward", "mlgym_best_improvement").info().meta
    assert not meta.get("farmable")
    assert registry.entry("reward", "mlgym_score_delta").info().meta["farmable"] is True


@pytest.mark.slow
def test_doing_nothing_never_pays_more_than_an_honest_failed_attempt(envs):
    env = envs[None]
    floor = failure_reward(registry.spec(TASK))
    assert floor == pytest.approx(-2.376)

    nothing, infos = play(env, [LS] * TURNS)
    assert nothing == pytest.approx([0.0] * (TURNS - 1) + [floor])  # the turn cap ends it without a score
    assert infos[-1]["stop_reason"] == "max_turns" and infos[-1]["score"] == []

    garbage, infos = play(env, [NO_COMMAND] * TURNS)  # no command at all: the cap ends it on a retry turn
    assert sum(garbage) == pytest.approx(floor)
    assert all(info is not None and info["exit_status"] == "" for info in infos)  # last_info after a retry too

    failed, infos = play(env, [BREAK, VALIDATE, LS, LS, LS])
    assert infos[1]["evaluation_status"] == "agent_error"
    assert failed == pytest.approx([0.0, floor, 0.0, 0.0, 0.0])  # the failure is the outcome: paid once
    assert sum(failed) >= sum(nothing) and sum(failed) >= sum(garbage)

    failed_twice, _ = play(env, [BREAK, VALIDATE, VALIDATE, LS, LS])
    assert sum(failed_twice) == pytest.approx(floor)


@pytest.mark.slow
def test_an_episode_sums_to_its_best_outcome_however_it_got_there(envs):
    env = envs[None]
    floor = failure_reward(registry.spec(TASK))
    baseline = registry.spec(TASK).baseline["Score"]

    fixed, infos = play(env, [BREAK, VALIDATE, COOPERATE, VALIDATE, VALIDATE])
    assert [info["evaluation_status"] for info in infos] == ["", "agent_error", "", "ok", "ok"]
    best = max(score["Score"] for score in infos[-1]["score"]) - baseline
    assert fixed[1] == pytest.approx(floor) and fixed[3] == pytest.approx(infos[3]["score"][-1]["Score"] - baseline
                                                                            - floor, abs=1e-6)
    assert sum(fixed) == pytest.approx(best, abs=1e-6)  # validating again paid nothing more


@pytest.mark.slow
def test_the_reference_reward_is_one_option_away_and_keeps_its_own_rules(envs):
    env = envs["mlgym_score_delta"]
    assert env.base_env.task.spec.reward == "mlgym_score_delta"
    baseline = registry.spec(TASK).baseline["Score"]

    nothing, _ = play(env, [LS] * TURNS)
    assert nothing == [0.0] * TURNS  # the reference pays a truncated episode nothing

    farmed, infos = play(env, [VALIDATE, VALIDATE, VALIDATE, LS, LS])
    paid = [score["Score"] - baseline for score in infos[2]["score"]]
    assert farmed[:3] == pytest.approx(paid, abs=1e-6)  # every validate is paid again
