"""Several envs at once with TorchRL's defaults: ``AsyncEnvPool`` (default ``stack="dense"``) under ``LLMCollector``,
``ParallelEnv``, ``Collector(..., backend="process")``, over episodes of different lengths, on the real local backend;
and closing any of them leaves no sandbox running."""

from __future__ import annotations

import functools
import time
import warnings

import psutil
import pytest
import torch
from tensordict.nn import TensorDictModuleBase

from mlgym_registry import registry

TASK = "prisonersDilemma"
LENGTHS = (1, 2, 3, 4)
"""Each env's ``max_turns``: the 4 envs of a pool play episodes of these lengths, so they are at different
conversation lengths at every step after the first."""

SESSION_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""Processes multiprocessing keeps for the whole session, not for one pool."""


class Ls(TensorDictModuleBase):
    """A scripted policy: ``ls`` every turn, whatever the batch (an episode ends at its env's ``max_turns``)."""

    in_keys = ["query"]
    out_keys = [("text", "response")]

    def forward(self, tensordict):
        tensordict["text", "response"] = "DISCUSSION\nLook around.\n```\nls\n```"
        return tensordict


def factories() -> list[functools.partial]:
    return [functools.partial(registry.make, TASK, max_turns=turns) for turns in LENGTHS]


def descendants() -> set[int]:
    """This process's descendants: pool workers, and the local backend's sandboxes and shells (not the processes
    multiprocessing keeps for the whole session)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if not any(name in " ".join(child.cmdline()) for name in SESSION_PROCESSES):
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def spawned_children() -> list[list[str]]:
    """The command lines of this process's children that multiprocessing spawned (fresh interpreters), where
    ``warm_workers`` forks them from its server instead."""
    found = []
    for child in psutil.Process().children():
        try:
            command = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "spawn_main" in " ".join(command):
            found.append(command)
    return found


def assert_nothing_left(before: set[int], timeout: float = 120.0) -> None:
    """Every process started since ``before`` has ended (sandboxes end as soon as their env closes; a worker process
    may take a moment to exit, and on a loaded 2-core machine more than 10 s: the ceiling is generous, the wait ends
    as soon as they are gone)."""
    deadline = time.monotonic() + timeout
    while descendants() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [psutil.Process(pid).cmdline() for pid in descendants() - before if psutil.pid_exists(pid)]
    assert not left, f"still running: {left}"


def collect_episodes(collector, lengths: set[int], ceiling: int = 400) -> list:
    """Whole episodes from ``collector`` until it has yielded one of every length in ``lengths``, or ``ceiling``
    episodes (TorchRL 0.14's LLMCollector can stop short of a finite ``total_dialog_turns`` over an AsyncEnvPool, so
    the collector runs unbounded and is left here). Which env's episode comes next is up to the pool and the load (an
    env of short episodes may finish several before a long one finishes its first), so the wait is for the event,
    not for a number of episodes."""
    episodes = []
    for episode in collector:
        episodes.append(episode)
        if {done.batch_size[0] for done in episodes} >= lengths or len(episodes) >= ceiling:
            break
    return episodes


def conversation_lengths(episode) -> list[int]:
    """The number of messages in each turn's prompt of one episode."""
    history = episode["history", "prompt"]
    return [history[t].batch_size[-1] for t in range(episode.batch_size[0])]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["threading", "multiprocessing"])
