"""End to end through ``registry.make`` with the default components and a stand-in backend registered in-process."""

from __future__ import annotations

import gc

import pytest
import torch
from standin import COMMAND_DOCS, StandinBackend
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from mlgym_registry import TaskSpec, registry
from mlgym_registry.components.isolators import guard_multiline_input
from mlgym_registry.components.parsers import NO_ACTION
from mlgym_registry.transforms.chain import CHAIN_OPTIONS, build_env
from mlgym_registry.transforms.layout import LAYOUTS

BASELINE = 2.0
SPEC = TaskSpec(
    id="toyGame", description="Write a strategy that beats the opponent.", baseline_scores=[{"Score": BASELINE}],
    max_steps=12,
)
PENALTY = -0.5


def fenced(command: str, thought: str = "DISCUSSION\nLet me do this.") -> str:
    return f"{thought}\n```\n{command}\n```\n"


class Backends:
    """Every stand-in backend the registered factory made, with the options it was made with."""

    def __init__(self):
        self.made: list[StandinBackend] = []
        self.options: dict = {}

    def __call__(self, spec, **options):
        backend = StandinBackend(spec, **{**self.options, **options})
        self.made.append(backend)
        return backend

    @property
    def last(self) -> StandinBackend:
        return self.made[-1]


@pytest.fixture
def backends():
    made = Backends()
    registry.register("backend", "standin_chain", made)
    try:
        yield made
    finally:
        registry.unregister("backend", "standin_chain")


def make(backends, layout="default", **options):
    """The chain's own unbatched env (test_training_shapes.py covers the batched one ``make`` gives)."""
    options.setdefault("batch_size", ())
    return registry.make(SPEC, backend="standin_chain", layout=layout, reward_wrong_format=PENALTY, **options)


def step(env, td, response):
    layout = env.base_env.layout
    td.set(layout.response, response)
    td = env.step(td)
    return td["next"], env.step_mdp(td)


def test_chain_options_are_the_contract():
    assert set(CHAIN_OPTIONS) >= {"tokenizer", "chat_template_name", "reward_wrong_format", "device", "layout"}


