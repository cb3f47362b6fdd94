"""The openai policy against real HTTP servers: ``transformers serve`` over the tiny model, and a scripted endpoint.

The scripted endpoint (``Endpoint``, ``http.server`` in a thread) answers each chat completion from a list of replies,
so that rate limits, server errors, dropped connections, refused keys and context overflows happen on demand; the
policy talks to it through the real ``openai`` client. ``transformers serve`` is started once for the module, as the
module begins, so that it loads while the other tests run.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from model_server import ANSWER, MODEL, RESET, Endpoint, Reply, TinyServer, closed_port, completion, error

from mlgym_registry.cli import main as cli_main
from mlgym_registry.policies import PolicyError, PolicyText, make_policy
from mlgym_registry.records.trajectories import load_results, load_traj

pytest.importorskip("openai")

TASK = "prisonersDilemma"

def policy(endpoint: Endpoint, **options: Any):
    """The openai policy on ``endpoint``, with quick retries."""
    return make_policy(f"openai:{MODEL}", **{"base_url": endpoint.url, "backoff": 0.01, "max_backoff": 0.05, **options})


def conversation(turns: int) -> list[dict[str, str]]:
    """The system message, the task, then ``turns`` answers each followed by an observation."""
    messages = [{"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "TASK"}]
    for turn in range(turns):
        messages += [{"role": "assistant", "content": f"answer {turn}"}, {"role": "user", "content": f"output {turn}"}]
    return messages


# -- retries ------------------------------------------------------------------------------------------------------
def test_a_rate_limit_is_retried_after_what_retry_after_asks(monkeypatch):
    slept: list[float] = []
    real_sleep = time.sleep

    def recorded_sleep(seconds: float) -> None:  # the waits this thread asks for, not how long they took
        if threading.current_thread() is threading.main_thread():
            slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", recorded_sleep)
    with Endpoint([error(429, "Rate limit reached", code="rate_limit_exceeded", kind="requests",
                         headers={"Retry-After": "0"}), completion()]) as endpoint:
        agent = policy(endpoint, backoff=30, max_backoff=60)  # the backoff instead would wait 15 s or more
        assert agent(conversation(0)) == ANSWER
    assert slept == [0]
    assert len(endpoint.requests) == 2
    stats = agent.stats()
    assert (stats["api_calls"], stats["api_retries"]) == (1, 1)
    assert (stats["tokens_sent"], stats["tokens_received"]) == (11, 7)


def test_server_errors_and_dropped_connections_are_retried_with_backoff():
    with Endpoint([error(500, "boom", kind="server_error"), RESET, error(503, "loading"), completion()]) as endpoint:
        agent = policy(endpoint)
        assert agent(conversation(0)) == ANSWER
        assert agent(conversation(1)) == ANSWER
    assert len(endpoint.requests) == 5
    assert agent.stats()["api_calls"] == 2 and agent.stats()["api_retries"] == 3
    assert agent.stats()["tokens_sent"] == 22


def test_retries_are_bounded():
    with Endpoint([error(502, "bad gateway", kind="server_error")]) as endpoint:
        agent = policy(endpoint, max_retries=2)
        with pytest.raises(PolicyError) as caught:
            agent(conversation(0))
    assert len(endpoint.requests) == 3
    message = str(caught.value)
    assert endpoint.url in message and "502" in message and "3 times" in message and "\n" not in message


def test_a_refused_key_is_one_line_naming_the_url_and_the_fix():
    with Endpoint([error(401, "Incorrect API key provided: sk-bad.", code="invalid_api_key")]) as endpoint:
        with pytest.raises(PolicyError) as caught:
            policy(endpoint)(conversation(0))
    assert len(endpoint.requests) == 1  # never retried
    message = str(caught.value)
    assert "\n" not in message
    assert endpoint.url in message and "401" in message and "OPENAI_API_KEY" in message and "--api-key-env" in message


def test_an_unknown_model_lists_the_models_served():
    with Endpoint([error(404, "The model `test-model` does not exist.", code="model_not_found")],
                  models=("m1", "m2")) as endpoint:
        with pytest.raises(PolicyError, match=r"model 'test-model' is not served at .*: m1, m2 .*openai:m1"):
            policy(endpoint)(conversation(0))


def test_the_key_comes_from_the_variable_named(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-mine")
    with Endpoint([completion()]) as endpoint:
        policy(endpoint, api_key_env="MY_KEY")(conversation(0))
    assert endpoint.keys == ["Bearer sk-mine"]
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(PolicyError, match="the environment variable MY_KEY is not set"):
        policy(endpoint, api_key_env="MY_KEY")


# -- context overflow ---------------------------------------------------------------------------------------------
OVERFLOWS = {
    "openai": lambda: error(400, "This model's maximum context length is 128000 tokens. However, your messages "
                                 "resulted in 130000 tokens. Please reduce the length of the messages.",
                            code="context_length_exceeded"),
    "vllm": lambda: error(400, "This model's maximum context length is 4096 tokens. However, you requested 5000 "
                               "tokens (4000 in the messages, 1000 in the completion). Please reduce the length of "
                               "the messages or completion.", kind="BadRequestError", code=400),
    "vllm-v1": lambda: error(400, "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
                                  "Make sure that `max_model_len` is no smaller than the number of text tokens.",
                             kind="BadRequestError", code=400),
}


@pytest.mark.parametrize("server", sorted(OVERFLOWS))
def test_an_overflow_drops_the_oldest_turns_and_keeps_the_window(server):
    def fits(request: dict[str, Any]) -> Reply:
        return completion() if len(request["messages"]) <= 6 else OVERFLOWS[server]()

    with Endpoint(fits) as endpoint:
        agent = policy(endpoint, max_retries=0)  # trimming is not a retry
        assert agent(conversation(4)) == ANSWER
        kept = endpoint.requests[-1]["messages"]
        assert [m["content"] for m in kept] == ["SYSTEM", "TASK", "answer 2", "output 2", "answer 3", "output 3"]
        assert len(endpoint.requests) == 3 and agent.stats()["context_trims"] == 2
        # the next turn sends as many of the latest turns as fitted, at once
        assert agent(conversation(5)) == ANSWER
        assert [m["content"] for m in endpoint.requests[-1]["messages"]][2:] == ["answer 3", "output 3", "answer 4",
                                                                                 "output 4"]
        assert len(endpoint.requests) == 4
        agent.reset()
        assert agent(conversation(1)) == ANSWER and len(endpoint.requests[-1]["messages"]) == 4
    assert agent.stats()["context_trims"] == 0 and agent.stats()["api_calls"] == 1


def test_an_overflow_that_trimming_cannot_fix_answers_exit_context():
    with Endpoint([OVERFLOWS["openai"]()]) as endpoint:
        agent = policy(endpoint)
        answer = agent(conversation(2))
    assert answer.endswith("```\nexit_context\n```")
    assert [len(request["messages"]) for request in endpoint.requests] == [6, 4]  # all turns, then the last one
    assert agent.stats()["api_calls"] == 0 and agent.stats()["context_trims"] == 1


def test_an_unfixable_overflow_ends_the_episode_as_mlgym_does(tmp_path, capsys):
    out = tmp_path / "run"
    with Endpoint([OVERFLOWS["vllm"]()]) as endpoint:
        status = cli_main(["run", TASK, "--policy", f"openai:{MODEL}", "--base-url", endpoint.url, "--seed", "0",
                           "--out", str(out), "--quiet"])
    assert status == 0, capsys.readouterr().err
    trajectory = load_traj(out / f"{TASK}.traj")
    assert trajectory.info["exit_status"] == "autosubmission (exit_context)"
    assert [step.action.strip() for step in trajectory.steps] == ["exit_context"]
    assert trajectory.info["model_stats"]["api_calls"] == 0


# -- the command line ---------------------------------------------------------------------------------------------
def test_an_unreachable_endpoint_fails_the_run_in_one_line_and_keeps_the_files(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    out = tmp_path / "run"
    status = cli_main(["run", TASK, "--policy", f"openai:{MODEL}", "--base-url", url, "--max-retries", "1",
                       "--timeout", "5", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("mlgym-registry: error: cannot reach " + url)
    assert "start the server or pass --base-url" in err[0]
    trajectory = load_traj(out / f"{TASK}.traj")  # valid JSON, with the prompt the model never answered
    assert trajectory.steps == [] and [m["role"] for m in trajectory.history] == ["system", "user"]
    assert load_results(out / "results.json")["failed"].startswith("PolicyError: cannot reach")


def test_a_failure_mid_episode_records_the_steps_so_far_and_why(tmp_path, capsys):
    out = tmp_path / "run"
    with Endpoint([completion(), error(403, "key revoked")]) as endpoint:
        status = cli_main(["run", TASK, "--policy", f"openai:{MODEL}", "--base-url", endpoint.url, "--price-in", "2",
                           "--price-out", "10", "--out", str(out), "--quiet"])
    assert status == 2
    assert "refused the API key" in capsys.readouterr().err
    trajectory = load_traj(out / f"{TASK}.traj")
    assert [step.action.strip() for step in trajectory.steps] == ["ls -a"]
    stats = trajectory.info["model_stats"]
    assert list(stats)[:6] == ["total_cost", "task_cost", "tokens_sent", "tokens_received", "api_calls",
                               "instance_cost"]  # MLGym's keys in its order, then its log's name for task_cost
    assert (stats["api_calls"], stats["tokens_sent"], stats["tokens_received"]) == (1, 11, 7)
    assert stats["instance_cost"] == stats["task_cost"] == stats["total_cost"] == pytest.approx((11 * 2 + 7 * 10) / 1e6)
    assert load_results(out / "results.json")["failed"].startswith("PolicyError:")


@pytest.mark.parametrize("problem", ["unreachable", "unknown model"])
def test_runs_in_worker_processes_check_the_endpoint_before_starting_them(problem, tmp_path, capsys):
    out = tmp_path / "run"
    with Endpoint([completion()], models=("m1", "m2")) as endpoint:
        url = f"http://127.0.0.1:{closed_port()}/v1" if problem == "unreachable" else endpoint.url
        status = cli_main(["run", TASK, "--policy", f"openai:{MODEL}", "--base-url", url, "--max-retries", "0",
                           "--num-envs", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert ("cannot reach " + url if problem == "unreachable" else "the server serves: m1, m2") in err[0]
    assert endpoint.requests == [] and not out.exists()


def test_openai_options_are_refused_for_other_policies(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(["run", TASK, "--policy", "scripted", "--temperature", "0.2", "--out", str(out)]) == 2
    assert "--temperature: only the openai policy takes these options" in capsys.readouterr().err
    assert cli_main(["run", TASK, "--policy", "openai:m", "--top-p", "2", "--out", str(out)]) == 2
    assert "top_p must be a number in (0, 1]" in capsys.readouterr().err
    assert not out.exists()


def test_the_policy_travels_to_workers_as_its_options():
    import pickle

    text = PolicyText("openai:m", {"base_url": "http://127.0.0.1:1/v1", "temperature": 0.5})
    again = pickle.loads(pickle.dumps(text))
    assert again == "openai:m" and again.options == text.options
    rebuilt = make_policy(again)
    assert rebuilt.url == "http://127.0.0.1:1/v1" and rebuilt.sampling == {"temperature": 0.5}
    assert pickle.loads(pickle.dumps(rebuilt)).model == "m"


# -- a real server: transformers serve over the tiny model --------------------------------------------------------
@pytest.fixture
def tiny_server(served) -> TinyServer:
    """``transformers serve`` over the tiny model, answering: the session's (``served``, tests/conftest.py)."""
    return served


