"""The verifiers face: verifiers' own classes and evaluation loop (``Environment.evaluate``, ``vf-eval``) play tasks
against real OpenAI-compatible servers (the scripted ``Endpoint``, and ``transformers serve`` over the tiny model),
and each rollout gives what the same replies give the env ``registry.make`` builds, in process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

vf = pytest.importorskip("verifiers")
psutil = pytest.importorskip("psutil")

from model_server import MODEL, Endpoint, completion, error  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from mlgym_registry import InvalidOverrideError  # noqa: E402
from mlgym_registry.components.tool_calling import encode_call  # noqa: E402
from mlgym_registry.faces.gymnasium import MLGymRegistryEnv  # noqa: E402
from mlgym_registry.faces.verifiers import ENV_ID, EXITS, MLGymEnv, load_environment  # noqa: E402

TASK = "prisonersDilemma"
OPEN = "DISCUSSION\nRead the strategy first.\n```\nopen strategy.py\n```"
LS = "DISCUSSION\nSee what is in the workspace.\n```\nls\n```"
VALIDATE = "DISCUSSION\nScore the starter strategy.\n```\nvalidate\n```"
SUBMIT = "DISCUSSION\nGood enough.\n```\nsubmit\n```"
SKIP = "DISCUSSION\nNothing more to do here.\n```\nskip\n```"
NO_COMMAND = "I am not sure what to do."
OVERFLOW = error(400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
                 code="context_length_exceeded")


def by_turn(replies: list[dict[str, Any] | str]):
    """An endpoint's answers by the turn of the conversation it is asked about (its assistant messages so far), so
    that rollouts running at once each get the same script."""
    def reply(request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(message["role"] == "assistant" for message in request["messages"])
        answer = replies[min(turn, len(replies) - 1)]
        return completion(answer) if isinstance(answer, str) else answer
    return reply


def in_process(answers: list[str], seed: int | None, **options: Any) -> dict[str, Any]:
    """The same answers through ``registry.make``'s env, in this process: the rewards and the end."""
    with MLGymRegistryEnv(TASK, **options) as env:
        observation, info = env.reset(seed=seed)
        messages = [info["system"], observation]
        rewards, end, terminated, truncated = [], {}, False, False
        for answer in answers:
            observation, reward, terminated, truncated, end = env.step(answer)
            rewards.append(reward)
            messages.append(observation)
            if terminated or truncated:
                break
    return {"rewards": rewards, "messages": messages, "info": end, "terminated": terminated, "truncated": truncated}


@pytest.fixture
def workspaces(tmp_path) -> Path:
    """Where the rollouts' sandboxes put their workspaces (the local backend's ``workspace_dir``)."""
    folder = tmp_path / "workspaces"
    folder.mkdir()
    return folder


@pytest.fixture
def load(workspaces):
    """``vf.load_environment`` of the face, the way vf-eval calls it; verifiers' ``Environment`` replaces the
    process's SIGINT and SIGTERM handlers, which are put back after the test."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}

    def make(**options: Any) -> MLGymEnv:
        return vf.load_environment(ENV_ID, task=TASK, workspace_dir=str(workspaces), **options)

    yield make
    for number, handler in handlers.items():
        signal.signal(number, handler)


def evaluate(env: MLGymEnv, url: str, model: str = MODEL, **kwargs: Any) -> list[dict[str, Any]]:
    """verifiers' own evaluation loop against ``url``; its outputs, one per rollout."""
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=url, api_key="test", max_retries=0))
    kwargs = {"num_examples": 1, "rollouts_per_example": 1, **kwargs}
    results = asyncio.run(env.evaluate(client=client, model=model, **kwargs))
    return results["outputs"]


def live_children() -> set[int]:
    """This process's live descendants, but multiprocessing's resource tracker (started once, by verifiers' first
    evaluation, and kept for the process's life)."""
    alive = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and "multiprocessing.resource_tracker" not in " ".join(
                    proc.cmdline()):
                alive.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def assert_sandboxes_gone(workspaces: Path, children_before: set[int]) -> None:
    assert not list(workspaces.iterdir()), "a rollout left its workspace behind"
    deadline = time.monotonic() + 120  # a ceiling for a loaded machine: the loop ends when they are gone
    while live_children() - children_before and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [psutil.Process(pid).cmdline() for pid in live_children() - children_before]
    assert not left, f"a rollout left processes behind: {left}"


