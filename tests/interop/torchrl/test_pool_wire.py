"""A multiprocessing pool's queues carry each env's conversation as the messages the other end lacks
(``interop/torchrl/pool_wire.py``): the conversations that cross are the envs' own, message for message, whatever their
length, and what crosses a turn does not grow with the conversation."""

from __future__ import annotations

import copy
import multiprocessing
import pickle

import pytest

from mlgym_registry.interop.torchrl.env_factory import EnvFactory
from mlgym_registry.interop.torchrl.pool_wire import MIN_SHARED_TEXT, Wire, WireOutOfStep, common_text_prefix
from mlgym_registry.scale.workers import WithParentEnviron, warm_workers
from mlgym_registry.transforms.history import as_dicts, common_prefix, extend_history, history_from, message

TASK = "prisonersDilemma"
MAX_TURNS = (3, 5)
"""The two envs' episode lengths: they reset at different rounds, so a new conversation starts beside a long one."""
ROUNDS = 12


def reply(round_: int) -> str:
    return f"DISCUSSION\nRound {round_}.\n```\necho round-{round_}\n```"


def conversations(td) -> list[list[dict[str, str]]]:
    """Each env's conversation in a pool's (or a stacked) output, as role/content dicts."""
    return [as_dicts(td[index]["history"].prompt) for index in range(td.batch_size[0])]


def test_a_process_pool_hands_over_the_same_conversations_as_the_envs_in_process():
    factories = [WithParentEnviron(EnvFactory.from_spec(TASK, max_turns=turns)) for turns in MAX_TURNS]
    local = [factory() for factory in factories]
    with warm_workers():
        from torchrl.envs import AsyncEnvPool

        pool = AsyncEnvPool(factories, backend="multiprocessing", exchange="queue")
    try:
        pooled = pool.reset()
        local_tds = [env.reset() for env in local]
        for round_ in range(ROUNDS):
            pooled["text", "response"] = [[reply(round_)]] * len(MAX_TURNS)
            pool.async_step_and_maybe_reset_send(pooled)
            _, pooled = pool.async_step_and_maybe_reset_recv(min_get=len(MAX_TURNS))
            for index, env in enumerate(local):
                local_tds[index]["text", "response"] = reply(round_)
                _, local_tds[index] = env.step_and_maybe_reset(local_tds[index])
            expected = [as_dicts(td["history"].prompt) for td in local_tds]
            assert conversations(pooled) == expected, f"round {round_}"
            assert [pooled[index]["text", "prompt"] for index in range(len(local))] == [
                td["text", "prompt"] for td in local_tds]
        # an env's output put on a queue of the user's, copied or pickled, is whole and self-contained
        queue = multiprocessing.Queue()
        queue.put(pooled[1])
        assert as_dicts(queue.get(timeout=30)["history"].prompt) == expected[1]
        assert as_dicts(copy.deepcopy(pooled[0])["history"].prompt) == expected[0]
        assert as_dicts(pickle.loads(pickle.dumps(pooled[0]))["history"].prompt) == expected[0]
        # and the pool goes on from where it was
        pooled["text", "response"] = [[reply(ROUNDS)]] * len(MAX_TURNS)
        pool.async_step_and_maybe_reset_send(pooled)
        _, pooled = pool.async_step_and_maybe_reset_recv(min_get=len(MAX_TURNS))
        assert conversations(pooled)[1][-2]["content"] == reply(ROUNDS)
    finally:
        pool.close()
        for env in local:
            env.close()


@pytest.mark.parametrize("consolidate", [False, True])
def test_a_parallel_env_hands_over_the_same_conversations_as_the_envs_in_process(consolidate):
    factories = [WithParentEnviron(EnvFactory.from_spec(TASK, max_turns=turns)) for turns in MAX_TURNS]
    local = [factory() for factory in factories]
    with warm_workers():
        from torchrl.envs import ParallelEnv

        parallel = ParallelEnv(len(factories), factories, consolidate=consolidate)
        batched = parallel.reset()
    try:
        local_tds = [env.reset() for env in local]
        for round_ in range(ROUNDS):
            batched["text", "response"] = [[reply(round_)]] * len(MAX_TURNS)
            _, batched = parallel.step_and_maybe_reset(batched)
            for index, env in enumerate(local):
                local_tds[index]["text", "response"] = reply(round_)
                _, local_tds[index] = env.step_and_maybe_reset(local_tds[index])
            expected = [as_dicts(td["history"].prompt) for td in local_tds]
            assert conversations(batched) == expected, f"round {round_}"
        # what the ParallelEnv returned pickles whole, for a user's own pickle or queue
        assert as_dicts(pickle.loads(pickle.dumps(batched[1]))["history"].prompt) == expected[1]
        queue = multiprocessing.Queue()
        queue.put(batched[0])
        assert as_dicts(queue.get(timeout=30)["history"].prompt) == expected[0]
    finally:
        parallel.close()
        for env in local:
            env.close()