@pytest.mark.serve
@pytest.mark.slow
def test_an_episode_through_transformers_serve_records_model_stats(tiny_server, tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "run"
    before = tiny_server.chat_requests()
    status = cli_main(["run", TASK, "--policy", f"openai:{tiny_server.model}", "--base-url", tiny_server.url,
                       "--max-steps", "2", "--max-tokens", "16", "--temperature", "0", "--seed", "0", "--out",
                       str(out), "--quiet"])
    assert status == 0, capsys.readouterr().err
    trajectory = load_traj(out / f"{TASK}.traj")
    calls = tiny_server.chat_requests() - before
    stats = trajectory.info["model_stats"]
    # the tiny model writes garbage: format errors until the env ends the episode
    assert calls == len(trajectory.steps) == stats["api_calls"] >= 1
    assert trajectory.info["exit_status"].startswith("autosubmission")
    assert 0 < stats["tokens_received"] <= 16 * calls
    # what the server counted is the chat template's length of each conversation the model answered
    tokenizer = AutoTokenizer.from_pretrained(tiny_server.model, local_files_only=True)
    answered = [index for index, item in enumerate(trajectory.history) if item["role"] == "assistant"]
    prompts = [[{"role": m["role"], "content": m["content"]} for m in trajectory.history[:index]] for index in answered]
    expected = sum(len(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False)) for chat in prompts)
    assert stats["tokens_sent"] == expected
    assert stats["total_cost"] == stats["instance_cost"] == 0.0
    assert load_results(out / "results.json")["agent"]
    print(f"transformers serve answered after {tiny_server.ready_after:.1f} s")


