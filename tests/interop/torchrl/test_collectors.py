"""Envs rebuilt in worker processes from a spec dict (``env_factory``); the text-policy module TorchRL's collectors run
(``collectors``); ParallelEnv over the factory."""

from __future__ import annotations

import multiprocessing
import pickle
import traceback

import pytest

from mlgym_registry import TaskSpec, registry
from mlgym_registry.interop.torchrl.collectors import TextPolicy
from mlgym_registry.interop.torchrl.env_factory import INFO_KEY, WORKER_KEY, EnvFactory
from mlgym_registry.transforms.history import as_dicts


def first_turn(factory: EnvFactory) -> tuple[list[str], str]:
    """In a worker: build the env, reset it, play one command; the roles of the conversation and the output."""
    env = factory()
    try:
        td = env.reset()
        roles = [message["role"] for message in as_dicts(td["history", "prompt"])]
        td["text", "response"] = "DISCUSSION\nlook\n```\nls\n```"
        td = env.step(td)
        return roles, str(td["next", "observation"])
    finally:
        env.close()


def answer_first_turn(factory: EnvFactory, connection) -> None:
    """Worker entry point: send ``first_turn``'s result, or the traceback of what went wrong."""
    try:
        connection.send(("ok", first_turn(factory)))
    except Exception:  # noqa: BLE001 - sent back to the test, which reports it
        connection.send(("error", traceback.format_exc()))


def local_only_task() -> TaskSpec:
    """A task registered in this process only (the worker never sees the registration)."""
    spec = registry.spec("blotto").to_dict()
    return TaskSpec.from_dict({**spec, "id": "blottoLocalOnly", "components": {}})


def test_a_spawned_worker_rebuilds_an_env_registered_only_here():
    registry.register("task", "blottoLocalOnly", local_only_task())
    try:
        factory = EnvFactory.from_spec("blottoLocalOnly")
    finally:
        registry.unregister("task", "blottoLocalOnly")
    assert pickle.loads(pickle.dumps(factory)) == factory
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing registered by this process
    receiver, sender = context.Pipe(duplex=False)
    worker = context.Process(target=answer_first_turn, args=(factory, sender))
    worker.start()
    try:
        assert receiver.poll(300), f"the worker gave no answer (exit code {worker.exitcode})"
        status, answer = receiver.recv()
    finally:
        worker.join(30)
        if worker.is_alive():
            worker.kill()
    assert status == "ok", answer
    roles, observation = answer
    assert roles == ["system", "user"]
    assert "strategy.py" in observation


def test_text_policy_module_plays_an_episode_and_records_info():
    factory = EnvFactory.from_spec("prisonersDilemma", max_steps=4)
    module = pickle.loads(pickle.dumps(TextPolicy("scripted", task_id="prisonersDilemma")))
    env = factory()
    try:
        td = env.reset()
        assert td[WORKER_KEY] == "0" and td[INFO_KEY] == ""
        actions = []
        for _ in range(6):
            td = module(td)
            actions.append(str(td["text", "response"]).split("```\n")[1].splitlines()[0])
            td = env.step(td)
            if td["next", "done"].item():
                break
            td = td["next"].exclude("reward", "done", "terminated", "truncated")
        assert actions[:3] == ["ls -a", 'open "strategy.py"', "edit 1:24"]
        assert '"exit_status": "autosubmission (max_steps)"' in td["next", INFO_KEY]
    finally:
        env.close()


@pytest.mark.slow
def test_parallel_env_over_the_factory():
    from torchrl.envs import ParallelEnv

    from mlgym_registry.scale.workers import warm_workers

    factories = [EnvFactory.from_spec("battleOfSexes"), EnvFactory.from_spec("battleOfSexes")]
    with warm_workers() as method:  # forked workers (test_factories_work_in_spawned_workers spawns them)
        env = ParallelEnv(2, factories, use_buffers=False, consolidate=False, mp_start_method=method)
    try:
        td = env.reset()
        assert td.batch_size == (2, 1)  # two workers, each env with ChatEnv's batch size (1,)
        td["text", "response"] = [["DISCUSSION\nlook\n```\nls\n```"]] * 2
        td = env.step(td)
        observations = [row[0] for row in td["next", "observation"]]
        assert len(observations) == 2 and all("strategy.py" in text for text in observations)
    finally:
        env.close()


def test_a_factory_env_seeds_each_of_its_episodes_as_rays_runner_does():

    env = EnvFactory.from_spec("blotto", batch_size=())
    env = EnvFactory(env.spec, env.options, seed=7, seed_stride=3)()  # env 0 of 3 started at seed 7
    try:
        seeds = []
        reset = env.base_env.backend.reset
        env.base_env.backend.reset = lambda seed=None, **kw: (seeds.append(seed), reset(seed=seed, **kw))[1]
        for _ in range(3):
            env.reset()
        assert seeds == [7, 10, 13]  # seed + k * num_envs + i
    finally:
        env.close()


def test_an_idle_worker_pauses_before_forfeiting():
    import time

    from mlgym_registry.interop.torchrl.collectors import IDLE_RESPONSE

    env = EnvFactory.from_spec("prisonersDilemma", batch_size=())()
    try:
        module = TextPolicy("scripted", task_id="prisonersDilemma", episodes=0, idle_pause=0.2)
        started = time.monotonic()
        td = module(env.reset())
        assert time.monotonic() - started >= 0.2
        assert td["text", "response"] == IDLE_RESPONSE
    finally:
        env.close()