def conversation(count: int, start: int = 0) -> list:
    return [message("user" if index % 2 else "assistant", f"message {index} " + "x" * 200)
            for index in range(start, start + count)]


def test_what_crosses_a_turn_does_not_grow_with_the_conversation():
    trainer, worker = Wire(), Wire()
    messages = conversation(3)
    history = history_from(messages)
    sizes = []
    for turn in range(200):
        payload = worker.encode("env", {"prompt": history._tensordict})
        sizes.append(len(payload))
        received = trainer.decode("env", payload)["prompt"]
        assert as_dicts(history_from(list(received.tensordicts))) == as_dicts(history)
        # the trainer's policy answers on the conversation it received; the worker reads it back
        answered = extend_history(history_from(list(received.tensordicts)), conversation(1, 3 + 2 * turn))
        back = worker.decode("env", trainer.encode("env", {"full": answered._tensordict}))["full"]
        assert as_dicts(history_from(list(back.tensordicts))) == as_dicts(answered)
        history = extend_history(history_from(list(back.tensordicts)), conversation(1, 4 + 2 * turn))
    assert max(sizes[-20:]) <= 1.1 * max(sizes[:20]), sizes


def test_an_end_that_went_out_of_step_says_so():
    sender, receiver = Wire(), Wire()
    history = history_from(conversation(4))
    sender.encode("env", {"prompt": history._tensordict})  # never delivered
    payload = sender.encode("env", {"prompt": history._tensordict})
    with pytest.raises(WireOutOfStep, match="sent to another env's worker, or one end missed a message"):
        receiver.decode("env", payload)


def test_a_conversation_unbound_along_its_batch_dim_holds_the_same_messages():
    """What a pool's ``view(-1)`` does to each env's conversation (shape ``(1, n)``): one conversation of the same
    messages, every time, and the same as a plain lazy stack gives."""
    from tensordict import lazy_stack

    messages = [message("user", f"message {index}").unsqueeze(0) for index in range(5)]
    history = history_from(messages, stack_dim=1)
    plain = lazy_stack([item.clone() for item in messages], dim=1)
    for _ in range(2):
        (ours,) = history._tensordict.unbind(0)
        (theirs,) = plain.unbind(0)
        assert ours.batch_size == theirs.batch_size == (5,)
        assert [ours[index]["content"] for index in range(5)] == [theirs[index]["content"] for index in range(5)]
    longer = extend_history(history, [message("assistant", "an answer").unsqueeze(0)])
    (unbound,) = longer._tensordict.unbind(0)
    assert as_dicts(history_from(list(unbound.tensordicts)))[-1] == {"role": "assistant", "content": "an answer"}
    assert history._tensordict.view(-1).batch_size == (5,)


def rendered(turns: int) -> str:
    """A chat-templated prompt of ``turns`` turns, as the env's ``text.prompt`` grows: each one starts with the last."""
    system = "<|im_start|>system\n" + "Follow the task. " * 200 + "<|im_end|>\n"
    body = "".join(f"<|im_start|>user\nobservation {turn} ✓\n<|im_end|>\n<|im_start|>assistant\nreply {turn}\n"
                   "<|im_end|>\n" for turn in range(turns))
    return system + body + "<|im_start|>assistant\n"


def test_a_growing_prompt_crosses_as_what_the_other_end_lacks_of_it():
    worker, trainer = Wire(), Wire()
    sizes = []
    for turn in range(1, 120):
        prompt = rendered(turn)
        payload = worker.encode("env", {"text": {"prompt": prompt, "response": None}, "query": "short"})
        sizes.append(len(payload))
        state = trainer.decode("env", payload)
        assert state["text"]["prompt"] == prompt and state["query"] == "short"
        # the trainer sends it back with the policy's answer, as the pool's next step does
        answer = f"reply {turn}" * 300  # long, and new to both ends
        back = worker.decode("env", trainer.encode("env", {"text": {"prompt": state["text"]["prompt"],
                                                                      "response": answer}}))
        assert back["text"] == {"prompt": prompt, "response": answer}
    assert len(rendered(119)) > 3 * len(rendered(1))
    assert max(sizes[-20:]) <= 1.1 * max(sizes[1:21]), sizes
    # the system part (over 3,000 characters) crossed once, on the first turn only
    assert sizes[0] > len(rendered(1)) > 3000 > 1000 > max(sizes[1:]), sizes
    # a string that shares only its start with what crossed before, and one that crossed whole before
    forked = rendered(50)[:4000] + "a different ending" * 200
    for text in (forked, forked, rendered(3)):
        assert trainer.decode("env", worker.encode("env", {"prompt": text}))["prompt"] == text


