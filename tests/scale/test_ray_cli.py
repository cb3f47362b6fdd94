"""``mlgym-registry run --ray`` as a user runs it, on real Ray runtimes started by the tests.

- a head node started with ``ray start --head`` on loopback, addressed with ``--ray 127.0.0.1:PORT``;
- a two-node cluster on this machine (``ray.cluster_utils.Cluster``), in a fresh interpreter (this process may hold a
  Ray runtime of its own): the episodes spread over the nodes, and losing a node mid-episode fails only the episode it
  was playing;
- ``--ray`` alone, interrupted: every file stays valid JSON, and no Ray process, temporary folder or file in the
  home folder is left;
- bad input: an address nobody answers, Ray not installed, an unknown task.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import default_sigint, run_cli, run_python

from mlgym_registry.scale.ray_runtime import WORKER_PRIORITY_ENVIRONMENT

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.slow, pytest.mark.ray]

TASK = "prisonersDilemma"
"""The task the runs play: its evaluation costs a third of blotto's, and what is checked here is Ray's part."""
LONG_TASK = "blotto"
"""The task of the run that is interrupted: its scripted episodes last long enough to be interrupted mid-way."""
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def quiet_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment with its own home folder (checked for files Ray should not write there). The clusters the
    tests start with it give their workers normal priority, as ``ray_session`` does: at Ray's niceness 15 they
    starve on a busy CI machine."""
    env = dict(os.environ, HOME=str(home), RAY_USAGE_STATS_ENABLED="0", **WORKER_PRIORITY_ENVIRONMENT, **extra)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if text in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline[:200])
    return found


