"""Several episodes at once in worker processes (``run_parallel``, ``run_episodes``), and the warm workers they are
forked from (``scale/workers.py``)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from conftest import run_python

from mlgym_registry.scale.runs import run_parallel


@pytest.mark.slow
def test_run_parallel_plays_each_env_to_the_end(tmp_path):
    results = run_parallel("battleOfSexes", "scripted", 2, out=tmp_path, seed=3, episodes_per_env=2)
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
    shared = run_parallel("battleOfSexes", "scripted", 4, out=tmp_path / "two", seed=3, workers=2)
    alone = run_parallel("battleOfSexes", "scripted", 4, out=tmp_path / "four", seed=3, workers=4)
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
