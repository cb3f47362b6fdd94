"""The TRL face: ``faces.trl.environment_factory`` against ``registry.make``'s env, and TRL's own ``GRPOTrainer``."""

from __future__ import annotations

import gc
import inspect
import math
import time

import psutil
import pytest

from mlgym_registry.errors import MLGymRegistryError
from mlgym_registry.faces.trl import EPISODE_OVER, TOOL_NOTE, MLGymTRLEnv, dataset, environment_factory

TASK = "prisonersDilemma"
LOOK = "DISCUSSION\nFirst look around.\n```\nls\n```"
VALIDATE = "DISCUSSION\nScore the starter strategy.\n```\nvalidate\n```"
SUBMIT = "DISCUSSION\nDone.\n```\nsubmit\n```"
GARBAGE = "I will not write any command."
FORFEIT = "DISCUSSION\nThe rollout is over; I stop here.\n```\nexit_forfeit\n```"


HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""Python's own helper processes (torch and datasets start them once per interpreter): no sandbox."""


def children() -> set[int]:
    """The pids of this process's live descendants (sandboxes, shells), Python's helpers left out."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not any(h in " ".join(child.cmdline()) for h in HELPERS):
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_gone(pids: set[int], timeout: float = 120.0) -> set[int]:
    """The pids of ``pids`` still alive after at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = pids & children()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def chain_episode(seed: int, replies: list[str]) -> tuple[str, list[tuple[str, float, bool]]]:
    """``registry.make``'s env played by hand: the first prompt text (system and first user message) and each
    step's (next user message, reward, done)."""
    from mlgym_registry import registry
    from mlgym_registry.episodes.episode import conversation, env_parts, text_at

    env = registry.make(TASK)
    try:
        _, layout = env_parts(env)
        env.set_seed(seed)
        td = env.reset()
        messages = conversation(td, layout)
        first = "\n\n".join([messages[0]["content"].strip(), TOOL_NOTE, messages[1]["content"]])
        steps = []
        for reply in replies:
            td.set(layout.response, reply)
            after = env.step(td)["next"]
            steps.append((text_at(after, layout.message), float(after.get(layout.reward).sum()),
                          bool(after.get("done").any())))
            td = after.exclude(*env.reward_keys, *env.done_keys)
        return first, steps
    finally:
        env.close()


def test_only_act_is_a_tool_and_its_docstring_parses():
    from transformers.utils import get_json_schema

    cls = environment_factory(TASK)
    env = cls()
    assert issubclass(cls, MLGymTRLEnv) and cls.__name__ == "mlgym_prisonersDilemma"
    tools = [name for name, _ in inspect.getmembers(env, predicate=inspect.ismethod)
             if name not in ("reset", "get_reward") and not name.startswith("_")]
    assert tools == ["act"]
    schema = get_json_schema(env.act)["function"]
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["response"]
    assert "fenced" in schema["description"] and schema["parameters"]["properties"]["response"]["description"]
    assert "_holder" in vars(env) and not env._holder  # no sandbox before the first reset (TRL's probe is cheap)


def test_episode_matches_registry_make_on_the_same_seed():
    replies = [LOOK, GARBAGE, VALIDATE, SUBMIT]
    first, steps = chain_episode(3, replies)
    env = environment_factory(TASK)()
    try:
        assert env.reset(seed=3, prompt=[{"role": "user", "content": ""}]) == first
        assert "```" in first and TOOL_NOTE in first           # the reply format reaches the model
        for reply, (message, reward, done) in zip(replies, steps, strict=True):
            assert env.act(reply) == message
            assert env.rewards[-1] == pytest.approx(reward) and env.done == done
        assert env.exit_status == "submitted" and env.steps == 4
        assert steps[2][1] != 0.0 and math.isclose(env.get_reward(), sum(r for _, r, _ in steps), rel_tol=1e-6)
        assert env.act(LOOK) == EPISODE_OVER.format(status="submitted") and env.steps == 4
        # a pooled instance is reset for the next rollout: a fresh episode, same seed, same game
        again = env.reset(seed=3)
        assert again == first and env.rewards == [] and not env.done
        env.act(VALIDATE)                       # an unfinished episode: TRL's rollout is over, the agent forfeits
        _, forfeited = chain_episode(3, [VALIDATE, FORFEIT])
        assert not env.done and env.get_reward() == pytest.approx(sum(r for _, r, _ in forfeited))
        assert env.done and env.exit_status == "exit_forfeit" and env.rewards[-1] == pytest.approx(forfeited[1][1])
        assert forfeited[1][1] < 0 and env.get_reward() < steps[2][1]  # stopping early pays less than the validate
    finally:
        env._close()


def test_sandboxes_are_released_by_garbage_collection():
    before = children()
    env = environment_factory(TASK)()
    env.reset(seed=0)
    env.act(LOOK)
    started = children() - before
    assert started, "the env started no process"
    del env
    gc.collect()
    assert not wait_gone(started)


def test_rows_for_another_task_are_refused():
    from mlgym_registry.errors import MLGymRegistryError

    env = environment_factory(TASK)()
    with pytest.raises(MLGymRegistryError, match="blotto"):
        env.reset(task="blotto")
    with pytest.raises(MLGymRegistryError, match="before reset"):
        env.act(LOOK)
    rows = dataset(3, seed=5)
    assert rows["seed"] == [5, 6, 7] and rows[0]["prompt"] == [{"role": "user", "content": ""}]