def stop_group(process: subprocess.Popen, timeout: float = 20) -> None:
    """Stop a process started in its own session, and everything it started."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def short_tmp():
    """A temporary folder with a short path (Ray's socket paths must fit in 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


HEAD_ENVIRONMENT = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
"""For the head node the test starts and stops: on SIGTERM ``ray start --block`` first drains the node, for up to 30 s
(Ray's default), before it stops its processes, which the same signal (sent to the group) has already ended; every stop
ran out the 20 s ``stop_group`` gives before it kills. 0 is Ray's switch for stopping at once; what the test checks is
the run, and that nothing is left running after the stop."""


def start_head(env: dict[str, str], temp_dir: Path, attempts: int = 3) -> tuple[subprocess.Popen, int]:
    """``ray start --head --block`` on loopback, and its port, once the port answers. Ray waits a fixed 30 s for the
    raylet to register, which a loaded machine can miss (``ray start`` then exits): that is the machine's load, not
    what the test checks, so a head that ended before its port answered is started again on a fresh port (``attempts``
    in all)."""
    for attempt in range(attempts):
        port = free_port()
        log = temp_dir.parent / f"ray-start-{attempt}.log"
        with log.open("w") as output:
            head = subprocess.Popen(
                [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
                 "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir",
                 str(temp_dir)],
                env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300  # a ceiling for a loaded machine, not a timing
        while head.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return head, port
            except OSError:
                time.sleep(0.5)
        stop_group(head)
        if attempt == attempts - 1:
            pytest.fail(f"ray start --head never answered ({attempts} attempts): {log.read_text()[-2000:]}")
    raise AssertionError("unreachable")


def test_run_on_a_head_node_started_with_ray_start(tmp_path, short_tmp):
    home = tmp_path / "home"
    home.mkdir()
    env = quiet_env(home, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled", **HEAD_ENVIRONMENT)
    head, port = start_head(env, short_tmp / "ray")
    try:
        out = tmp_path / "out"
        done = run_cli("run", TASK, "--max-steps", "2", "--num-envs", "2", "--ray", f"127.0.0.1:{port}",
                       "--seed", "1", "--out", str(out), env=quiet_env(home, RAY_AUTH_MODE="disabled"))
        assert done.returncode == 0, done.stdout + done.stderr
        for index in (0, 1):
            saved = json.loads((out / f"env{index}" / "results.json").read_text())
            assert saved["agent"] and "failed" not in saved
        assert f"episodes done on Ray (127.0.0.1:{port}): 100%" in done.stderr
    finally:
        stop_group(head)
    assert processes_mentioning(str(short_tmp)) == []


CLUSTER_SCRIPT = """
import json, time
import ray
from ray._private.state import actors  # the public state API needs the dashboard, which these nodes leave off
from ray.cluster_utils import Cluster
from mlgym_registry import registry
from mlgym_registry.scale.runs import run_episodes

def start_cluster():
    # Ray waits a fixed 30 s for a raylet to register, which a loaded CI machine can exceed: that is the machine's
    # load, not what this test checks, so a node that timed out during startup gets a fresh cluster (twice at most)
    for attempt in range(3):
        cluster = Cluster()
        try:
            cluster.add_node(num_cpus=1)  # the head
            worker = cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            return cluster, worker
        except Exception as exc:
            cluster.shutdown()
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise

cluster, worker_node = start_cluster()
ray.init(address=cluster.address)
spec = registry.spec("prisonersDilemma").replace(max_steps=3)
placed = {}

def episode_workers():
    # pid -> node of each live EpisodeWorker actor (every actor of this cluster is the run's)
    return {entry["Pid"]: entry["Address"]["NodeID"] for entry in actors().values()
            if entry["ActorClassName"] == "EpisodeWorker" and entry["State"] == "ALIVE"}

def lose_worker_node(finished, steps):
    # called at the first turn played: until this returns the run asks for no other turn (the other env can finish
    # at most the one call it has in flight), so both envs are mid-episode (3 turns each). Once both actors are up,
    # one on each node (SPREAD; a node has room for one), the worker node goes with the episode it is playing.
    if placed:
        return
    deadline = time.monotonic() + 300  # a ceiling for a loaded machine, not a timing
    while len(episode_workers()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    placed.update(episode_workers())
    cluster.remove_node(worker_node)

results = run_episodes(spec, "scripted", 2, engine="ray", seed=0, on_step=lose_worker_node)
print(json.dumps({
    "results": [[r.finished, r.worker.get("node_id"), r.worker.get("pid"), r.failure] for r in results],
    "placed": placed, "lost": worker_node.node_id, "head": cluster.head_node.node_id,
}))
ray.shutdown()
cluster.shutdown()
"""


def test_episodes_spread_over_nodes_and_a_lost_node_fails_only_its_episode(tmp_path, short_tmp):
    home = tmp_path / "home"
    home.mkdir()
    done = run_python(CLUSTER_SCRIPT, env=quiet_env(home, RAY_AUTH_MODE="disabled", TMPDIR=str(short_tmp)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    head, lost = report["head"], report["lost"]
    assert sorted(report["placed"].values()) == sorted([head, lost]), report  # one env's actor on each node
    finished = [outcome for outcome in report["results"] if outcome[0]]
    failed = [outcome for outcome in report["results"] if not outcome[0]]
    assert len(finished) == len(failed) == 1, report
    [(_, node, pid, failure)] = finished
    assert node == head and report["placed"][str(pid)] == head and not failure  # the head's env played to the end
    [(_, node, _, failure)] = failed
    assert node in (lost, None)  # None: its actor's node was lost before it said where it runs
    assert failure.startswith("its Ray actor died"), failure
    assert processes_mentioning(str(short_tmp)) == []


def test_an_interrupted_local_runtime_run_leaves_valid_files_and_nothing_running(tmp_path, short_tmp):
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "mlgym_registry.cli", "run", LONG_TASK, "--num-envs", "2",
                            "--ray", "--out", str(out)], env=quiet_env(home, TMPDIR=str(short_tmp)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 300  # Ray's start-up and two envs' first turns, on a machine other tests load
        while time.monotonic() < deadline and run.poll() is None and not list(out.glob("env*/*.traj")):
            time.sleep(0.2)
        assert run.poll() is None, "the run ended before it was interrupted: " + "".join(run.communicate())[-4000:]
        assert list(out.glob("env*/*.traj")), "no episode started"
        time.sleep(1.0)
        os.kill(run.pid, signal.SIGINT)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            stop_group(run)
    assert run.returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    for path in out.glob("env*/*"):
        json.loads(path.read_text())  # every file is complete JSON
    failed = [json.loads(path.read_text()).get("failed") for path in out.glob("env*/results.json")]
    assert "interrupted before the episode ended" in failed
    assert processes_mentioning(str(short_tmp)) == []
    # Ray's files and the local backend's folders (torch may leave its compile cache there: not ours)
    assert [path.name for path in short_tmp.glob("mlgym-*")] == []
    assert list(home.iterdir()) == []  # no ~/.ray (auth token) or usage report


def test_an_address_nobody_answers_fails_fast_and_names_it(tmp_path):
    port = free_port()
    started = time.monotonic()
    done = run_cli("run", TASK, "--num-envs", "2", "--ray", f"127.0.0.1:{port}", "--out", str(tmp_path / "out"))
    # a ceiling, not a timing: the check gives up after CONNECT_TIMEOUT (10 s); the rest is room for the CLI's own
    # start on a loaded machine
    assert time.monotonic() - started < 90
    assert done.returncode != 0
    assert f"no Ray cluster answers at '127.0.0.1:{port}'" in done.stderr
    assert "ray start --head" in done.stderr
    assert not (tmp_path / "out").exists()


def test_ray_not_installed_names_the_extra(tmp_path):
    code = f"""
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        from mlgym_registry.cli import main
        sys.exit(main(["run", "{TASK}", "--num-envs", "2", "--ray", "--out", {str(tmp_path / "out")!r}]))
    """
    done = run_python(code)
    assert done.returncode == 2, done.stderr
    assert "pip install 'mlgym-registry[ray]'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_task_fails_before_ray_starts(tmp_path):
    started = time.monotonic()
    done = run_cli("run", "blottoo", "--ray", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "Did you mean 'blotto'" in done.stderr
    assert time.monotonic() - started < 90  # a ceiling for a loaded machine: no Ray runtime was waited for


def test_a_cpu_share_of_zero_is_refused_before_anything_starts(tmp_path):
    done = run_cli("run", TASK, "--ray", "--cpus-per-env", "0", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "--cpus-per-env 0: each actor needs a CPU share above 0" in done.stderr
    assert not (tmp_path / "out").exists()
