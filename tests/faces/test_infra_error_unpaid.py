"""``infra_error`` is never paid, in any face: an evaluation that failed for a reason not the agent's (here: the
task's evaluator imports a package the interpreter lacks, a real failure of the real sandbox) is flagged in the
TorchRL chain and paid 0 by every built-in reward, NaN in Gymnasium, None over OpenEnv ``serve``, None from TRL's
``get_reward`` (in process and served), a failed rollout with a NaN reward in verifiers, and a run ``report`` leaves
out of its tables."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from mlgym_registry import registry
from mlgym_registry.policies.base import fenced

VALIDATE = fenced("Score the starter code.", "validate")
SUBMIT = fenced("Good enough.", "submit")
LS = fenced("Look around.", "ls")

TASK_YAML = """\
id: needsAPackage
name: Needs a package
description: Make answer() return the answer.
task_entrypoint: PythonSubmissionTasks
training_timeout: 60
starter_code:
- strategy.py
- evaluate.py
baseline_scores:
- Score: 1.0
worst_score:
  Score: -5.0
evaluation_paths:
- evaluate.py
evaluation_read_only: true
max_steps: 5
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> str:
    """A task YAML whose pristine evaluator needs a package no interpreter here has: every evaluation of it is an
    ``infra_error`` (the task's failure, not the agent's)."""
    folder = tmp_path_factory.mktemp("needs_a_package")
    (folder / "task.yaml").write_text(TASK_YAML)
    (folder / "strategy.py").write_text("def answer():\n    return 42\n")
    (folder / "evaluate.py").write_text(textwrap.dedent("""\
        import json
        import mlgr_no_such_package_anywhere
        from strategy import answer
        print(json.dumps({"Score": float(answer())}))
        """))
    return str(folder / "task.yaml")


# -- TorchRL ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reward", ["mlgym_best_improvement", "mlgym_score_delta"])
def test_torchrl_flags_the_step_and_no_builtin_reward_pays_it(task, reward):
    env = registry.make(task, reward=reward)
    try:
        td = env.reset()
        td["text", "response"] = VALIDATE
        nxt = env.step(td)["next"]
        assert nxt["evaluation_status"] == "infra_error"
        assert nxt["infra_error"].all()  # the mask key, shaped like done
        assert nxt["reward"].abs().sum().item() == 0.0  # the reward leaves it out (no floor, no score)
    finally:
        env.close()


# -- Gymnasium --------------------------------------------------------------------------------------------------------
def test_gymnasium_pays_an_infra_error_step_nan_and_flags_it(task):
    from mlgym_registry.faces.gymnasium import MLGymRegistryEnv

    with MLGymRegistryEnv(task) as env:
        _, info = env.reset(seed=0)
        assert info["infra_error"] is False
        _, reward, _, _, info = env.step(LS)
        assert reward == 0.0 and info["infra_error"] is False  # an ordinary step is paid as ever
        _, reward, terminated, _, info = env.step(VALIDATE)
        assert math.isnan(reward) and not terminated
        assert info["infra_error"] is True and info["evaluation_status"] == "infra_error"
        _, reward, terminated, _, info = env.step(SUBMIT)
        assert math.isnan(reward) and terminated and info["evaluations"] == ["infra_error", "infra_error"]


# -- TRL --------------------------------------------------------------------------------------------------------------
def test_trl_get_reward_is_none_for_an_episode_with_an_infra_error(task):
    from mlgym_registry.faces.trl import environment_factory

    env = environment_factory(task)()
    try:
        env.reset(seed=0)
        env.act(VALIDATE)
        assert env.infra_error and math.isnan(env.rewards[-1])
        env.act(LS)
        assert env.get_reward() is None  # TRL's "no reward": the rollout is left out of its group
        env.reset(seed=1)  # a new episode starts unflagged
        assert not env.infra_error and env.get_reward() is not None  # (its forfeit, paid the floor)
    finally:
        env._close()


