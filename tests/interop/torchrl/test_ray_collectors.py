"""TorchRL 0.14's Ray collectors over our envs, on a real local Ray runtime (no mocks).

One local runtime with 2 CPUs serves the whole file, and the Ray tests of ``tests/scale/`` too (``shared_ray``: starting
one takes 10-20 s on 2 cores).
"""

from __future__ import annotations

import time

import pytest
from shared_ray import RAY_GROUP, shared_ray  # noqa: F401 - the fixture

ray = pytest.importorskip("ray")

from mlgym_registry.interop.torchrl.collectors import TextPolicy  # noqa: E402
from mlgym_registry.interop.torchrl.ray_collectors import (  # noqa: E402
    RayCollectorError,
    ray_collector,
    ray_llm_collector,
    split_collector_kwargs,
)
from mlgym_registry.scale.ray_resources import RayResourceError  # noqa: E402
from mlgym_registry.scale.ray_runtime import RayConnectionError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.xdist_group(RAY_GROUP)]

TASK = "prisonersDilemma"


@pytest.fixture
def session(shared_ray):  # noqa: F811 - the imported fixture
    """The shared runtime's ``RaySession``: each test leaves it as it found it, with every CPU free
    (``wait_until_idle``)."""
    return shared_ray.session


PROMPTLY = 120.0
"""A ceiling, not a timing: what must come at once (a refusal, killed actors' CPUs given back) comes well within it on a
loaded 2-core machine, and what TorchRL or Ray alone would do (wait for an actor forever) never does."""


def live_actors() -> list[str]:
    """Class names of the actors that are alive or waiting for resources."""
    from ray._private.state import actors  # the public state API needs the dashboard, which ray_session leaves off

    return [a["ActorClassName"] for a in actors().values() if a["State"] not in ("DEAD",)]


def wait_until_idle(session, timeout: float = PROMPTLY) -> None:
    """Wait for every actor to end and every CPU to be free again (killed actors give them back a moment later)."""
    deadline = time.monotonic() + timeout
    while live_actors() or ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
        assert time.monotonic() < deadline, (live_actors(), ray.available_resources())
        time.sleep(0.2)


@pytest.mark.parametrize("total", [-1, 0])
def test_a_budget_that_is_not_positive_is_refused_before_anything_starts(total):
    with pytest.raises(RayCollectorError, match="total_frames=None") as caught:
        ray_collector(TASK, TextPolicy("scripted", task_id=TASK), num_collectors=2, frames_per_batch=4,
                      total_frames=total)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(RayCollectorError, match="total_dialog_turns=None"):
        ray_llm_collector(TASK, None, dialog_turns_per_batch=1, total_dialog_turns=total)


def test_keywords_go_where_torchrl_reads_them():
    own, worker = split_collector_kwargs({"max_frames_per_traj": 10, "compact_obs": True, "use_buffers": False})
    assert own == {"max_frames_per_traj": 10}
    assert worker == {"compact_obs": True, "use_buffers": False}
    with pytest.raises(TypeError, match="'no_such_option'"):
        split_collector_kwargs({"no_such_option": 1})


def test_more_cpus_than_the_largest_node_fails_at_once_and_starts_nothing(session):
    wait_until_idle(session)
    started = time.monotonic()
    with pytest.raises(RayResourceError, match="largest alive node has 2") as caught:
        ray_collector(TASK, TextPolicy("scripted", task_id=TASK), num_collectors=1, frames_per_batch=4,
                      total_frames=8, num_cpus_per_collector=session.largest_node_cpus() + 1)
    assert time.monotonic() - started < PROMPTLY  # TorchRL 0.14 alone waits for the actor forever
    assert isinstance(caught.value, RayConnectionError)
    with pytest.raises(RayResourceError, match="3 actors asking for 1 CPU each do not fit"):
        ray_collector(TASK, TextPolicy("scripted", task_id=TASK), num_collectors=3, frames_per_batch=3,
                      total_frames=9, num_cpus_per_collector=1)
    assert time.monotonic() - started < PROMPTLY
    assert live_actors() == []
    assert ray.available_resources().get("CPU") == ray.cluster_resources().get("CPU", 0.0)


def test_cpus_held_by_someone_else_fail_after_the_wait(session):
    from ray.util.placement_group import placement_group, remove_placement_group

    wait_until_idle(session)
    # reserves every CPU, with no process behind it
    held = placement_group([{"CPU": ray.cluster_resources().get("CPU", 0.0)}])
    ray.get(held.ready(), timeout=PROMPTLY)
    try:
        started = time.monotonic()
        with pytest.raises(RayResourceError, match="cannot be placed now"):
            ray_collector(TASK, TextPolicy("scripted", task_id=TASK), num_collectors=2, frames_per_batch=4,
                          total_frames=8, schedule_timeout=1.0)
        assert 1.0 <= time.monotonic() - started < PROMPTLY  # the schedule timeout's wait, then no longer
        assert live_actors() == []
    finally:
        remove_placement_group(held)


