"""Every bad input to the CLI is one `mlgym-registry: error: ...` line and exit status 2, and leaves things as they
were; `--out` folders are never shared or clobbered; command output cannot drive the user's terminal."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

from mlgym_registry.records.trajectories import load_traj

TASK = "prisonersDilemma"
CLI = [sys.executable, "-m", "mlgym_registry.cli"]


def refused(result: subprocess.CompletedProcess, message: str) -> None:
    """The command exited 2 with ``message`` on stderr, printed without a traceback, and nothing on stdout."""
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def error_line(result: subprocess.CompletedProcess) -> str:
    """The single line the CLI printed on stderr."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def one_step(**fields: object) -> bytes:
    """A ``.traj`` of one step whose fields are the defaults changed by ``fields``."""
    step = {"action": "", "observation": "", "response": "r", "state": "", "thought": "", "execution_time": 0, **fields}
    return json.dumps({"environment": "x", "history": [], "info": {}, "trajectory": [step]}).encode()


def write_traj(path: Path, responses: list[str]) -> Path:
    """A minimal well-formed ``.traj`` whose steps hold ``responses``."""
    steps = [{"action": "", "observation": "", "response": response, "state": "", "thought": "", "execution_time": 0.0}
             for response in responses]
    path.write_text(json.dumps({"environment": "mlgym_registry:local", "trajectory": steps, "history": [], "info": {}}))
    return path


# -- values argparse checks ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["run", TASK, "--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    (["run", TASK, "--seed", "abc"], "argument --seed: must be an integer >= 0, got 'abc'"),
    (["run", TASK, "--max-steps", "0"], "argument --max-steps: must be an integer >= 1, got '0'"),
    (["run", TASK, "--num-envs", "0"], "argument --num-envs: must be an integer >= 1, got '0'"),
    (["run", TASK, "--training-timeout", "0"], "argument --training-timeout: must be an integer >= 1, got '0'"),
    (["replay", "x.traj", "--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    (["check", TASK, "--runs", "0"], "argument --runs: must be an integer >= 1, got '0'"),
])
def test_out_of_range_numbers_are_usage_errors(tmp_path, args, message):
    out = tmp_path / "out"
    result = run_cli(*args, "--out", str(out)) if args[0] != "check" else run_cli(*args)
    refused(result, message)
    assert result.stderr.splitlines()[-1] == f"mlgym-registry {args[0]}: error: {message}"
    assert not out.exists()


# -- values checked before anything is written ---------------------------------------------------------------------
@pytest.mark.parametrize(("option", "message"), [
    ("xyzzy=1", "unknown backend option(s) 'xyzzy' for backend 'local'; it takes: "),
    ("command_timout=5", "unknown backend option(s) 'command_timout' (did you mean 'command_timeout'?)"),
    ("command_timeout=abc", "command_timeout (an option of backend 'local') must be a number > 0, got 'abc' (str)"),
    ("long_timeout=0", "long_timeout (an option of backend 'local') must be a number > 0 or None, got 0 (int)"),
    ("network=1", "network (an option of backend 'local') must be a bool (True or False), got 1 (int)"),
    ("no-equals-sign", "-o 'no-equals-sign': a backend option must look like KEY=VALUE"),
])
def test_bad_backend_options_are_refused_before_the_out_folder_is_made(tmp_path, option, message):
    out = tmp_path / "out"
    for command in (["run", TASK], ["replay", str(write_traj(tmp_path / f"{TASK}.traj", ["x"])), "--task", TASK]):
        result = run_cli(*command, "-o", option, "--out", str(out))
        refused(result, message)
        assert error_line(result).startswith(f"mlgym-registry: error: {message}")
        assert not out.exists()


def test_an_out_path_that_is_a_file_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text("keep me")
    for command in (["run", TASK], ["replay", str(write_traj(tmp_path / f"{TASK}.traj", ["x"]))]):
        result = run_cli(*command, "--out", str(out))
        refused(result, "")
        assert error_line(result) == f"mlgym-registry: error: --out {str(out)!r} is a file, not a folder; " \
                                     "choose another --out"
        assert out.read_text() == "keep me"


@pytest.mark.parametrize(("content", "message"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not text (a binary file?); an MLGym .traj is a JSON object"),
    (b'{"environment": "x", "trajectory": [', "is not valid JSON: "),
    (b"[1, 2]", "must hold a JSON object, got list"),
    (b'{"environment": "x", "trajectory": [{"response": "r"}], "history": [], "info": {}}',
     "step 0 lacks the key(s) ['action', 'observation', 'state', 'thought', 'execution_time']"),
    (one_step(action=1), "step 0: 'action' must be text, got int"),
    (one_step(observation=["a"]), "step 0: 'observation' must be text, got list"),
    (one_step(response=None), "step 0: 'response' must be text, got NoneType"),
])
def test_a_binary_or_malformed_traj_is_one_clear_error(tmp_path, content, message):
    traj = tmp_path / f"{TASK}.traj"
    traj.write_bytes(content)
    out = tmp_path / "out"
    for command in (["replay", str(traj)], ["run", TASK, "--policy", f"replay:{traj}"]):
        result = run_cli(*command, "--out", str(out))
        refused(result, f"mlgym-registry: error: trajectory file {str(traj)!r}")
        assert message in error_line(result)
        assert not out.exists()