# -- OpenEnv serve (and TRL over it) ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(task, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    proc = subprocess.Popen([sys.executable, "-m", "mlgym_registry.cli", "serve", task, "--port", "0"],
                            env={**os.environ, "TMPDIR": str(tmp)}, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    line = proc.stdout.readline()
    assert "serving" in line, line + proc.stdout.read()
    yield line.split(" at ")[-1].strip()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_serve_sends_no_reward_for_an_infra_error_step(served):
    from mlgym_registry.client import MlgymAction, connect

    with connect(served) as client:
        client.reset(seed=0)
        ordinary = client.step(MlgymAction(response=LS))
        assert ordinary.reward == 0.0 and ordinary.observation.metadata["infra_error"] is False
        result = client.step(MlgymAction(response=VALIDATE))
        assert result.reward is None and result.observation.reward is None
        meta = result.observation.metadata
        assert meta["infra_error"] is True and meta["evaluation_status"] == "infra_error"


@pytest.mark.slow
def test_trl_over_serve_gets_none_too(served):
    from mlgym_registry.faces.trl import environment_factory

    env = environment_factory("needsAPackage", url=served)()
    try:
        env.reset(seed=0)
        env.act(VALIDATE)
        assert env.infra_error and env.get_reward() is None
    finally:
        env._close()


# -- verifiers --------------------------------------------------------------------------------------------------------
def test_verifiers_ends_the_rollout_as_an_infra_failure_with_no_reward(task, tmp_path):
    vf = pytest.importorskip("verifiers")
    from model_server import MODEL, Endpoint, completion
    from openai import AsyncOpenAI

    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        env = vf.load_environment("mlgym_registry.faces.verifiers", task=task, workspace_dir=str(tmp_path))
        replies = [LS, VALIDATE, SUBMIT]

        def reply(request: dict[str, Any]) -> dict[str, Any]:
            turn = sum(message["role"] == "assistant" for message in request["messages"])
            return completion(replies[min(turn, len(replies) - 1)])

        with Endpoint(reply) as endpoint:
            client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=endpoint.url, api_key="t", max_retries=0))
            results = asyncio.run(env.evaluate(client=client, model=MODEL, num_examples=1, rollouts_per_example=1,
                                               state_columns=["mlgym", "trajectory"]))
        output = results["outputs"][0]
        assert len(endpoint.requests) == 2  # the rollout ended at the infra_error: the submit was never asked for
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert math.isnan(output["reward"]) and math.isnan(output["mlgym_reward"])
    assert output["infra_error"] == 1.0 and output["mlgym"]["infra_error"] is True
    assert "InfraError" in json.dumps(output["error"], default=str)
    first, second = (step["reward"] for step in output["trajectory"])
    assert first == 0.0 and math.isnan(second)


# -- bench / report ---------------------------------------------------------------------------------------------------
def test_report_leaves_a_run_with_an_infra_error_out_of_its_tables(tmp_path):
    from mlgym_registry.evaluation.report import build_report

    for model, extra in (("sound", {}), ("unlucky", {"infra_errors": 1, "evaluations": ["infra_error", "ok"]})):
        folder = tmp_path / f"{model}__prisonersDilemma__run0"
        folder.mkdir()
        results = {"agent": [{"Score": 2.5}], "baseline": {"Score": 2.37}, **extra}
        (folder / "results.json").write_text(json.dumps(results))
        (folder / "prisonersDilemma.traj").write_text(json.dumps({"info": {"exit_status": "submitted"}}))
    report = build_report([tmp_path])
    unlucky = [s for s in report.statuses if s.run.model == "unlucky"]
    assert unlucky and all(s.excluded for s in unlucky)
    assert "infra_error" in "; ".join(unlucky[0].run.problems)
    assert not any(s.excluded for s in report.statuses if s.run.model == "sound")


def test_bench_runs_with_an_infra_error_are_runs_with_a_problem(task, tmp_path):
    from mlgym_registry.evaluation.runs import find_runs
    from mlgym_registry.evaluation.suite import plan, play

    _, played = play(plan([registry.spec(task)], "scripted", 1, tmp_path), "scripted", seed=0)
    assert played[0][1].info["evaluations"] == ["infra_error", "infra_error"]
    (run,) = find_runs([tmp_path]).runs
    assert run.problems == ["2 evaluation(s) failed for reasons not the agent's (infra_error)"]
