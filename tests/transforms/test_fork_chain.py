"""``ChainEnv.fork``: children in exactly the parent's state, the chain's counts included, stepped from clones of the
tensordict the caller holds; over the real local backend (the mini Prisoner's Dilemma: a validate in a fraction of a
second)."""

from __future__ import annotations

import pytest
import torch
from security.helpers import HONEST, mini_prisoners_spec
from tensordict.nn import TensorDictModuleBase

from mlgym_registry import registry
from mlgym_registry.errors import EnvMisuseError
from mlgym_registry.scale.workers import warm_workers


def fenced(command: str) -> str:
    return f"DISCUSSION\nNext.\n```\n{command}\n```\n"


def respond(env, td, text):
    td["text", "response"] = text
    td = env.step(td)
    return td["next"], env.step_mdp(td)


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return mini_prisoners_spec(tmp_path_factory.mktemp("mini_pd_fork"))


@pytest.fixture
def episode(spec):
    """A parent three turns in: a strategy written, a format error, a scored validate."""
    env = registry.make(spec, max_format_errors=3)
    env.set_seed(0)
    td = env.reset()
    _, td = respond(env, td, fenced(f"cat > strategy.py <<'EOF'\n{HONEST}EOF"))
    _, td = respond(env, td, "no command")
    nxt, td = respond(env, td, fenced("validate"))
    assert nxt["reward"].item() != 0
    yield env, td
    env.close()


def test_children_keep_every_count_of_the_chain_and_the_conversation(episode):
    parent, td = episode
    children = parent.fork(2)
    try:
        base = parent.base_env
        for child in children:
            cb = child.base_env
            assert cb.backend is not base.backend
            assert (cb.turns, cb.format_errors, cb.evaluations) == (base.turns, base.format_errors, base.evaluations)
            assert cb.backend.current_step == base.backend.current_step and cb.backend._scores == base.backend._scores
        # the reward's best so far is carried: validating the same strategy again pays nothing, in each of them
        rewards = []
        for env in (*children, parent):
            nxt, _ = respond(env, td.clone(), fenced("validate"))
            rewards.append(nxt["reward"].item())
            prompt = nxt["history", "prompt"][0]
            assert len(prompt) == len(td["history", "prompt"][0]) + 2  # the parent's conversation, one turn on
        assert rewards == [0.0, 0.0, 0.0]
    finally:
        for child in children:
            child.close()


def test_each_child_goes_its_own_way_and_outlives_the_parent(episode):
    parent, td = episode
    first, second = parent.fork(2)
    try:
        respond(first, td.clone(), fenced("echo first > mine.txt"))
        respond(second, td.clone(), fenced("echo second > mine.txt"))
        parent.close()
        nxt, _ = respond(first, td.clone(), fenced("cat mine.txt"))
        assert "first" in nxt["history", "prompt"][0, -1].content
        nxt, _ = respond(second, td.clone(), fenced("cat mine.txt"))
        assert "second" in nxt["history", "prompt"][0, -1].content
    finally:
        first.close()
        second.close()


def test_fork_before_reset_says_what_to_do(spec):
    env = registry.make(spec)
    try:
        with pytest.raises(EnvMisuseError, match=r"reset\(\)"):
            env.fork(1)
    finally:
        env.close()


def test_a_fork_point_makes_the_children_of_a_threading_async_env_pool_which_closes_them(episode):
    """The pool's async API (what LLMCollector drives), from the branch's tensordict stacked once per child (its
    ``reset`` would start new episodes); the pool adopts the children its setup made, and closes them."""
    from tensordict import NonTensorStack
    from torchrl.envs import AsyncEnvPool

    parent, td = episode
    point = parent.fork_point()
    try:
        pool = AsyncEnvPool([point] * 2, backend="threading")
    finally:
        point.close()
    try:
        branch = torch.stack([td.clone() for _ in range(2)])
        branch["env_index"] = NonTensorStack(*(NonTensorStack(i) for i in range(2)))
        branch["text", "response"] = [[fenced(f"echo {word} > mine.txt && cat mine.txt")] for word in ("a", "b")]
        pool.async_step_send(branch)
        out = pool.async_step_recv(min_get=2)
        seen = sorted(out["next", "history", "prompt"][i][0, -1].content.split("\n")[0] for i in range(2))
        assert seen == ["a", "b"]
        assert [env.base_env.turns for env in pool.envs] == [parent.base_env.turns + 1] * 2
    finally:
        pool.close()
    assert pool.is_closed and all(env.is_closed for env in pool.envs)