def test_replaying_a_folder_or_a_missing_file_is_one_clear_error(tmp_path):
    refused(run_cli("replay", str(tmp_path)), f"mlgym-registry: error: no .traj file in the folder {str(tmp_path)!r}; "
                                             "pass a .traj file or a folder of runs")
    refused(run_cli("replay", str(tmp_path / "gone.traj")), f"trajectory file {str(tmp_path / 'gone.traj')!r} "
                                                            "does not exist")


def test_a_trajectory_of_no_known_task_is_a_usage_error(tmp_path):
    traj = write_traj(tmp_path / "noSuchTask.traj", ["x"])
    result = run_cli("replay", str(traj), "--out", str(tmp_path / "out"))
    refused(result, f"mlgym-registry: error: cannot tell which task {traj} belongs to")
    assert "pass --task NAME" in result.stderr


def test_a_policy_that_fails_after_the_out_folder_was_made_leaves_no_folder(tmp_path):
    out = tmp_path / "new" / "out"
    result = run_cli("run", TASK, "--policy", "bogus", "--out", str(out))
    refused(result, "mlgym-registry: error: unknown policy 'bogus'")
    assert not out.exists()


# -- --out folders that hold a run ---------------------------------------------------------------------------------
@pytest.mark.parametrize("earlier", [f"{TASK}.traj", "results.json", "env1/results.json", "replay-report.json"])
def test_an_out_folder_that_holds_a_run_is_refused_and_left_unchanged(tmp_path, earlier):
    out = tmp_path / "out"
    (out / earlier).parent.mkdir(parents=True)
    (out / earlier).write_text('{"agent": [], "baseline": {}}')
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    traj = write_traj(tmp_path / f"{TASK}.traj", ["x"])
    for command in (["run", TASK], ["run", TASK, "--num-envs", "2"], ["replay", str(traj)]):
        result = run_cli(*command, "--out", str(out))
        refused(result, "")
        assert error_line(result) == (f"mlgym-registry: error: --out {str(out)!r} already holds a run "
                                      f"({out / earlier}); choose another --out or remove that folder")
        assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


def test_an_out_folder_another_run_has_locked_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".mlgym-registry.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run_cli("run", TASK, "--out", str(out))
    refused(result, "")
    assert error_line(result) == f"mlgym-registry: error: --out {str(out)!r} is in use by another run right now; " \
                                 "choose another --out"
    assert [path.name for path in out.iterdir()] == [".mlgym-registry.lock"]


def test_of_three_concurrent_runs_with_one_out_exactly_one_proceeds(tmp_path):
    out = tmp_path / "out"
    procs = [subprocess.Popen([*CLI, "run", TASK, "--policy", "human", "--out", str(out), "--quiet"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        deadline = time.monotonic() + 300  # a ceiling for a loaded machine: the loop ends when two have lost
        while sum(proc.poll() is not None for proc in procs) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        losers = [proc for proc in procs if proc.poll() is not None]
        winners = [proc for proc in procs if proc.poll() is None]
        assert len(losers) == 2 and len(winners) == 1, "exactly one run may hold the folder"
        for proc in losers:
            _stdout, stderr = proc.communicate()
            assert proc.returncode == 2
            assert stderr == f"mlgym-registry: error: --out {str(out)!r} is in use by another run right now; " \
                             "choose another --out\n"
        winner = winners[0]
        _stdout, stderr = winner.communicate("submit\n", timeout=120)
        assert winner.returncode == 0, stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert sorted(path.name for path in out.iterdir()) == [f"{TASK}.traj", "results.json"]  # the lock is gone
    assert [step.action.strip() for step in load_traj(out / f"{TASK}.traj").steps] == ["submit"]


# -- what reaches the terminal -------------------------------------------------------------------------------------
def test_control_characters_in_command_output_are_escaped_on_screen_but_kept_in_the_traj(tmp_path):
    colour = "DISCUSSION\nColour.\n```\nprintf '\\033[31mRED\\033[0m\\a\\033]0;title\\007\\n'\n```"
    traj = write_traj(tmp_path / "colour.traj", [colour])
    out = tmp_path / "out"
    result = run_cli("run", TASK, "--policy", f"replay:{traj}", "--out", str(out))
    assert result.returncode == 1, result.stderr  # the recorded responses run out before the episode ends
    shown = result.stdout + result.stderr
    assert "\\x1b[31mRED\\x1b[0m\\x07\\x1b]0;title\\x07" in result.stdout
    assert not any(char in shown for char in "\x1b\x07\r")
    assert load_traj(out / f"{TASK}.traj").steps[0].observation.startswith("\x1b[31mRED\x1b[0m\x07\x1b]0;title\x07")


def test_a_missing_task_file_is_named_as_a_file_by_every_command(tmp_path):
    """A path (``./x.yaml``, an absolute one, a folder) is never read as a task name in an unknown namespace."""
    missing = str(tmp_path / "missing.yaml")
    for command in (["run", missing], ["info", missing], ["check", missing], ["bench", missing]):
        result = run_cli(*command, "--out", str(tmp_path / "out")) if command[0] in ("run", "bench") else run_cli(
            *command)
        refused(result, f"mlgym-registry: error: task file {missing!r} does not exist")
        assert "namespace" not in result.stderr
        assert not (tmp_path / "out").exists()
    result = subprocess.run([*CLI, "run", "./missing.yaml"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    refused(result, f"task file './missing.yaml' does not exist (relative paths are read from {tmp_path})")
    refused(run_cli("run", str(tmp_path)), f"task file {str(tmp_path)!r} is a folder, not a task file")