def test_url_mode_plays_a_served_task_like_in_process():
    pytest.importorskip("openenv")
    import threading

    import uvicorn

    from mlgym_registry.faces.openenv import create_app

    replies = [GARBAGE, VALIDATE, SUBMIT]
    first, steps = chain_episode(4, replies)
    server = uvicorn.Server(uvicorn.Config(create_app([TASK], max_sessions=2), host="127.0.0.1", port=0,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120  # a ceiling for a loaded machine
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        cls = environment_factory(TASK, url=url)
        assert cls.__name__ == "mlgym_prisonersDilemma"
        env = cls()
        assert env.reset(seed=4) == first
        for reply, (message, reward, done) in zip(replies, steps, strict=True):
            assert env.act(reply) == message
            assert env.rewards[-1] == pytest.approx(reward) and env.done == done
        assert env.exit_status == "submitted" and env.get_reward() == pytest.approx(sum(r for _, r, _ in steps))
        assert env.act(LOOK).startswith("The episode is over")
        second, third = cls(), cls()  # the server's two sessions: this env's and the second's
        second.reset(seed=0)
        with pytest.raises(MLGymRegistryError, match="--max-sessions"):
            third.reset(seed=0)
        for each in (env, second, third):
            each._close()
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_tool_tokenizer_renders_and_parses_tool_calls():
    trl = pytest.importorskip("trl")
    from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

    from mlgym_registry.testing.tiny_model import tiny_tokenizer, tiny_tool_tokenizer

    assert trl.__version__.startswith("1.")
    tokenizer = tiny_tool_tokenizer()
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    assert not supports_tool_calling(tiny_tokenizer())           # the plain one is unchanged: ChatML, no tools
    env = environment_factory(TASK)()
    messages = [{"role": "user", "content": "play"}]
    prefix = tokenizer.apply_chat_template(messages, tools=[env.act], add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    text = tokenizer.decode(prefix)
    assert '"name": "act"' in text and text.endswith("<|im_start|>assistant\n")
    reply = tool_call_text(SUBMIT)
    parsed = parse_response(tokenizer, tokenizer(reply)["input_ids"], prefix=prefix)
    call = {"name": "act", "arguments": {"response": SUBMIT}}
    assert parsed["tool_calls"] == [{"type": "function", "function": call}]
    assert parse_response(tokenizer, tokenizer("no call<|im_end|>")["input_ids"], prefix=prefix) == {
        "role": "assistant", "content": "no call"}


def tool_call_text(response: str) -> str:
    """A reply that calls ``act(response)``, as ``TOOL_CHAT_TEMPLATE`` renders it."""
    import json

    body = json.dumps({"name": "act", "arguments": {"response": response}})
    return f"<tool_call>\n{body}\n</tool_call><|im_end|>"


def teach_tool_call(model, tokenizer, prompt_ids: list[int], reply: str, steps: int = 150) -> float:
    """Fine-tune ``model`` to answer ``prompt_ids`` with ``reply``; returns the last loss."""
    import torch

    reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + reply_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = torch.tensor(float("inf"))
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 1e-3:
            break
    return loss.item()


@pytest.mark.slow
def test_grpo_trainer_trains_on_the_task(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")     # environment_factory is experimental in TRL 1.13
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from mlgym_registry.testing.tiny_model import tiny_model, tiny_tool_tokenizer

    torch.manual_seed(0)
    tokenizer = tiny_tool_tokenizer()
    model = tiny_model(tokenizer)
    base = environment_factory(TASK)
    calls: list[str] = []
    paid: list[float] = []

    class Recorded(base):
        def act(self, response: str) -> str:
            """Send one reply to the task: a short discussion, then exactly one command in a fenced code block.

            Args:
                response: Your whole reply, a discussion and one command in a fenced block.

            Returns:
                The next message, or "episode is over".
            """
            calls.append(response)
            return super().act(response)

        def get_reward(self) -> float:
            paid.append(super().get_reward())
            return paid[-1]

    # the prompt TRL will render: the row's empty user message plus what reset returns, with the tool schema
    probe = base()
    try:
        content = probe.reset(seed=0)
        prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": content}], tools=[probe.act],
                                                   add_generation_prompt=True, tokenize=True, return_dict=False)
    finally:
        probe._close()
    assert teach_tool_call(model, tokenizer, prompt_ids, tool_call_text(SUBMIT)) < 0.05

    before = children()
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_steps=2,
                        per_device_train_batch_size=2, num_generations=2, max_completion_length=160,
                        max_tool_calling_iterations=2, temperature=0.5, learning_rate=1e-6, logging_steps=1,
                        save_strategy="no", seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset(8),
                          environment_factory=Recorded)
    trainer.train()

    assert any("```\nsubmit\n```" in call for call in calls), calls[:3]   # tool calls reached the env
    logged = [entry for entry in trainer.state.log_history if "rewards/Recorded/mean" in entry]
    assert len(logged) == 2
    # every rollout was scored by get_reward, and TRL logged exactly those rewards
    assert len(paid) == 4 and any(value != 0.0 for value in paid)
    for step, entry in enumerate(logged):
        assert entry["rewards/Recorded/mean"] == pytest.approx(sum(paid[2 * step: 2 * step + 2]) / 2, abs=1e-6)
    assert any(entry.get("tools/call_frequency", 1) > 0 for entry in logged)

    started = children() - before
    del trainer
    gc.collect()
    left = wait_gone(started)
    assert not left, [" ".join(psutil.Process(pid).cmdline())[:200] for pid in left]
