"""Episodes as Ray actors (``--ray``) on a real local Ray runtime: files, seeds, faults and clean-up.

One local runtime (``ray_session()``: loopback only, its own temporary folder) serves the whole module, shared with the
other Ray test modules (``shared_ray``); for one run a broken plugin is installed for its workers only (on their
``PYTHONPATH``, not on this process's ``sys.path``), as on a worker node with a bad install.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from shared_ray import RAY_GROUP, shared_ray  # noqa: F401 - the fixture

ray = pytest.importorskip("ray")

from mlgym_registry import registry  # noqa: E402
from mlgym_registry.episodes.episode import run_episode  # noqa: E402
from mlgym_registry.policies import make_policy  # noqa: E402
from mlgym_registry.scale.ray_runtime import RayConnectionError  # noqa: E402
from mlgym_registry.scale.runs import run_episodes  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.xdist_group(RAY_GROUP)]

TASK = "prisonersDilemma"
"""Its score follows the seed, as blotto's does, and its evaluation costs a third of blotto's."""
BROKEN_DIST = "mlgym-registry-broken-on-workers"


@pytest.fixture(scope="session")  # not module: that would take the module out of the shared runtime's group
def workspaces(tmp_path_factory) -> Path:
    """The folder the local backend makes its env folders in, for every test of the module (checked empty)."""
    return tmp_path_factory.mktemp("workspaces")


def options(workspaces: Path) -> dict:
    return {"max_steps": 2, "backend_options": {"workspace_dir": str(workspaces)}}


def spec_for(workspaces: Path):
    return registry.spec(TASK).replace(max_steps=2, backend_options={"workspace_dir": str(workspaces)})


def worker_actors(built: bool = False) -> list[int]:
    """The pids of the live ``EpisodeWorker`` actor processes of this process's local runtime (Ray titles them after
    the class; its workers descend from this process, not the actors of other runtimes on this machine). ``built``:
    only those whose constructor has returned (one still being built is titled ``ray::EpisodeWorker.__init__``)."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            title = (process.cmdline() or [""])[0].strip()
            if (title.startswith("ray::EpisodeWorker") and not (built and title.endswith(".__init__"))
                    and process.status() != psutil.STATUS_ZOMBIE):
                found.append(process.pid)
        except psutil.Error:  # ended meanwhile
            continue
    return found