@pytest.mark.parametrize("layout", ["default", "seed"])
def test_reset_gives_system_and_first_user_message(backends, layout):
    env = make(backends, layout)
    keys = LAYOUTS[layout]
    td = env.reset()
    history = td[keys.history]
    assert history.role == ["system", "user"]
    assert COMMAND_DOCS in history.content[0]
    assert SPEC.description in history.content[1]
    assert '(Current directory: /home/agent/workspace)' in history.content[1]
    assert "(Current Step: 0, Remaining Steps: 12)" in history.content[1]
    assert td[keys.message] == history.content[1]
    prompt = td[keys.prompt]
    assert prompt == (
        f"<|im_start|>system\n{history.content[0]}<|im_end|>\n<|im_start|>user\n{history.content[1]}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert backends.last.resets == 1 and backends.last.tools_installed == 1
    assert backends.last.communicated == ["state"]
    assert td["retry"].item() is False
    env.close()


def test_episode_validate_submit_and_retry(backends):
    backends.options = {"outputs": ["evaluate.py  strategy.py"], "scores": [{"Score": 2.4}, {"Score": 2.75}]}
    env = make(backends, reward="mlgym_score_delta")  # the reference chain's reward: score - baseline at each one
    td = env.reset()
    backend = backends.last

    # a fenced command steps the backend with exactly the isolated action; its output is in this step's message
    nxt, td = step(env, td, fenced("ls -a"))
    assert backend.actions == ["ls -a"]
    assert nxt["message"].startswith("evaluate.py  strategy.py\n(Current Step: 1, Remaining Steps: 11)")
    assert nxt["reward"].item() == 0.0 and not nxt["retry"] and not nxt["done"].item()
    assert nxt["history", "prompt"].role[-2:] == ["assistant", "user"]
    assert nxt["history", "prompt"].content[-2] == fenced("ls -a")

    # no code block: retry, the backend is not stepped, penalty, and the conversation continues
    nxt, td = step(env, td, "I think I should look at the files first.")
    assert backend.actions == ["ls -a"]
    assert nxt["retry"].item() is True
    assert nxt["reward"].item() == PENALTY
    assert not nxt["done"].item()
    assert "could not be used" in nxt["message"]
    assert nxt["history", "prompt"].content[-2] == "I think I should look at the files first."
    assert nxt["state"] == td["state"]

    # the next good response steps normally
    nxt, td = step(env, td, fenced("validate"))
    assert backend.actions == ["ls -a", "validate"]
    assert nxt["retry"].item() is False
    assert "Evaluation Score: {'Score': 2.4}" in nxt["message"]
    assert nxt["reward"].item() == pytest.approx(2.4 - BASELINE)

    # a multi-line edit reaches the backend heredoc-guarded, exactly as the isolator produced it
    edit = "edit 1:2\ndef row_strategy(history):\n    return 1\nend_of_edit"
    nxt, td = step(env, td, fenced(edit))
    assert backend.actions[-1] == guard_multiline_input(edit).strip()
    assert backend.actions[-1] != edit

    # submit: the final score (only in info["score"]) gives the reward of that same step
    nxt, td = step(env, td, fenced("submit"))
    assert backend.actions[-1] == "submit"
    assert nxt["done"].item() and nxt["terminated"].item()
    assert nxt["reward"].item() == pytest.approx(2.75 - BASELINE)
    env.close()
    assert backend.closed


def test_running_out_of_steps_is_a_truncation(backends):
    backends.options = {"scores": [{"Score": 2.5}], "max_steps": 2}
    env = make(backends)
    td = env.reset()
    for _ in range(2):
        nxt, td = step(env, td, fenced("ls"))
        assert not nxt["done"].item()
    nxt, td = step(env, td, fenced("ls"))
    assert nxt["done"].item() and nxt["truncated"].item() and not nxt["terminated"].item()
    assert nxt["message"].startswith("Exited (max_steps)")
    assert nxt["reward"].item() == pytest.approx(2.5 - BASELINE)
    assert backends.last.actions == ["ls"] * 3
    env.close()


def test_next_response_after_reset_starts_a_new_conversation(backends):
    env = make(backends)
    td = env.reset()
    _, td = step(env, td, fenced("ls"))
    td = env.reset()
    assert td["history", "prompt"].role == ["system", "user"]
    nxt, _ = step(env, td, fenced("pwd"))
    assert nxt["history", "prompt"].shape == (4,)
    assert backends.last.actions == ["ls", "pwd"]
    assert backends.last.resets == 2
    env.close()


@pytest.mark.parametrize("layout", ["default", "seed"])
def test_rollout_and_check_env_specs(backends, layout):
    env = make(backends, layout)
    check_env_specs(env)
    keys = LAYOUTS[layout]

    def policy(td: TensorDict) -> TensorDict:
        td.set(keys.response, fenced("ls"))
        return td

    rollout = env.rollout(5, policy)
    assert rollout.batch_size == (5,)
    assert rollout[-1]["next"][keys.history].shape == (12,)
    assert backends.last.actions[-5:] == ["ls"] * 5
    env.close()


def test_seed_layout_has_the_reference_flat_keys(backends):
    env = make(backends, "seed")
    td = env.reset()
    # the reference's keys, plus ours: how the step's evaluation ended, the flag a trainer masks infra errors on and
    # the step's facts (thought, action, format error)
    assert set(td.keys()) == {"history", "text", "message", "state", "retry", "observation", "done", "terminated",
                              "truncated", "evaluation_status", "infra_error", "turn"}
    assert set(env.full_action_spec.keys()) == {"text_response"}
    nxt, _ = step(env, td, fenced("ls"))
    assert {"history", "text", "message", "state", "retry", "reward", "observation"} <= set(nxt.keys())
    assert nxt["history"].content[-2] == fenced("ls")
    assert backends.last.actions == ["ls"]
    env.close()


def test_text_after_the_end_of_turn_marker_is_ignored(backends):
    env = make(backends)
    td = env.reset()
    nxt, _ = step(env, td, fenced("ls") + "<|im_end|>\n<|im_start|>user\n```\nrm -rf /\n```")
    assert backends.last.actions == ["ls"]
    assert nxt["history", "prompt"].content[-2] == fenced("ls")
    env.close()


def test_default_layout_speaks_torchrl_llm_keys(backends):
    from torchrl.modules.llm.policies import ChatHistory, Text

    env = make(backends)
    td = env.reset()
    assert isinstance(td["history"], ChatHistory) and isinstance(td["text"], Text)
    assert td["history"].prompt.role == ["system", "user"]
    assert td["text"].prompt.endswith("<|im_start|>assistant\n")
    assert list(env.full_action_spec.keys(True, True)) == [("text", "response")]
    env.close()


def test_stages_in_design_order(backends):
    env = registry.make(tasks=[SPEC, SPEC.replace(id="second")], backend="standin_chain")
    assert [type(t).__name__ for t in env.transform] == [
        "RetrySkip", "ActionIsolator", "ResetModule", "TaskSampler", "ReadState", "StateToMessage",
        "MessageToHistory", "ChatTemplate", "RewardAssigner", "ContextPolicy", "GroupKey", "ChatBatch",
    ]
    env.close()


def test_prisoners_dilemma_on_the_local_backend():
    """The real thing: our task, the default components and the local backend, from ``make`` to the final reward."""
    from mlgym_registry import BackendUnavailable

    try:
        env = registry.make("prisonersDilemma", reward_wrong_format=PENALTY)
        td = env.reset()
    except BackendUnavailable as exc:
        pytest.skip(f"local backend unavailable here: {exc}")
    baseline = registry.spec("prisonersDilemma").baseline_scores[0]["Score"]
    try:
        nxt, td = step(env, td, fenced("ls"))
        assert "strategy.py" in nxt["message"] and nxt["reward"].item() == 0.0
        nxt, td = step(env, td, "no command")
        assert nxt["retry"].item() and nxt["reward"].item() == PENALTY
        nxt, td = step(env, td, fenced("validate"))
        info = env.base_env.last_info
        assert "Evaluation Score" in nxt["message"]
        validated = info["score"][-1]["Score"]
        assert nxt["reward"].item() == pytest.approx(validated - baseline, abs=1e-5)
        nxt, td = step(env, td, fenced("submit"))
        info = env.base_env.last_info
        assert nxt["done"].item() and info["exit_status"] == "submitted"
        # the default reward (mlgym_best_improvement): the submission is final, it takes the episode's total to its
        # own score minus the baseline
        assert nxt["reward"].item() == pytest.approx(info["score"][-1]["Score"] - validated, abs=1e-5)
    finally:
        env.close()


def test_multi_task_sampling_is_seeded_and_swaps_backends(backends):
    other = SPEC.replace(id="otherGame", description="Another game.")
    resolved = [registry.resolve(s, backend="standin_chain")[0] for s in (SPEC, other)]

    def tasks_seen(seed: int) -> list[str]:
        env = build_env(resolved, multi_task=True, batch_size=())
        env.set_seed(seed)
        seen = []
        for _ in range(6):
            td = env.reset()
            seen.append(td["task"])
            description = {"toyGame": SPEC.description, "otherGame": other.description}[td["task"]]
            assert description in td["history", "prompt"].content[1]
            nxt, _ = step(env, td, fenced("ls"))
            assert nxt["task"] == td["task"]
        env.close()
        return seen

    first = tasks_seen(3)
    assert first == tasks_seen(3)
    assert set(first) == {"toyGame", "otherGame"}
    # a task change closes the previous backend; only the last one is left open, and env.close() closes it
    assert all(b.closed for b in backends.made)


def test_registry_make_with_tasks_list(backends):
    registry.register("task", "toyGame", SPEC)
    registry.register("task", "otherGame", SPEC.replace(id="otherGame"))
    try:
        env = registry.make(tasks=["toyGame", "otherGame"], backend="standin_chain")
        td = env.reset()
        assert td["task"] in {"toyGame", "otherGame"}
        env.close()
    finally:
        registry.unregister("task", "toyGame")
        registry.unregister("task", "otherGame")


def test_backend_closed_when_env_is_garbage_collected(backends):
    env = make(backends)
    env.reset()
    backend = backends.last
    del env
    gc.collect()
    assert backend.closed


def test_device_option(backends):
    env = make(backends, device="cpu")
    td = env.reset()
    nxt, _ = step(env, td, "no block")
    assert env.device == torch.device("cpu")
    assert nxt["reward"].device == torch.device("cpu")
    env.close()


def test_no_penalty_by_default(backends):
    env = registry.make(SPEC, backend="standin_chain")
    td = env.reset()
    nxt, _ = step(env, td, "no block here")
    assert nxt["retry"].item() is True and nxt["reward"].item() == 0.0
    env.close()


@pytest.mark.parametrize("name", ["chatml_format", "qwen", "llama", "falcon", "deepseek"])
def test_incremental_prompt_equals_a_full_render(backends, name):
    from mlgym_registry.transforms.rendering import ChatRenderer

    env = make(backends, chat_template_name=name)
    td = env.reset()
    for response in [fenced("ls"), "oops", fenced("validate"), fenced("open strategy.py")]:
        nxt, td = step(env, td, response)
        history = nxt["history", "prompt"]
        messages = [{"role": r, "content": c} for r, c in zip(history.role, history.content, strict=True)]
        assert nxt["text", "prompt"] == ChatRenderer(chat_template_name=name).render(messages, True)
    env.close()


def test_unknown_chat_template_name_is_a_clear_error(backends):
    with pytest.raises(ValueError, match="unknown chat_template_name 'nope'.*chatml_format"):
        make(backends, chat_template_name="nope")


def test_unknown_layout_is_a_clear_error(backends):
    with pytest.raises(ValueError, match="unknown layout 'flat'"):
        make(backends, layout="flat")


def test_tokenizer_path_that_does_not_exist(backends, tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        make(backends, tokenizer=str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "template",
    [
        # the prefix changes with every turn: each extension notices and renders in full
        "{{ messages | length }} turns:{% for m in messages %} {{ m['content'] }}{% endfor %}",
        # numbering: a window would number its turns from 1; the probe turns incremental rendering off
        "{% for m in messages %}{{ loop.index }}. {{ m['content'] }}\n{% endfor %}",
    ],
)
def test_templates_that_do_not_grow_by_appending_are_rendered_in_full(template):
    from mlgym_registry.transforms.rendering import ChatRenderer, IncrementalPrompt

    renderer = ChatRenderer()
    renderer.template = template
    prompt = IncrementalPrompt(renderer)
    messages = [{"role": "system", "content": "s"}] + [
        {"role": role, "content": f"{role}{i}"} for i in range(4) for role in ("user", "assistant")
    ]
    prompt.start(messages[:2])
    for end in (4, 6, 8):
        assert prompt.extend(messages[end - 2:end]) == renderer.render(messages[:end])


def test_numbering_template_disables_incremental_rendering():
    from mlgym_registry.transforms.rendering import ChatRenderer, IncrementalPrompt

    renderer = ChatRenderer()
    assert IncrementalPrompt(renderer).incremental  # chatml grows by appending
    renderer.template = "{% for m in messages %}{{ loop.index }}. {{ m['content'] }}\n{% endfor %}"
    assert not IncrementalPrompt(renderer).incremental


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # {error} is filled in, the shell braces are left alone
        ("Bad reply ({error}). Example: f() { echo; }", f"Bad reply ({NO_ACTION}). Example: f"),
        # not a format string at all: used as it is
        ("Bad reply ({error}). A lone } brace", "Bad reply ({error}). A lone } brace"),
    ],
)
def test_format_error_message_with_literal_braces(backends, template, expected):
    from mlgym_registry.components.template_set import TemplateSet
    from mlgym_registry.transforms.base import template_set

    base = template_set(registry.get("template", "mlgym_default"))
    registry.register("template", "odd_braces", TemplateSet(**{**base.__dict__, "format_error_template": template}))
    try:
        env = registry.make(SPEC, backend="standin_chain", template="odd_braces")
        td = env.reset()
        nxt, _ = step(env, td, "no block")
        assert nxt["message"].startswith(expected)
        assert "f() { echo; }" in nxt["message"] or "lone }" in nxt["message"]
        env.close()
    finally:
        registry.unregister("template", "odd_braces")


