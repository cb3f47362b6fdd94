"""``run_cli`` forks its commands from a warm server (tests/cli_commands.py): what a test sees of a command must be
what a fresh interpreter running it shows, or the CLI tests would test the server instead of the command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import cli_commands
import pytest
from conftest import SUBPROCESS_CEILING, run_cli

import mlgym_registry

FRESH = [sys.executable, "-m", "mlgym_registry.cli"]
TASK_FILE = Path(mlgym_registry.__file__).parent / "tasks" / "prisonersDilemma.yaml"


def fresh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FRESH, *args], capture_output=True, text=True, env=env, timeout=SUBPROCESS_CEILING)


@pytest.mark.parametrize("args", [("list", "--kind", "task"), ("run", "nosuchtask"), ("list", "--kind", "nokind")],
                         ids=["listing", "unknown-task", "bad-option"])
def test_a_forked_command_prints_and_exits_as_a_fresh_one(args):
    forked, started = run_cli(*args), fresh(*args)
    assert forked.args == started.args
    assert (forked.returncode, forked.stdout, forked.stderr) == (started.returncode, started.stdout, started.stderr)
    assert forked.stdout or forked.stderr


def test_a_forked_command_runs_in_the_tests_folder_with_its_environment_and_umask(tmp_path, monkeypatch):
    shutil.copy(TASK_FILE, tmp_path / "mine.yaml")
    monkeypatch.chdir(tmp_path)
    info = run_cli("info", "mine.yaml", "--json")  # a path relative to the test's working folder
    assert info.returncode == 0, info.stderr
    assert '"prisonersDilemma"' in info.stdout

    env = {**os.environ, "MLGYM_REGISTRY_BLOCK_PLUGINS": "mlgym-registry-example"}
    blocked = run_cli("list", "--kind", "parser", env=env)
    assert blocked.stdout == fresh("list", "--kind", "parser", env=env).stdout
    assert "json_command" in run_cli("list", "--kind", "parser").stdout and "json_command" not in blocked.stdout

    old = os.umask(0o077)
    try:
        out = tmp_path / "run"
        result = run_cli("run", "prisonersDilemma", "--policy", "scripted", "--max-steps", "1", "--out", str(out),
                         "--quiet")
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    assert (out / "results.json").stat().st_mode & 0o777 == 0o600


def test_a_command_whose_interpreter_would_start_differently_gets_a_fresh_one(monkeypatch):
    server = cli_commands.shared()
    run_cli("list", "--kind", "backend")  # the server runs now
    assert not server.runs_as_fresh(None)
    monkeypatch.setenv("PYTHONWARNINGS", "ignore::DeprecationWarning")  # this process's own environment changes
    assert server.runs_as_fresh(None)
    started = server.server
    assert run_cli("list", "--kind", "backend").returncode == 0
    assert server.server is not started and not server.runs_as_fresh(None)  # a new server, with the new environment
    monkeypatch.undo()
    assert run_cli("list", "--kind", "backend").returncode == 0 and not server.runs_as_fresh(None)  # and back
    assert server.runs_as_fresh({**os.environ, "PYTHONPATH": "/elsewhere"})
    assert server.runs_as_fresh({key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}) == \
        ("OMP_NUM_THREADS" in os.environ)
    assert not server.runs_as_fresh({**os.environ, "MLGYM_REGISTRY_BLOCK_PLUGINS": "x"})
