"""The RL policy channel under attack: the agent's network code tries to forge the score of an RL task.

MLGym's RL evaluators import the agent's network into their own process; ours step the environment in the pristine
evaluator's process and ask the agent's side, in the agent's sandboxed process, for each step's batch of actions
(``tasks/data/rl/rl_driver.py``). The task here is ``tests/rl_toy.py``'s LineWorld, whose returns cannot exceed 1:
the agent's ``src/linear.py`` is replaced by a hostile one, and each attack is judged from the host: the evaluation's
status (a failure the agent caused is ``agent_error``, paid as a failure), its score against the honest one, the
pristine files on the host.
"""

from __future__ import annotations

import textwrap

import pytest
from rl_toy import LINEAR, RL_DATA, toy_spec

from .helpers import FAKE_SCORE, open_backend, status, validate, write_file

pytestmark = pytest.mark.security


def scored(tmp_path, linear: str, **options):
    """``(observation, info, score)`` of one ``validate`` after training, with ``linear`` as the agent's network
    code (written from the agent's shell)."""
    env = open_backend(toy_spec(tmp_path / "task", **options))
    try:
        output, code = status(env, "python src/train.py")
        assert code == 0, output
        write_file(env, "src/linear.py", linear)
        before = len(env._scores)
        obs, _, _, info = env.step("validate")
        return obs, info, (info["score"][-1] if len(info["score"]) > before else None)
    finally:
        env.close()


def hostile(body: str) -> str:
    """A ``src/linear.py`` whose policy runs ``body`` (with ``obs``, the batch) and returns what it returns."""
    return textwrap.dedent(
        """\
        import os
        import sys
        import time

        import numpy as np


        def policy_from(params):
            weights, bias = np.asarray(params["w"], float), np.asarray(params["b"], float)

            def policy(obs):
                honest = obs @ weights + bias
        {body}
                return honest

            return policy
        """
    ).format(body=textwrap.indent(textwrap.dedent(body), " " * 8))


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """The honest linear policy's score (the evaluation seed of ``seed=0``'s first episode)."""
    _, info, score = scored(tmp_path_factory.mktemp("honest"), LINEAR)
    assert info["evaluation_status"] == "ok" and 0.9 < score["Reward Mean"] <= 1.0, info
    return score


def test_printing_a_score_from_the_policy_changes_nothing(tmp_path, honest):
    _, info, score = scored(tmp_path, hostile(f"""\
        print({FAKE_SCORE!r}); sys.stdout.flush()
        sys.__stdout__.write({FAKE_SCORE!r} + "\\n")
        for fd in (1, 2):
            try:
                os.write(fd, b{FAKE_SCORE!r} + b"\\n")
            except OSError:
                pass
        """))
    assert info["evaluation_status"] == "ok" and score == honest


def test_huge_actions_are_clipped_by_the_environment_and_cannot_lift_the_score(tmp_path, honest):
    _, info, score = scored(tmp_path, hostile("honest = honest * 1e30"))
    assert info["evaluation_status"] == "ok" and score["Reward Mean"] <= 1.0


@pytest.mark.parametrize("value", ["np.nan", "np.inf", "1e300"])
def test_actions_that_are_not_finite_float32_are_the_agents_failure(tmp_path, value):
    obs, info, score = scored(tmp_path, hostile(f"honest[0, 0] = {value}"))
    assert score is None and info["evaluation_status"] == "agent_error", info
    assert "not a finite float32" in obs


@pytest.mark.parametrize("body, words", [
    ("honest = honest[:, 0]", "shape (16,)"),
    ("honest = honest[:3]", "shape (3, 1)"),
    ("honest = [['left']] * len(honest)", "of type <U4"),
    ("honest = [[0.0]] * 3 + [[0.0, 1.0]] * 13", "not an array of actions"),
])
def test_actions_of_the_wrong_shape_or_kind_are_the_agents_failure(tmp_path, body, words):
    obs, info, score = scored(tmp_path, hostile(body))
    assert score is None and info["evaluation_status"] == "agent_error", info
    assert words in obs, obs


def test_a_policy_that_raises_is_the_agents_failure_with_its_traceback(tmp_path):
    obs, info, score = scored(tmp_path, hostile("raise ValueError('broken on purpose')"))
    assert score is None and info["evaluation_status"] == "agent_error", info
    assert "ValueError: broken on purpose" in obs and "linear.py" in obs


def test_a_policy_that_sleeps_past_the_limit_is_the_agents_failure(tmp_path):
    obs, info, score = scored(tmp_path, hostile("time.sleep(120)"), training_timeout=5)
    assert score is None and info["evaluation_status"] == "agent_error", info
    assert "did not finish within 5 seconds" in obs


LOOK_AROUND = """\
    found = [name for name in os.environ if "SEED" in name or "MLGYM_REGISTRY" in name]
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for what in ("environ", "cmdline", "mem"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as handle:
                    text = handle.read(1 << 16)
            except OSError:
                continue
            if what == "mem" or b"MLGYM_REGISTRY_EVAL_SEED" in text or b"evaluate" in text:
                found.append(f"/proc/{pid}/{what}")
    for path in ("rl_driver.py", "evaluate.py"):
        try:
            with open(path, "a") as handle:
                handle.write("\\nprint('{\\"Reward Mean\\": 99.0}')\\n")
        except OSError:
            pass
    if found:
        raise RuntimeError("LEAK " + repr(found))
    """


def test_the_policy_can_read_neither_the_evaluators_seeds_nor_its_process_nor_change_its_files(tmp_path, honest):
    obs, info, score = scored(tmp_path, hostile(LOOK_AROUND))
    assert info["evaluation_status"] == "ok", obs
    assert score == honest
    assert "print(" not in (RL_DATA / "rl_driver.py").read_text().splitlines()[-1]


def test_rewriting_the_pristine_policy_side_and_driver_in_the_workspace_changes_nothing(tmp_path, honest):
    env = open_backend(toy_spec(tmp_path / "task"))
    try:
        output, code = status(env, "python src/train.py && chmod u+w rl_driver.py toy_policy.py evaluate.py; "
                                   "echo 'def rollout(*a, **k): return [99.0]' >> rl_driver.py; "
                                   "echo 'def act(*a): return [[99.0]] * 16' >> toy_policy.py")
        assert code == 0, output
        _, score = validate(env)
        assert score == honest
    finally:
        env.close()
