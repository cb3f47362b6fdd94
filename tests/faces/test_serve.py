"""``mlgym-registry serve``: OpenEnv's own client and validator against a server this test starts on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.env_server.http_server")
psutil = pytest.importorskip("psutil")
requests = pytest.importorskip("requests")

from openenv import GenericEnvClient  # noqa: E402

TASK = "prisonersDilemma"
TOKEN = "test-token-0123456789abcdef"
CLI = [sys.executable, "-m", "mlgym_registry.cli"]


class Server:
    """A ``serve`` subprocess with its own temporary folder (where its workspaces go)."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None):
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        environ = {**os.environ, "TMPDIR": str(tmp), **(env or {})}
        self.proc = subprocess.Popen([*CLI, "serve", TASK, "--port", "0", *args], env=environ, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        line = self.proc.stdout.readline()  # the first line says where it listens (or why it failed)
        assert "serving" in line, line + self.proc.stdout.read()
        self.url = line.split(" at ")[-1].strip()

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def workspaces(self) -> list[Path]:
        return sorted(self.tmp.glob("mlgym-registry-*"))

    def stop(self) -> int:
        """SIGTERM, and the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def wait_until(check, timeout: float = 120.0) -> bool:  # a ceiling for a loaded machine: returns once true
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def gone(procs: list[psutil.Process]) -> bool:
    return not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def in_process():
    """A seeded episode of the scripted policy through ``registry.make``: its responses, turns and info."""
    from mlgym_registry import registry
    from mlgym_registry.episodes.episode import run_episode
    from mlgym_registry.policies import make_policy

    env = registry.make(TASK)
    try:
        return run_episode(env, make_policy("scripted", task_id=TASK), seed=0)
    finally:
        env.close()


def client(url: str, **kwargs):
    return GenericEnvClient(base_url=url, message_timeout_s=600, **kwargs).sync()


@pytest.mark.slow
def test_seeded_episode_equals_in_process_rollout(server, in_process):
    with client(server.url) as env:
        with pytest.raises(RuntimeError, match="before reset"):
            env.step({"response": "ls"})
        first = env.reset(seed=0)
        assert first.observation["metadata"]["task"] == TASK and not first.done
        served = [env.step({"response": turn.response}) for turn in in_process.turns]
        for turn, result in zip(in_process.turns, served, strict=True):
            meta = result.observation["metadata"]
            assert (result.reward, result.done, meta["output"], meta["action"]) == \
                   (pytest.approx(turn.reward), turn.done, turn.observation, turn.action)
        assert served[-1].done
        assert served[-1].observation["metadata"]["exit_status"] == in_process.info["exit_status"] == "submitted"
        assert served[-1].observation["metadata"]["score"] == in_process.info["score"]
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step({"response": "ls"})
        state = env.state()
        assert state["episode_done"] and state["step_count"] == len(in_process.turns) and state["seed"] == 0
        again = env.reset(seed=0, prompt=True)  # the session still works, and the prompt comes on request
        assert again.observation["message"] == first.observation["message"]
        assert first.observation["prompt"] is None
        assert first.observation["message"][:200] in again.observation["prompt"]


def test_openenv_validate_passes(server):
    from openenv.cli._validation import validate_running_environment

    report = validate_running_environment(server.url, timeout_s=30)
    assert report["passed"], report["criteria"]
    assert report["mode"] == "production"  # no stateless /reset, /step or /state


def test_routes_and_guards_without_token(server):
    assert requests.post(f"{server.url}/reset", json={}).status_code == 404
    tasks = requests.post(f"{server.url}/mlgym/tasks", json={"split": "test"}).json()["tasks"]
    assert [task["name"] for task in tasks] == [TASK]
    assert requests.get(f"{server.url}/serving").json()["message_timeout_s"] > 3600
    assert requests.get(f"{server.url}/health", headers={"Origin": "http://example.com"}).status_code == 403
    assert requests.get(f"{server.url}/health", headers={"Host": "attacker.example"}).status_code == 403
    assert requests.get(f"{server.url}/web").status_code in (403, 404)


@pytest.mark.slow
def test_close_leaves_no_process_or_workspace(server):
    before = server.descendants()
    with client(server.url) as env:
        env.reset(seed=1)
        started = [p for p in server.descendants() if p not in before]
        assert started and server.workspaces()
    assert wait_until(lambda: gone(started) and not server.workspaces())


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-token"), "--token-env", "SERVE_TOKEN", "--max-sessions", "1",
                 env={"SERVE_TOKEN": TOKEN})
    yield srv
    srv.stop()


def test_token_enforced_on_http_and_websocket(token_server):
    url, auth = token_server.url, {"Authorization": f"Bearer {TOKEN}"}
    assert requests.get(f"{url}/metadata").status_code == 401
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    assert requests.get(f"{url}/metadata", headers=wrong).status_code == 401
    assert requests.get(f"{url}/metadata", headers=auth).status_code == 200
    assert requests.get(f"{url}/health").status_code == 200  # AutoEnv's probe
    with pytest.raises(ConnectionError):
        client(url).reset()
    with pytest.raises(ConnectionError, match="403"):
        client(url, headers=wrong).reset()


@pytest.mark.slow
def test_session_past_the_limit_is_refused(token_server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with client(token_server.url, headers=headers) as first:
        first.reset(seed=0)
        with client(token_server.url, headers=headers) as second:
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                second.reset()
    assert wait_until(lambda: requests.get(f"{token_server.url}/serving", headers=headers)
                      .json()["active_sessions"] == 0)
    with client(token_server.url, headers=headers) as third:  # the slot came free with the first session
        assert not third.reset(seed=0).done


def test_non_loopback_host_without_token_is_refused_at_start():
    result = subprocess.run([*CLI, "serve", TASK, "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "needs a token" in result.stderr


def test_token_file_readable_by_others_is_refused(tmp_path, monkeypatch):
    from mlgym_registry.faces.openenv import ServingError, load_token

    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o644)
    with pytest.raises(ServingError, match="readable by others"):
        load_token(token_file=str(path))
    path.chmod(0o600)
    assert load_token(token_file=str(path)) == TOKEN
    monkeypatch.setenv("SERVE_SHORT_TOKEN", "short")
    with pytest.raises(ServingError, match="at least"):
        load_token(token_env="SERVE_SHORT_TOKEN")


@pytest.mark.slow
def test_sigterm_closes_every_session(tmp_path):
    srv = Server(tmp_path / "serve")
    try:
        env = client(srv.url)
        env.reset(seed=0)
        started = srv.descendants()
        assert started and srv.workspaces()
        assert srv.stop() == 0
        assert wait_until(lambda: gone(started)), [p.cmdline() for p in started if p.is_running()]
        assert not srv.workspaces()
    finally:
        srv.stop()


def test_autoenv_finds_the_client(tmp_path, monkeypatch):
    """OpenEnv's discovery, given the distribution name it looks for (plugins/openenv-mlgym-registry)."""
    from openenv.auto._discovery import EnvironmentDiscovery

    info = tmp_path / "openenv_mlgym_registry-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: openenv-mlgym-registry\nVersion: 0.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = EnvironmentDiscovery()._discover_installed_packages()["mlgym"]
    from mlgym_registry.client import MlgymAction, MlgymEnv

    assert (found.get_client_class(), found.get_action_class()) == (MlgymEnv, MlgymAction)


def test_client_timeout_never_continues_silently_in_a_fresh_session(server):
    """OpenEnv's client drops the connection when a reply outlasts its message timeout and reconnects on the next
    call: that call reaches a new, un-reset session, which says so instead of playing on."""
    env = client(server.url)
    try:
        env.reset(seed=0)
        env.async_client._message_timeout = 0.5  # as if a training command outlasted OpenEnv's 60 s default
        with pytest.raises(TimeoutError):
            env.step({"response": "Wait.\n```\nsleep 2\n```"})
        with pytest.raises(RuntimeError, match="before reset"):
            env.step({"response": "Look.\n```\nls\n```"})
    finally:
        env.close()


TOOL_CALL_LS = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'


@pytest.mark.slow
def test_components_swapped_on_the_command_line_are_served(tmp_path):
    """``serve --parser --template --reward``, as ``run`` takes them: the served session's system message and parsing
    are those of ``registry.make``'s env with the same components."""
    from mlgym_registry.faces.gymnasium import MLGymRegistryEnv

    components = {"parser": "tool_calls", "template": "tool_calling", "reward": "mlgym_best_improvement"}
    local = MLGymRegistryEnv(TASK, **components)
    try:
        first, info = local.reset(seed=0)
        expected = local.step(TOOL_CALL_LS)[0]
    finally:
        local.close()
    srv = Server(tmp_path / "serve", *(arg for kind, name in components.items() for arg in (f"--{kind}", name)))
    try:
        with client(srv.url) as env:
            reset = env.reset(seed=0)
            assert reset.observation["metadata"]["system"] == info["system"]
            assert reset.observation["message"] == first
            step = env.step({"response": TOOL_CALL_LS})
            assert step.observation["message"] == expected and "evaluate.py" in expected
            assert step.observation["metadata"]["action"].strip() == "ls"
    finally:
        srv.stop()


def test_an_unknown_component_is_refused_before_serving():
    done = subprocess.run([*CLI, "serve", TASK, "--port", "0", "--parser", "tool_cals"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "tool_cals" in done.stderr and "tool_calls" in done.stderr, done.stderr