def test_a_dense_pool_under_llm_collector_plays_episodes_of_different_lengths_and_closes(backend):
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs import AsyncEnvPool

    from mlgym_registry.scale.workers import warm_workers

    before = descendants()
    # workers forked from a preloaded server (spawned ones cost several seconds each; test_training_shapes.py
    # spawns them)
    with warm_workers(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the multiprocessing pool's note on its future exchange
        pool = AsyncEnvPool(factories(), backend=backend)  # TorchRL's default stack="dense"
    assert pool.batch_size == (4, 1)
    collector = LLMCollector(pool, policy=Ls(), dialog_turns_per_batch=1, total_dialog_turns=-1,
                             yield_completed_trajectories=True)
    episodes = collect_episodes(collector, set(LENGTHS))
    assert {episode.batch_size[0] for episode in episodes} == set(LENGTHS)  # each env's, and only those
    for episode in episodes:
        turns = episode.batch_size[0]
        assert bool(episode["next", "done"][-1].all()) and not bool(episode["next", "done"][:-1].any())
        assert conversation_lengths(episode) == [2 + 2 * t for t in range(turns)]  # system + task, then 2 a turn
        assert episode["query"][0] == TASK
    assert not pool.is_closed  # TorchRL counts every AsyncEnvPool closed from the start; ours count while open
    collector.shutdown()  # so the collector closes the pool, and with it every env and sandbox
    assert pool.is_closed
    if backend == "threading":
        assert all(env.is_closed for env in pool.envs)
    assert_nothing_left(before)


def test_dense_stacking_of_envs_at_different_lengths_keeps_each_conversation():
    """The pool's async API (what LLMCollector drives), stepped by hand so that the envs' conversations differ in
    length, stacked with TorchRL's default ``torch.stack``."""
    from torchrl.envs import AsyncEnvPool

    command = "DISCUSSION\nLook around.\n```\nls\n```"
    before = descendants()
    pool = AsyncEnvPool([functools.partial(registry.make, TASK, max_turns=10)] * 2, backend="threading")
    td = pool.reset()
    pool.async_step_and_maybe_reset_send(td[:1].set(("text", "response"), [[command]]))  # env 0 only
    _, ahead = pool.async_step_and_maybe_reset_recv(min_get=1)
    td = torch.stack([ahead[0], td[1]])
    pool.async_step_and_maybe_reset_send(td.set(("text", "response"), [[command]] * 2))
    _, td = pool.async_step_and_maybe_reset_recv(min_get=2)
    assert [td["history", "prompt"][i].batch_size[-1] for i in range(2)] == [6, 4]
    assert [td["history", "prompt"][i].role[0][-1] for i in range(2)] == ["user", "user"]
    pool.close()
    assert pool.is_closed and all(env.is_closed for env in pool.envs)
    assert_nothing_left(before)


def test_a_tokens_policy_takes_a_pool_batch_of_conversations_at_different_lengths():
    """What ``LLMCollector`` hands its policy when two envs of a pool finish a step together: a batch whose
    conversations differ in length. TorchRL's ``TransformersWrapper`` in tokens mode generates for both and the pool
    steps both (in history mode TorchRL 0.14 cannot take such a batch; docs/training.md says so)."""
    from torchrl.envs import AsyncEnvPool
    from torchrl.modules.llm import TransformersWrapper

    from mlgym_registry.testing.tiny_model import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    policy = TransformersWrapper(tiny_model(tokenizer), tokenizer=tokenizer, input_mode="tokens", generate=True,
                                 generate_kwargs={"max_new_tokens": 4, "do_sample": False})
    make_env = functools.partial(registry.make, TASK, input_mode="tokens", tokenizer=tokenizer, max_turns=4)
    pool = AsyncEnvPool([make_env] * 2, backend="threading")
    td = pool.reset()
    pool.async_step_and_maybe_reset_send(policy(td[:1]))  # env 0 only
    _, ahead = pool.async_step_and_maybe_reset_recv(min_get=1)
    td = torch.stack([ahead[0], td[1]])
    prompts = [td[i, 0]["tokens", "prompt"].numel() for i in range(2)]
    assert prompts[0] > prompts[1]
    pool.async_step_and_maybe_reset_send(policy(td))
    _, td = pool.async_step_and_maybe_reset_recv(min_get=2)
    assert sorted(td["history", "prompt"][i].batch_size[-1] for i in range(2)) == [4, 6]
    pool.close()
    assert pool.is_closed


def test_a_threading_pool_closes_every_env_and_its_sandbox():
    from torchrl.envs import AsyncEnvPool

    before = descendants()
    pool = AsyncEnvPool(factories()[:2], backend="threading")
    assert not pool.is_closed
    td = pool.reset()
    assert td["history", "prompt"].batch_size[-1] == 2
    assert descendants() - before  # a sandboxed shell per env
    assert not any(env.is_closed for env in pool.envs)
    pool.close()
    assert pool.is_closed and all(env.is_closed for env in pool.envs)
    assert_nothing_left(before)


@pytest.mark.slow
def test_a_multi_process_collector_over_envs_of_different_lengths_releases_everything_at_shutdown():
    from torchrl.collectors import Collector

    from mlgym_registry.interop.torchrl.env_factory import EnvFactory

    before = descendants()
    from mlgym_registry.scale.workers import warm_workers

    makers = [EnvFactory.from_spec(TASK, max_turns=turns) for turns in (1, 3)]
    with warm_workers():
        collector = Collector(makers, Ls(), frames_per_batch=4, total_frames=8, num_collectors=2, backend="process")
    batches = list(collector)
    collector.shutdown()
    assert batches
    dones = torch.cat([batch["next", "done"].reshape(-1) for batch in batches])
    assert bool(dones.any())
    assert_nothing_left(before)


def play_parallel(lengths: tuple[int, ...], steps: int, **options) -> None:
    """Step a ``ParallelEnv`` of envs with these ``max_turns`` ``steps`` times with ``step_and_maybe_reset`` (as
    TorchRL's collectors do), checking after each step which envs ended and every conversation's length."""
    from torchrl.envs import ParallelEnv

    from mlgym_registry.scale.workers import warm_workers

    count = len(lengths)
    before = descendants()
    with warm_workers() as method:
        # ParallelEnv starts its workers at its first reset: without the method they would be spawned there, each a
        # fresh interpreter importing torch and TorchRL again (docs/scaling.md)
        env = ParallelEnv(count, [functools.partial(registry.make, TASK, max_turns=k) for k in lengths],
                          mp_start_method=method, **options)
    try:
        td = env.reset()
        if method == "forkserver":  # MLGYM_REGISTRY_WORKER_START=spawn asks for spawned ones
            assert not spawned_children(), "ParallelEnv spawned its workers instead of forking them from the server"
        assert [td["history", "prompt"][i].batch_size[-1] for i in range(count)] == [2] * count
        for step in range(1, steps + 1):
            td["text", "response"] = [["DISCUSSION\nLook.\n```\nls\n```"]] * count
            out, td = env.step_and_maybe_reset(td)
            turns = [step % k or k for k in lengths]  # the turn of its episode each env just played
            ended = [step % k == 0 for k in lengths]
            assert out["next", "done"].reshape(-1).tolist() == ended
            finished = out["next", "history", "prompt"]
            assert [finished[i].batch_size[-1] for i in range(count)] == [2 + 2 * t for t in turns]
            following = td["history", "prompt"]
            assert [following[i].batch_size[-1] for i in range(count)] == [
                2 if end else 2 + 2 * t for end, t in zip(ended, turns, strict=True)]
            assert [following[i].role[0][-1] for i in range(count)] == ["user"] * count
            assert not bool(td["done"].any())
    finally:
        env.close()
    assert_nothing_left(before)


def test_parallel_env_with_its_defaults_restarts_each_env_at_its_own_turn():
    """TorchRL's defaults (``consolidate=True``): the env that ends its episode restarts while the other goes on."""
    play_parallel((1, 3), steps=3)


@pytest.mark.slow
@pytest.mark.parametrize("consolidate", [True, False])
def test_parallel_env_plays_four_envs_over_episodes_of_different_lengths(consolidate):
    # 5 steps: every env ends an episode at its own turn, and the longest then plays a turn of its next one
    play_parallel(LENGTHS, steps=max(LENGTHS) + 1, consolidate=consolidate)
