"""History processors: what of the conversation the policy sees. The env keeps the whole conversation at
``conversation``; the processor shapes ``("history", "prompt")``, the prompt text and the prompt tokens."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import run_cli
from standin import registered_standin
from torchrl.envs.utils import check_env_specs

from mlgym_registry import ComponentOutputError, TaskSpec, registry
from mlgym_registry.components.history_processors import FullHistory, LastNObservations, TokenBudget
from mlgym_registry.testing import ConformanceError, check_history_processor, example_conversation
from mlgym_registry.testing.tiny_model import tiny_tokenizer
from mlgym_registry.transforms.history import as_dicts
from mlgym_registry.transforms.rendering import ChatRenderer

SPEC = TaskSpec(id="historyGame", description="Play the game.", baseline_scores=[{"Score": 1.0}], max_steps=500)
OUTPUT = "line one\nline two\nline three"


def fenced(turn: int) -> str:
    return f"DISCUSSION\nTurn {turn}.\n```\necho {turn}\n```"


@pytest.fixture
def standin():
    with registered_standin("standin_history") as made:
        yield made


@pytest.fixture
def small_processors():
    """Processors that act within a few turns: the last 2 observations, and a budget of ~700 characters."""
    registry.register("history", "last_two", LastNObservations(2))
    registry.register("history", "small_budget", TokenBudget(700, chars_per_token=1.0, per_message=0, drop_step=2))
    try:
        yield {"last_two": LastNObservations(2),
               "small_budget": TokenBudget(700, chars_per_token=1.0, per_message=0, drop_step=2)}
    finally:
        registry.unregister("history", "last_two")
        registry.unregister("history", "small_budget")


# -- the processors themselves -----------------------------------------------------------------------------------
def test_last_n_observations_shows_the_task_and_the_last_n_outputs_and_notes_the_rest():
    messages = example_conversation(6, output_lines=4)
    before = copy.deepcopy(messages)
    shown = LastNObservations(2)(messages)
    assert messages == before
    assert [m["role"] for m in shown] == [m["role"] for m in messages]
    users = [m["content"] for m in shown if m["role"] == "user"]
    assert users[0] == messages[1]["content"]
    assert users[1:5] == ["(Earlier output hidden to save space: 5 lines.)"] * 4
    assert users[5:] == [messages[-3]["content"], messages[-1]["content"]]
    # kept messages are the given objects: the chain reuses what it built for them
    assert all(shown[i] is messages[i] for i in (0, 1, 2, 4, 11, 12, 13))
    assert LastNObservations(5)(messages[:12]) == messages[:12]


@pytest.mark.parametrize("n", [0, -1, True, 2.5])
def test_last_n_observations_refuses_a_bad_n(n):
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        LastNObservations(n)


def test_token_budget_keeps_a_conversation_that_fits():
    messages = example_conversation(3)
    shown = TokenBudget(10_000)(messages)
    assert len(shown) == len(messages) and all(a is b for a, b in zip(shown, messages, strict=True))


def test_token_budget_drops_the_oldest_turns_a_few_at_a_time_and_says_so():
    messages = example_conversation(30)
    budget = TokenBudget(1500, chars_per_token=1.0, per_message=0, drop_step=4)
    shown = budget(messages)
    assert shown[0] is messages[0]
    dropped = (len(messages) - len(shown)) // 2
    assert dropped % 4 == 0 and dropped > 0
    assert shown[1]["content"] == (f"{messages[1]['content']}\n\n({dropped} earlier turns of this episode left out "
                                   "to fit the context.)")
    assert shown[2:] == messages[2 + 2 * dropped:] and shown[-1] is messages[-1]
    assert sum(len(m["content"]) for m in shown) <= 1500 + len(shown[1]["content"]) - len(messages[1]["content"])
    # dropping fewer turns would not fit (rounded up to drop_step, never past the budget)
    fewer = messages[:2] + messages[2 + 2 * (dropped - 4):]
    assert sum(len(m["content"]) for m in fewer) > 1500
    # turn after turn, the cut moves only every few turns, so the prompt's beginning mostly stays the same
    notes = [budget(example_conversation(turns))[1]["content"] for turns in range(30, 42)]
    assert len(set(notes)) <= 4


def test_token_budget_keeps_the_latest_turn_even_when_it_alone_is_over_budget():
    messages = example_conversation(3)
    messages[-1] = {"role": "user", "content": "x" * 5000}
    shown = TokenBudget(100, chars_per_token=1.0)(messages)
    assert shown[-2:] == messages[-2:] and len(shown) == 4
    assert "2 earlier turns" in shown[1]["content"]


def test_token_budget_counts_with_the_envs_tokenizer():
    tokenizer = tiny_tokenizer()
    budget = TokenBudget(per_message=3)
    budget.set_tokenizer(tokenizer)
    message = {"role": "user", "content": "ls -a\nvalidate"}
    assert budget.count(message) == len(tokenizer(message["content"], add_special_tokens=False)["input_ids"]) + 3
    assert TokenBudget(per_message=0).count(message) == 4  # 14 characters, 4 per token


def test_the_built_in_processors_pass_the_conformance_kit():
    for processor in (FullHistory(), LastNObservations(), LastNObservations(1), TokenBudget(200)):
        check_history_processor(processor)


def test_the_kit_names_what_a_broken_processor_does_wrong():
    def drops_latest(messages):
        return messages[:-1] or messages

    def mutates(messages):
        messages[0]["content"] = "changed"
        return messages

    with pytest.raises(ConformanceError, match="does not end with the latest message"):
        check_history_processor(drops_latest)
    with pytest.raises(ConformanceError, match="changed the messages it was given"):
        check_history_processor(mutates)
    with pytest.raises(ConformanceError, match="non-empty list"):
        check_history_processor(lambda messages: None)


# -- in the env ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("input_mode", ["history", "tokens"])
@pytest.mark.parametrize("name", ["last_two", "small_budget"])
def test_the_policy_sees_the_processors_view_and_the_env_keeps_everything(standin, small_processors, name,
                                                                           input_mode):
    tokenizer = tiny_tokenizer() if input_mode == "tokens" else None
    env = registry.make(SPEC, backend="standin_history", history=name, batch_size=(), input_mode=input_mode,
                        tokenizer=tokenizer, outputs=lambda action: OUTPUT)
    renderer = ChatRenderer(tokenizer)
    processor = small_processors[name]
    td = env.reset()
    changed_views = 0
    for turn in range(14):
        conversation = as_dicts(td["conversation"])
        view = as_dicts(td["history", "prompt"])
        assert len(conversation) == 2 + 2 * turn
        assert view == processor(conversation)
        changed_views += view != conversation
        prompt = td["text", "prompt"]
        assert prompt == renderer.render(view)
        if tokenizer is not None:
            assert tokenizer.decode(td["tokens", "prompt"].tolist()) == prompt
        td["text", "response"] = fenced(turn)
        td = env.step_mdp(env.step(td))
    assert changed_views >= 8
    assert as_dicts(td["conversation"])[-1]["content"].startswith(OUTPUT)
    env.close()


def test_the_batched_env_with_a_processor_passes_torchrls_spec_check_and_keeps_both_histories(standin):
    env = registry.make(SPEC, backend="standin_history", history="last_n_observations",
                        outputs=lambda action: OUTPUT)
    check_env_specs(env)
    td = env.reset()
    for turn in range(9):
        td["text", "response"] = [fenced(turn)]
        td = env.step_mdp(env.step(td))
    assert td["conversation"].shape == (1, 20) and td["history", "prompt"].shape == (1, 20)
    notes = [c for c in td["history", "prompt"].content[0] if c.startswith("(Earlier output hidden")]
    assert len(notes) == 4  # 10 user messages: the task and the last 5 in full
    assert not any(c.startswith("(Earlier output hidden") for c in td["conversation"].content[0])
    env.close()


def test_full_is_the_default_and_adds_nothing_to_the_tensordict(standin):
    assert registry.spec("prisonersDilemma").history == "full"
    env = registry.make(SPEC, backend="standin_history", batch_size=())
    td = env.reset()
    assert "conversation" not in td.keys()
    env.close()


def test_a_processor_that_returns_no_messages_is_named_in_the_error(standin):
    registry.register("history", "broken_view", lambda messages: "not a list")
    try:
        env = registry.make(SPEC, backend="standin_history", history="broken_view", batch_size=())
        with pytest.raises(ComponentOutputError, match=r"history processor 'broken_view' .*returned 'not a list'"):
            env.reset()
        env.close()
    finally:
        registry.unregister("history", "broken_view")


def test_an_unknown_processor_is_refused_with_the_names_there_are():
    with pytest.raises(Exception, match="last_n_observations") as info:
        registry.make("prisonersDilemma", history="last_n_observation")
    assert "did you mean" in str(info.value).lower() or "last_n_observations" in str(info.value)


# -- the command line ------------------------------------------------------------------------------------------------
def test_list_info_and_check_know_the_history_kind():
    listed = run_cli("list", "--kind", "history")
    assert listed.returncode == 0, listed.stderr
    for name in ("full", "last_n_observations", "token_budget"):
        assert name in listed.stdout
    info = run_cli("info", "last_n_observations", "--kind", "history")
    assert info.returncode == 0, info.stderr
    assert "history_processors:LastNObservations" in info.stdout
    checked = run_cli("check", "--kind", "history", "token_budget")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.split()[:3] == ["ok", "history", "token_budget"]


@pytest.mark.slow
def test_run_with_history_plays_an_episode_and_records_everything(tmp_path):
    done = run_cli("run", "prisonersDilemma", "--policy", "scripted", "--seed", "0", "--history",
                   "last_n_observations", "--out", str(tmp_path / "run"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    traj = json.loads(next((tmp_path / "run").rglob("*.traj")).read_text())
    assert traj["info"]["exit_status"] in ("submitted", "autosubmission (max_steps)")
    contents = [item["content"] for item in traj["history"]]
    assert not any(c.startswith("(Earlier output hidden") for c in contents)