def test_each_step_writes_its_facts_once_and_parses_the_reply_once(backends):
    from mlgym_registry.components.parsers import ThoughtActionParser
    from mlgym_registry.transforms.turn_facts import TurnFacts

    reads = []

    def counting_parser(response):
        reads.append(response)
        return ThoughtActionParser()(response)

    registry.register("parser", "counting_chain", counting_parser)
    env = make(backends, parser="counting_chain", max_format_errors=2)
    try:
        td = env.reset()
        assert td["turn"] == TurnFacts("", "", "")
        reply = fenced("ls -a", thought="I look first.")
        nxt, td = step(env, td, reply)
        assert len(reads) == 1  # the isolator's parse gives the thought too
        thought, action = ThoughtActionParser()(reply)
        assert "I look first." in thought and action.strip() == "ls -a"
        assert nxt["turn"] == TurnFacts(thought, action, "")
        nxt, td = step(env, td, "no command here")
        assert nxt["retry"].item() is True and nxt["turn"].action == ""
        assert nxt["turn"].thought == "no command here" and nxt["turn"].format_error != ""
        nxt, td = step(env, td, "still no command")  # the second in a row ends the episode as MLGym's agent does
        assert (nxt["turn"].thought, nxt["turn"].action) == ("Exit due to format error", "exit_format")
        assert nxt["turn"].format_error != "" and nxt["done"].item() is True
        assert len(reads) == 3
    finally:
        env.close()
        registry.unregister("parser", "counting_chain")


def test_the_conversation_read_from_a_message_on_is_the_tail_of_the_whole(backends):
    from mlgym_registry.transforms.history import as_dicts, message_count

    env = registry.make(SPEC, backend="standin_chain")  # batched: a History of shape (1, n)
    try:
        layout = env.base_env.layout
        td = env.reset()
        for command in ("ls", "cat x", "ls -a"):
            td.set(layout.response, [fenced(command)])
            td = env.step_mdp(env.step(td))
        history = td[layout.history]
        whole = as_dicts(history)
        read_by_field = history[0]  # TorchRL's own way: each field's list (it reads every message)
        assert whole == [{"role": r, "content": c} for r, c in zip(read_by_field.role, read_by_field.content,
                                                                    strict=True)]
        assert message_count(history) == len(whole) == 8
        for start in (0, 1, 5, 7, 8, 12):
            assert as_dicts(history, start) == whole[start:]
        whole[-1]["content"] = "changed by the caller"  # each read is the caller's own: later reads are as before
        assert as_dicts(history)[-1] == {"role": read_by_field.role[-1], "content": read_by_field.content[-1]}
    finally:
        env.close()