# -- the evaluation loop ---------------------------------------------------------------------------------------------
def test_evaluate_plays_each_episode_as_registry_make_does(load, workspaces):
    env = load(episodes=2)
    assert isinstance(env, vf.MultiTurnEnv) and env.env_id == ENV_ID
    answers = [OPEN, VALIDATE, SUBMIT]
    expected = {seed: in_process(answers, seed) for seed in (0, 1)}
    before = live_children()
    with Endpoint(by_turn(answers)) as endpoint:
        outputs = evaluate(env, endpoint.url, num_examples=2, rollouts_per_example=2,
                           state_columns=["mlgym", "trajectory"])
    assert len(outputs) == 4 and len(endpoint.requests) == 12
    for output in outputs:
        seed = output["example_id"]
        ours = expected[seed]
        outcome = output["info"]["mlgym"]
        assert outcome["seed"] == seed and outcome == output["mlgym"]
        # the reward is the env's, step by step and summed
        assert [step["reward"] for step in output["trajectory"]] == pytest.approx(ours["rewards"])
        assert output["reward"] == pytest.approx(sum(ours["rewards"])) == pytest.approx(outcome["reward"])
        assert output["mlgym_reward"] == output["reward"] and output["infra_error"] == 0.0
        # the statuses: the episode's end, its evaluations, the stop condition verifiers reports
        assert outcome["exit_status"] == ours["info"]["exit_status"] == "submitted"
        assert outcome["evaluations"] == ours["info"]["evaluations"] == ["ok", "ok"]
        assert outcome["score"] == ours["info"]["score"] and outcome["terminated"] and not outcome["truncated"]
        assert output["stop_condition"] == "episode_terminated" and output["is_completed"]
        assert not output["is_truncated"] and output.get("error") is None
        assert [step["extras"]["mlgym"]["evaluation_status"] for step in output["trajectory"]] == ["", "ok", "ok"]
        # the conversation is the env's own: its system and task messages, then each reply and what it got back
        assert [m["content"] for m in output["prompt"]] == ours["messages"][:2]
        assert [m["role"] for m in output["completion"]] == ["assistant", "user"] * 3
        assert [m["content"] for m in output["completion"][1::2]] == ours["messages"][2:]
    # the model was asked with the env's conversation
    assert [m["content"] for m in endpoint.requests[0]["messages"]] == expected[0]["messages"][:2]
    assert_sandboxes_gone(workspaces, before)


def test_options_pass_through_to_registry_make(load, workspaces):
    env = load(max_steps=2)
    with Endpoint(by_turn([LS, LS, LS])) as endpoint:
        (output,) = evaluate(env, endpoint.url)
    ours = in_process([LS, LS, LS], 0, max_steps=2)
    outcome = output["info"]["mlgym"]
    assert outcome["exit_status"] == ours["info"]["exit_status"] == "autosubmission (max_steps)"
    assert outcome["truncated"] and output["stop_condition"] == "episode_truncated"
    assert output["reward"] == pytest.approx(sum(ours["rewards"])) and outcome["steps"] == 3
    with pytest.raises(RuntimeError, match="max_stepz"):  # vf.load_environment wraps what load_environment raised
        load(max_stepz=2)
    with pytest.raises(InvalidOverrideError):
        load_environment(TASK, max_stepz=2)


def test_format_errors_end_the_episode_as_the_chain_does(load, workspaces):
    env = load()
    with Endpoint(by_turn([NO_COMMAND])) as endpoint:
        (output,) = evaluate(env, endpoint.url)
    ours = in_process([NO_COMMAND] * 5, 0)
    outcome = output["info"]["mlgym"]
    assert outcome["exit_status"] == ours["info"]["exit_status"] == "autosubmission (exit_format)"
    assert outcome["format_errors"] == output["format_errors"] == 3
    assert output["reward"] == pytest.approx(sum(ours["rewards"]))
    assert output["reward"] < 0  # the floor: garbage earns nothing


def test_a_context_overflow_sends_mlgyms_exit_context(load, workspaces):
    env = load()
    before = live_children()
    with Endpoint(by_turn([LS, OVERFLOW])) as endpoint:
        (output,) = evaluate(env, endpoint.url)
    ours = in_process([LS, EXITS["prompt_too_long"]], 0)
    outcome = output["info"]["mlgym"]
    assert output["stop_condition"] == "prompt_too_long"
    assert outcome["exit_status"] == ours["info"]["exit_status"] == "autosubmission (exit_context)"
    assert outcome["evaluations"] == ["ok"] and output["reward"] == pytest.approx(sum(ours["rewards"]))
    assert output["completion"][-1]["content"] == ours["messages"][-1]  # the autosubmission's message ends it
    assert_sandboxes_gone(workspaces, before)


def test_a_model_error_ends_the_rollout_and_closes_its_sandbox(load, workspaces):
    env = load()
    before = live_children()
    with Endpoint(by_turn([LS, error(400, "something else went wrong")])) as endpoint:
        (output,) = evaluate(env, endpoint.url)
    assert output["stop_condition"] == "has_error" and "ModelError" in output["error"]["error_chain_repr"]
    outcome = output["info"]["mlgym"]
    assert outcome["steps"] == 1 and outcome["exit_status"] == "" and not outcome["terminated"]
    assert_sandboxes_gone(workspaces, before)