def test_two_ray_collectors_play_episodes_with_the_scripted_policy(session):
    collector = ray_collector(TASK, TextPolicy("scripted", task_id=TASK), num_collectors=2, frames_per_batch=4,
                              total_frames=32, auto_register_policy_transforms=False)  # a per-worker keyword
    assert type(collector).__name__ == "RayCollector"
    try:
        assert len(collector) == 8  # TorchRL 0.14's RayCollector alone fails here (AttributeError)
        batches = list(collector)  # TorchRL shuts the collector down once the budget is collected
    finally:
        collector.shutdown()
    assert sum(batch.numel() for batch in batches) == 32
    assert all(batch.batch_size == (1, 4) for batch in batches)  # the env's default (1,), 4 steps per batch

    steps: dict[str, list] = {}
    for batch in batches:
        for frame in batch.reshape(-1).unbind(0):
            steps.setdefault(frame["next", "env_index"], []).append(frame)
    assert sorted(steps) == ["0", "1"]  # each actor's env records its own index
    for frames in steps.values():
        assert all(frame["query"] == TASK for frame in frames)
        assert all(isinstance(frame["text", "response"], str) and frame["text", "response"] for frame in frames)
        episodes: dict[int, list] = {}
        for frame in frames:
            episodes.setdefault(int(frame["collector", "traj_ids"]), []).append(frame)
        finished = [episode for episode in episodes.values() if bool(episode[-1]["next", "done"].any())]
        assert finished, "16 steps of the scripted policy finish at least one episode"
        for episode in finished:
            assert [bool(f["next", "done"].any()) for f in episode] == [False] * (len(episode) - 1) + [True]
            assert sum(float(f["next", "reward"].sum()) for f in episode) > 0  # the scripted strategy scores
    wait_until_idle(session)


def test_ray_llm_collector_over_a_tiny_offline_model(session):
    from torchrl.modules.llm import TransformersWrapper

    from mlgym_registry.testing.tiny_model import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    policy = TransformersWrapper(tiny_model(tokenizer), tokenizer=tokenizer, input_mode="history", generate=True,
                                 generate_kwargs={"max_new_tokens": 8, "do_sample": True})
    collector = ray_llm_collector(TASK, policy, dialog_turns_per_batch=2, total_dialog_turns=4,
                                  env_options={"tokenizer": tokenizer, "max_turns": 2})
    batches = []
    try:
        for batch in collector:  # TorchRL 0.14's own RayLLMCollector would go on yielding None here
            batches.append(batch)
            assert len(batches) <= 2, "the iteration must stop once 4 turns are collected"
    finally:
        collector.shutdown()
    assert len(batches) == 2
    for batch in batches:
        assert batch.batch_size == (1, 2)  # two turns of the (1,) env: one whole episode with max_turns=2
        assert batch["next", "done"].reshape(-1).tolist() == [False, True]
        assert [q for row in batch["query"] for q in row] == [TASK, TASK]
        assert all(isinstance(text, str) for row in batch["text", "response"] for text in row)
    wait_until_idle(session)  # shutdown() ends the actor too (TorchRL's leaves it alive)


def test_torchrl_collector_with_the_ray_backend_takes_our_env_factory(session):
    """docs/scaling.md's ``Collector(..., backend="ray")``: TorchRL's own collector over our ``EnvFactory``, with the
    Ray options that page gives."""
    from torchrl.collectors import Collector
    from torchrl.weight_update import NoWeightSyncScheme

    from mlgym_registry.interop.torchrl.env_factory import EnvFactory

    collector = Collector(
        EnvFactory.from_spec(TASK), TextPolicy("scripted", task_id=TASK), backend="ray", num_collectors=2,
        frames_per_batch=4, total_frames=8,
        backend_options={
            "remote_configs": {"num_cpus": 1},
            "collector_kwargs": {"auto_register_policy_transforms": False},
            "weight_sync_schemes": {"policy": NoWeightSyncScheme()},
        },
    )
    try:
        batches = [batch for batch in collector]  # noqa: C416 - list() asks TorchRL 0.14's RayCollector its len()
    finally:
        collector.shutdown()
    assert sum(batch.numel() for batch in batches) == 8
    assert all(frame == TASK for batch in batches for frame in batch.reshape(-1)["query"])
    wait_until_idle(session)