def test_a_string_that_arrives_out_of_step_says_so():
    sender, receiver = Wire(), Wire()
    sender.encode("env", {"prompt": rendered(3)})  # never delivered
    payload = sender.encode("env", {"prompt": rendered(4)})
    with pytest.raises(WireOutOfStep, match="one end missed a message"):
        receiver.decode("env", payload)


def test_strings_long_or_odd_cross_unchanged():
    sender, receiver = Wire(), Wire()
    texts = ["x" * 5000, "x" * 5000 + "\ud800 lone surrogate", "é" * 3000, "x" * 2500, "", "short"]
    for text in texts:
        assert receiver.decode("env", sender.encode("env", {"value": text}))["value"] == text


def test_a_pool_reads_its_env_indices_without_unbinding_the_conversations(monkeypatch):
    """``AsyncEnvPool`` flattens the batch it is sent (``view(-1)``) only to read each env's index: that view
    unbinds no conversation, while a user's own ``view(-1)`` of the same batch is as tensordict makes it."""
    from tensordict._td import _SubTensorDict
    from torchrl.envs import AsyncEnvPool

    from mlgym_registry.transforms.history import MessageStack

    factories = [WithParentEnviron(EnvFactory.from_spec(TASK)) for _ in range(2)]
    with warm_workers():
        pool = AsyncEnvPool(factories, backend="multiprocessing", exchange="queue")
    unbound = []
    original = MessageStack._unbind
    monkeypatch.setattr(MessageStack, "_unbind", lambda self, dim: unbound.append(dim) or original(self, dim))
    try:
        batch = pool.reset()
        for round_ in range(3):
            batch["text", "response"] = [[reply(round_)]] * 2
            unbound.clear()
            pool.async_step_and_maybe_reset_send(batch)
            assert unbound == []
            _, batch = pool.async_step_and_maybe_reset_recv(min_get=2)
            assert sorted(batch.get("env_index").tolist()) == [[0], [1]]
        flat = batch.view(-1)
        assert unbound  # the user's view is tensordict's own
        assert flat.batch_size == (2,)
        assert not any(isinstance(row, _SubTensorDict) for row in flat.tensordicts)
        assert [as_dicts(flat[index]["history"].prompt) for index in range(2)] == conversations(batch)
    finally:
        pool.close()


def test_two_strings_share_exactly_their_common_start():
    base = "".join(chr(0x61 + (index * 7) % 26) for index in range(5000))
    for at in (MIN_SHARED_TEXT, MIN_SHARED_TEXT + 1, 1000, 2047, 4999):
        other = base[:at] + ("#" if base[at] != "#" else "$") + base[at + 1:]
        assert common_text_prefix(base, other) == common_text_prefix(other, base) == at
    assert common_text_prefix(base, base + "more") == common_text_prefix(base + "more", base) == len(base)
    assert common_text_prefix(base, "#" + base[1:]) == 0
    assert common_text_prefix(base, base[:10] + "#" + base[11:]) == 0  # fewer than MIN_SHARED_TEXT in common


def test_a_conversation_crosses_as_the_longest_run_any_remembered_list_shares():
    sender, receiver = Wire(), Wire()
    first, second = conversation(10), conversation(30, 100)

    def crossed(messages: list) -> int:
        payload = sender.encode("env", {"prompt": history_from(messages)._tensordict})
        received = receiver.decode("env", payload)["prompt"]
        assert as_dicts(history_from(list(received.tensordicts))) == as_dicts(history_from(messages))
        return len(payload)

    size_first = crossed(first)
    crossed(second)
    crossed(first + conversation(5, 200))  # a shorter list, remembered after the longer one
    size_longer = crossed(second + conversation(2, 300))  # extends the longest list remembered
    assert size_longer < size_first / 2, (size_longer, size_first)
    size_forked = crossed(second[:20] + conversation(3, 400))  # shares only the start of one
    assert size_forked < size_first, (size_forked, size_first)


def test_common_prefix_counts_the_same_leading_objects_of_lists_of_any_lengths():
    items = [object() for _ in range(5)]
    assert common_prefix(items, items[:3]) == common_prefix(items[:3], items) == 3
    assert common_prefix(items, [*items[:2], object(), items[3]]) == 2
    assert common_prefix([], items) == 0
    assert common_prefix(items, list(items)) == 5