def test_a_timed_out_rollout_closes_its_sandbox_once_the_running_command_ends(load, workspaces):
    # verifiers cancels the rollout after 10 s, mid-step: time enough for the env's start on a loaded machine (with 1 s
    # the rollout was cancelled before its first step there), and the step's command ends at its own timeout
    env = load(command_timeout=20)
    env.set_kwargs(timeout_seconds=10.0)
    sleep = "DISCUSSION\nWait.\n```\nsleep 600\n```"
    before = live_children()
    started = time.monotonic()
    with Endpoint(by_turn([sleep])) as endpoint:
        (output,) = evaluate(env, endpoint.url)
    # the step verifiers gave up on ran to its end in the env before the env was closed
    assert output["stop_condition"] == "timeout_reached" and output["info"]["mlgym"]["steps"] == 1
    assert time.monotonic() - started < 300  # the command's timeout (20 s) ended the step, not the sleep (600 s)
    assert_sandboxes_gone(workspaces, before)


def test_tool_calls_go_both_ways_natively(load, workspaces):
    env = load(parser="tool_calls", template="tool_calling")
    assert "validate" in [tool.name for tool in env.tool_defs]

    def called(name: str, call_id: str) -> dict[str, Any]:
        reply = completion("")
        reply["body"]["choices"][0].update(finish_reason="tool_calls", message={
            "role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]})
        return reply

    with Endpoint(by_turn([called("validate", "call_a"), called("submit", "call_b")])) as endpoint:
        (output,) = evaluate(env, endpoint.url)
    ours = in_process([encode_call("validate", {}, "call_a"), encode_call("submit", {}, "call_b")], 0,
                      parser="tool_calls", template="tool_calling")
    assert "validate" in [tool["function"]["name"] for tool in endpoint.requests[0]["tools"]]
    answered = endpoint.requests[1]["messages"][-1]
    assert answered["role"] == "tool" and answered["tool_call_id"] == "call_a"
    assert answered["content"] == ours["messages"][2]
    assert output["info"]["mlgym"]["exit_status"] == "submitted"
    assert output["reward"] == pytest.approx(sum(ours["rewards"]))


def test_the_policy_sees_what_the_history_processor_shows(load, workspaces):
    env = load(history="last_n_observations")
    answers = [LS] * 7 + [SKIP]
    with Endpoint(by_turn(answers)) as endpoint:
        (output,) = evaluate(env, endpoint.url)
    with MLGymRegistryEnv(TASK, history="last_n_observations") as ours:
        ours.reset(seed=0)
        for answer in answers[:-1]:
            ours.step(answer)
        shown = ours.messages
    last = endpoint.requests[-1]["messages"]
    assert [m["content"] for m in last] == [m["content"] for m in shown]
    assert any(m["content"].startswith("(Earlier output hidden") for m in last)
    assert output["info"]["mlgym"]["exit_status"] == "skipped"
    # the completion is the whole conversation, not the last view
    assert len(output["completion"]) == 2 * len(answers)


def test_seeds_and_rows(load):
    env = load(episodes=3, seed=10)
    rows = env.get_eval_dataset()
    assert [row["info"]["mlgym"]["seed"] for row in rows] == [10, 11, 12]
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user"]
    assert load(seed=None).get_eval_dataset(n=1)[0]["info"]["mlgym"]["seed"] is None
    with pytest.raises(RuntimeError, match="episodes"):
        load(episodes=0)


# -- vf-eval, verifiers' command line -----------------------------------------------------------------------------
@pytest.mark.slow
def test_vf_eval_finds_and_plays_the_face(tmp_path, workspaces):
    out = tmp_path / "results"
    args = json.dumps({"task": TASK, "max_steps": 5, "workspace_dir": str(workspaces)})
    with Endpoint(by_turn([LS, VALIDATE, SUBMIT])) as endpoint:
        result = subprocess.run(
            [str(Path(sys.executable).with_name("vf-eval")), ENV_ID, "-a", args, "-m", MODEL, "-b", endpoint.url,
             "-k", "TEST_KEY", "-n", "1", "-r", "1", "-d", "-s", "-o", str(out)],
            env={**os.environ, "TEST_KEY": "test"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (saved,) = [json.loads(line) for path in out.rglob("results.jsonl") for line in path.read_text().splitlines()]
    ours = in_process([LS, VALIDATE, SUBMIT], 0, max_steps=5)
    assert saved["info"]["mlgym"]["exit_status"] == "submitted"
    assert saved["reward"] == pytest.approx(sum(ours["rewards"]))
    assert not list(workspaces.iterdir())


# -- a real model --------------------------------------------------------------------------------------------------
@pytest.mark.serve
@pytest.mark.slow
def test_transformers_serve_plays_an_episode_as_in_process(served, load, workspaces):
    env = load(max_steps=2)
    (output,) = evaluate(env, served.url, served.model, sampling_args={"max_tokens": 16, "temperature": 0.0})
    replies = [m["content"] or "" for m in output["completion"] if m["role"] == "assistant"]
    ours = in_process(replies, 0, max_steps=2)
    outcome = output["info"]["mlgym"]
    assert replies and outcome["steps"] == len(ours["rewards"])
    assert outcome["exit_status"] == ours["info"]["exit_status"] and outcome["exit_status"].startswith("autosubmission")
    assert output["reward"] == pytest.approx(sum(ours["rewards"]))