def assert_clean(workspaces: Path) -> None:
    # Ray ends an actor's process after its task returns; with the suite's other workers busy that took over 10 s once
    deadline = time.monotonic() + 120  # a ceiling for a loaded machine: the loop ends when they are gone
    while (worker_actors() or list(workspaces.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker_actors() == []
    assert list(workspaces.iterdir()) == []


def test_ray_episodes_write_the_same_files_and_scores_as_an_episode_in_this_process(shared_ray, workspaces,  # noqa: F811
                                                                                     tmp_path):
    spec = spec_for(workspaces)
    broken = "raise RuntimeError('this plugin is broken on purpose')\n"
    with shared_ray.installed_on_workers(BROKEN_DIST, "broken_on_workers", broken, entry_point="broken"), \
            pytest.warns(RuntimeWarning, match=f"in a Ray worker: .*{BROKEN_DIST}"):
        results = run_episodes(spec, "scripted", 2, engine="ray", out=tmp_path / "ray", seed=5, episodes_per_env=2)
    assert [result.finished for result in results] == [True] * 4
    assert {result.worker["pid"] for result in results[:2]} != {result.worker["pid"] for result in results[2:]}
    # episode k of env i has seed 5 + k * 2 + i: the first is the in-process episode with seed 5
    env = registry.make(spec, batch_size=())
    try:
        local = run_episode(env, make_policy("scripted", task_id=TASK), seed=5)
    finally:
        env.close()
    assert results[0].info["score"] == local.info["score"]
    assert [turn.action for turn in results[0].turns] == [turn.action for turn in local.turns]
    for folder in ("env0-0", "env0-1", "env1-0", "env1-1"):
        saved = json.loads((tmp_path / "ray" / folder / "results.json").read_text())
        traj = json.loads((tmp_path / "ray" / folder / f"{TASK}.traj").read_text())
        assert saved["agent"] and "failed" not in saved
        assert len(traj["trajectory"]) == len(results[0].turns) or traj["info"]["exit_status"]
    assert json.loads((tmp_path / "ray" / "env0-0" / "results.json").read_text())["agent"] == local.info["score"]
    assert_clean(workspaces)


def test_an_actor_killed_mid_episode_fails_only_its_episode(shared_ray, workspaces, tmp_path):  # noqa: F811
    killed: list[int] = []

    def kill_one(finished: int, steps: int) -> None:
        if steps >= 1 and not killed:
            pid = worker_actors(built=True)[0]  # one playing an episode (the other may still be importing torch)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    # two envs: the one whose actor is killed at the first step fails, the other plays its episode to the end
    results = run_episodes(spec_for(workspaces), "scripted", 2, engine="ray", out=tmp_path, seed=0, on_step=kill_one)
    failed = [result for result in results if result.failure]
    assert len(failed) == 1
    assert failed[0].failure.startswith("its Ray actor died: its worker process has died (exit type ")
    assert failed[0].failure.endswith(f", pid {killed[0]})")
    assert sum(result.finished for result in results) == 1
    index = results.index(failed[0])
    saved = json.loads((tmp_path / f"env{index}" / "results.json").read_text())
    assert saved["failed"] == failed[0].failure
    assert_clean(workspaces)


def test_a_cpu_request_larger_than_any_node_is_refused_before_any_actor_starts(shared_ray, workspaces):  # noqa: F811
    with pytest.raises(RayConnectionError, match=r"cpus_per_env=3.*largest node.*2 CPUs"):
        run_episodes(spec_for(workspaces), "scripted", 1, engine="ray", cpus_per_env=3)
    assert worker_actors() == []  # refused before any actor was asked for (one would wait for a CPU forever)


def test_an_unknown_task_fails_in_the_driver(shared_ray):  # noqa: F811
    from mlgym_registry.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="Did you mean 'blotto'"):
        run_episodes("blottoo", "scripted", 2, engine="ray")
    assert worker_actors() == []


def test_the_local_runtime_runs_its_workers_at_normal_priority(shared_ray):  # noqa: F811
    # Ray's default niceness for workers is 15: on a busy machine the actors that play the episodes would starve
    niceness = ray.get(ray.remote(lambda: os.nice(0)).remote())
    assert niceness == os.nice(0)


def test_a_local_runtime_whose_raylet_missed_rays_startup_wait_is_started_again():
    # Ray waits a fixed 30 s for its raylet; a loaded machine can miss it, which Ray cannot be made to do on demand:
    # a stand-in for ray.init misses it twice, then starts
    from mlgym_registry.scale import ray_runtime

    class SlowStarts:
        def __init__(self, misses: int):
            self.misses, self.inits, self.shutdowns = misses, [], 0

        def init(self, **options):
            self.inits.append(options)
            if len(self.inits) <= self.misses:
                raise Exception("The current node timed out during startup. This could happen because ...")

        def shutdown(self):
            self.shutdowns += 1

    ray_stand_in = SlowStarts(misses=2)
    ray_runtime._start_local_runtime(ray_stand_in, num_cpus=2)
    assert (len(ray_stand_in.inits), ray_stand_in.shutdowns) == (3, 2)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_runtime._start_local_runtime(SlowStarts(misses=3), num_cpus=2)
    with pytest.raises(Exception, match="another failure"):  # any other failure is final at once
        broken = SlowStarts(misses=0)
        broken.init = lambda **options: (_ for _ in ()).throw(RuntimeError("another failure"))
        ray_runtime._start_local_runtime(broken)