@pytest.mark.slow
def test_a_suite_in_worker_processes_records_model_stats_and_a_policy_that_gave_up(tmp_path, capsys):
    out = tmp_path / "suite"
    submit = completion("DISCUSSION\nThe starter strategy will do.\n```\nsubmit\n```", prompt_tokens=40)
    with Endpoint([submit, error(403, "key revoked")]) as endpoint:  # one run is answered, the other refused
        status = cli_main(["bench", TASK, "--policy", f"openai:{MODEL}", "--base-url", endpoint.url, "--runs", "2",
                           "--num-envs", "2", "--seed", "0", "--out", str(out), "--quiet"])
    assert status == 1  # one run did not end well
    assert len(endpoint.requests) == 2  # a worker done with its episodes calls the model no more
    runs = {}
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):  # beside settings.json
        runs[folder.name] = (load_traj(folder / f"{TASK}.traj"), load_results(folder / "results.json"))
    assert sorted(runs) == [f"{MODEL}__{TASK}__run_0", f"{MODEL}__{TASK}__run_1"]
    answered = [t for t, r in runs.values() if "failed" not in r]
    refused = [(t, r) for t, r in runs.values() if "failed" in r]
    assert len(answered) == len(refused) == 1
    assert answered[0].info["model_stats"]["api_calls"] == 1 and answered[0].info["model_stats"]["tokens_sent"] == 40
    trajectory, results = refused[0]
    assert results["failed"].startswith("PolicyError:") and "refused the API key" in results["failed"]
    assert trajectory.info["exit_status"].startswith("autosubmission")  # MLGym's exit_api: the run is scored
    assert trajectory.info["model_stats"]["api_calls"] == 0
