"""Envs rebuilt in worker processes from a spec dict; the text-policy module; ParallelEnv and collectors over them."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback

import pytest
from conftest import run_python

from mlgym_registry import TaskSpec, registry
from mlgym_registry.scale.parallel import INFO_KEY, WORKER_KEY, EnvFactory, TextPolicy, run_parallel
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

    factories = [EnvFactory.from_spec("battleOfSexes"), EnvFactory.from_spec("battleOfSexes")]
    env = ParallelEnv(2, factories, use_buffers=False, consolidate=False)
    try:
        td = env.reset()
        assert td.batch_size == (2, 1)  # two workers, each env with ChatEnv's batch size (1,)
        td["text", "response"] = [["DISCUSSION\nlook\n```\nls\n```"]] * 2
        td = env.step(td)
        observations = [row[0] for row in td["next", "observation"]]
        assert len(observations) == 2 and all("strategy.py" in text for text in observations)
    finally:
        env.close()


@pytest.mark.slow
def test_run_parallel_plays_each_env_to_the_end(tmp_path):
    results = run_parallel("blotto", "scripted", 2, out=tmp_path, seed=3, episodes_per_env=2)
    assert len(results) == 4 and all(result.finished for result in results)
    # when an evaluation fails, say how (it once came back unscored under a loaded CI machine)
    unscored = [(result.stop_reason, result.failure, result.info) for result in results
                if result.improvement is None]
    assert not unscored, unscored
    assert all(result.improvement > 0 for result in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env0-0", "env0-1", "env1-0", "env1-1"]


@pytest.mark.slow
def test_a_worker_plays_several_envs_at_once_each_as_it_would_alone(tmp_path):
    """Four envs in two workers (two envs each, in threads) play the episodes four workers play, seed for seed."""
    shared = run_parallel("blotto", "scripted", 4, out=tmp_path / "two", seed=3, workers=2)
    alone = run_parallel("blotto", "scripted", 4, out=tmp_path / "four", seed=3, workers=4)
    pids = [result.worker["pid"] for result in shared]
    assert pids[0] == pids[2] != pids[1] == pids[3]  # env i plays in worker i % 2
    assert len({result.worker["pid"] for result in alone}) == 4
    assert all(result.finished and not result.failure for result in shared + alone)
    assert [result.info["score"] for result in shared] == [result.info["score"] for result in alone]
    assert [len(result.turns) for result in shared] == [len(result.turns) for result in alone]


def test_run_episodes_refuses_an_unknown_engine_and_ray_options_without_ray():
    from mlgym_registry.options import InvalidOptionError
    from mlgym_registry.scale.runs import run_episodes

    with pytest.raises(InvalidOptionError, match="engine='threads' is not one of process, ray"):
        run_episodes("blotto", "scripted", 2, engine="threads")
    with pytest.raises(InvalidOptionError, match="pass engine='ray'"):
        run_episodes("blotto", "scripted", 2, address="127.0.0.1:6379")
    with pytest.raises(InvalidOptionError, match="workers=0: give a number of worker processes, 1 or more"):
        run_episodes("blotto", "scripted", 2, workers=0)
    with pytest.raises(InvalidOptionError, match="workers= is for engine='process'"):
        run_episodes("blotto", "scripted", 2, engine="ray", workers=2)
    pytest.importorskip("ray")
    with pytest.raises(InvalidOptionError, match="cpus_per_env=0: each actor needs a CPU share above 0"):
        run_episodes("blotto", "scripted", 2, engine="ray", cpus_per_env=0)


def test_a_factory_env_seeds_each_of_its_episodes_as_rays_runner_does():
    from mlgym_registry.scale.parallel import EnvFactory

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


def late_variable() -> str | None:
    """In a worker: the variable the test sets after the fork server started."""
    return os.environ.get("MLGYM_REGISTRY_TEST_LATE")


def report_origin(factory, connection) -> None:
    """Worker entry point: send the worker's parent pid, the pid of the process that started it, and
    ``factory()``."""
    connection.send((os.getppid(), multiprocessing.parent_process().pid, factory()))


def test_warm_workers_fork_from_the_server_with_this_process_environment(monkeypatch):
    from mlgym_registry.scale.workers import WithParentEnviron, warm_workers

    monkeypatch.delenv("MLGYM_REGISTRY_WORKER_START", raising=False)
    before = multiprocessing.get_start_method(allow_none=True)
    with warm_workers() as method:
        assert method == "forkserver" and multiprocessing.get_start_method() == "forkserver"
        monkeypatch.setenv("MLGYM_REGISTRY_TEST_LATE", "set after the server started")
        receiver, sender = multiprocessing.Pipe(duplex=False)
        worker = multiprocessing.Process(target=report_origin, args=(WithParentEnviron(late_variable), sender))
        worker.start()
    assert multiprocessing.get_start_method(allow_none=True) == before  # restored after the block
    try:
        assert receiver.poll(300), f"the worker gave no answer (exit code {worker.exitcode})"
        parent, starter, value = receiver.recv()
    finally:
        worker.join(30)
        if worker.is_alive():
            worker.kill()
    assert starter == os.getpid() and parent != os.getpid()  # a fork of the server, started on this process' behalf
    assert value == "set after the server started"
    assert WithParentEnviron(late_variable)() == "set after the server started"  # here, a plain call


def test_a_start_method_other_than_forkserver_or_spawn_is_refused(monkeypatch):
    from mlgym_registry.options import InvalidOptionError
    from mlgym_registry.scale.workers import warm_workers, worker_start_method

    monkeypatch.setenv("MLGYM_REGISTRY_WORKER_START", "spawn")
    assert worker_start_method() == "spawn"
    with warm_workers() as method:
        assert method == "spawn" and multiprocessing.get_start_method() == "spawn"
    monkeypatch.setenv("MLGYM_REGISTRY_WORKER_START", "fork")
    with pytest.raises(InvalidOptionError, match="MLGYM_REGISTRY_WORKER_START='fork' is not one of forkserver, spawn"):
        worker_start_method()


def test_an_idle_worker_pauses_before_forfeiting():
    import time

    from mlgym_registry.scale.parallel import IDLE_RESPONSE

    env = EnvFactory.from_spec("prisonersDilemma", batch_size=())()
    try:
        module = TextPolicy("scripted", task_id="prisonersDilemma", episodes=0, idle_pause=0.2)
        started = time.monotonic()
        td = module(env.reset())
        assert time.monotonic() - started >= 0.2
        assert td["text", "response"] == IDLE_RESPONSE
    finally:
        env.close()


def test_a_worker_interrupted_inside_a_finalizer_is_interrupted_in_its_job():
    """A Ctrl-C landing while an env's ``__del__`` runs raises there, where Python only prints it ("Exception ignored
    in ... __del__") and goes on: a worker takes it up again in its job instead, and prints nothing."""
    done = run_python("""
        import signal, time
        from mlgym_registry.scale.workers import _interrupt_once

        _interrupt_once()

        class Env:
            def __del__(self):
                signal.raise_signal(signal.SIGINT)
                time.sleep(0.05)

        try:
            Env()
            time.sleep(5)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted in the job")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted in the job" and "Traceback" not in done.stderr, done.stderr


def test_the_workers_share_the_modules_of_the_policy_they_build():
    """``run --num-envs`` has the fork server import the policy's modules (the OpenAI client's cost 27 MiB a worker
    when each imported its own), so a worker finds them imported; a module that cannot be imported is skipped."""
    from mlgym_registry.policies import policy_modules

    assert policy_modules("openai:some-model") == ("openai", "mlgym_registry.policies.openai")
    assert policy_modules("scripted") == ("mlgym_registry.policies.scripted",)
    assert policy_modules("no-such-kind") == ()
    result = run_python("""
        import multiprocessing
        from mlgym_registry.scale.workers import start_worker_server

        if __name__ == "__main__":
            assert start_worker_server(also_import=["json.tool", "no_such_module_anywhere"])
            with multiprocessing.get_context("forkserver").Pool(1) as pool:
                print(pool.apply(eval, ("sorted({'json.tool', 'torch'} & set(__import__('sys').modules))",)))
    """, env={**os.environ, "MLGYM_REGISTRY_WORKER_START": "forkserver"}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "['json.tool', 'torch']"