@pytest.mark.slow
def test_a_fork_point_makes_the_children_of_a_multiprocessing_async_env_pool(episode):
    """Each worker makes its child from the pickled point: the chain as it stood, the files, the shell's state."""
    from tensordict import NonTensorStack
    from torchrl.envs import AsyncEnvPool

    parent, td = episode
    respond_td = td.clone()
    _, td = respond(parent, respond_td, fenced("echo carried > note.txt && export CARRIED=yes"))
    point = parent.fork_point()
    try:
        with warm_workers():  # forked from the preloaded server: the point reaches each worker pickled all the same
            pool = AsyncEnvPool([point] * 2, backend="multiprocessing")
    finally:
        point.close()  # the workers' envs hold the frozen files now
    try:
        branch = torch.stack([td.clone() for _ in range(2)])
        branch["env_index"] = NonTensorStack(*(NonTensorStack(i) for i in range(2)))
        branch["text", "response"] = [[fenced("cat note.txt; echo $CARRIED")]] * 2
        pool.async_step_send(branch)
        out = pool.async_step_recv(min_get=2)
        for i in range(2):
            assert out["next", "history", "prompt"][i][0, -1].content.startswith("carried\nyes\n")
    finally:
        pool.close()


class CatNote(TensorDictModuleBase):
    """A scripted policy: every turn shows the carried file and variable."""

    in_keys = ["query"]
    out_keys = [("text", "response")]

    def forward(self, tensordict):
        tensordict["text", "response"] = fenced("cat note.txt; echo $CARRIED")
        return tensordict


@pytest.mark.parametrize("backend", ["threading", pytest.param("multiprocessing", marks=pytest.mark.slow)])
def test_children_made_to_resume_are_driven_by_llm_collector_from_the_branch(spec, backend):
    """``fork_point(resume_on_reset=True)``: a pool's resets return the branch in each child until it is stepped,
    so TorchRL's standard loop (LLMCollector over ``AsyncEnvPool([point] * 2)``, which resets twice) continues the
    branch; the resets after the branch's episodes end start new ones."""
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs import AsyncEnvPool

    parent = registry.make(spec, max_turns=2)
    try:
        td = parent.reset()
        fresh = td["history", "prompt"].batch_size[-1]
        _, td = respond(parent, td, fenced("echo carried > note.txt && export CARRIED=yes"))
        branch = td["history", "prompt"].batch_size[-1]
        point = parent.fork_point(resume_on_reset=True)
    finally:
        parent.close()  # the point holds the frozen files
    try:
        with warm_workers():
            pool = AsyncEnvPool([point] * 2, backend=backend)
    finally:
        point.close()
    collector = LLMCollector(pool, policy=CatNote(), dialog_turns_per_batch=1, total_dialog_turns=-1,
                             yield_completed_trajectories=True)
    try:
        resumed, new = [], []
        for episode in collector:  # the envs run side by side: a new episode may end before a sibling's branch
            starts = episode["history", "prompt"][0].batch_size[-1]
            (resumed if starts == branch else new).append(episode)
            if (len(resumed) == 2 and new) or len(resumed) + len(new) == 40:  # the event, or a far ceiling
                break
        assert len(resumed) == 2 and new
        for episode in resumed:  # one turn left of max_turns=2, from the branch's conversation
            assert episode.batch_size[0] == 1
            assert episode["next", "history", "prompt"][0][-1].content.startswith("carried\nyes")
        for episode in new:  # a new episode each: the task's prompt, two turns
            assert episode.batch_size[0] == 2 and episode["history", "prompt"][0].batch_size[-1] == fresh
            assert "No such file" in episode["next", "history", "prompt"][0][-1].content
    finally:
        collector.shutdown()
    assert pool.is_closed


def test_resume_on_reset_needs_an_episode_that_goes_on(spec):
    env = registry.make(spec, max_turns=1)
    try:
        with pytest.raises(EnvMisuseError, match="reset"):
            env.fork_point(resume_on_reset=True)
        td = env.reset()
        respond(env, td, fenced("ls"))  # the one turn: the episode is over
        with pytest.raises(EnvMisuseError, match="ended its episode"):
            env.fork(1, resume_on_reset=True)
    finally:
        env.close()
