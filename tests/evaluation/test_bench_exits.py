"""``bench``'s exit statuses, its clean end on Ctrl-C and SIGTERM, and how fast an endpoint that refuses the
connection is reported.

Interruptions run ``mlgym-registry bench`` as a user would, in its own process group, and send the signal to the
group as a terminal's Ctrl-C does (the workers of ``--num-envs`` get it too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import default_sigint
from model_server import MODEL, Endpoint, closed_port, error

from mlgym_registry.cli import main as cli_main
from mlgym_registry.commands.bench import EXIT_DONE, EXIT_INTERRUPTED, EXIT_REFUSED, EXIT_RUNS_FAILED
from mlgym_registry.commands.out_folder import LOCK_NAME

TASK = "prisonersDilemma"


def test_the_exit_status_says_how_the_suite_went(tmp_path, capsys):
    out = tmp_path / "suite"
    assert cli_main(["bench", TASK, "--runs", "1", "--max-steps", "1", "--out", str(out), "--quiet"]) == EXIT_DONE
    assert cli_main(["bench", "prisonersDilema", "--out", str(tmp_path / "typo")]) == EXIT_REFUSED
    with Endpoint([error(500, "boom", kind="server_error")]) as endpoint:
        status = cli_main(["bench", TASK, "--policy", f"openai:{MODEL}", "--base-url", endpoint.url, "--max-retries",
                           "0", "--runs", "3", "--out", str(tmp_path / "failing"), "--quiet"])
    assert status == EXIT_RUNS_FAILED
    assert "3 runs did not end well; run the same command again" in capsys.readouterr().out
    assert (EXIT_DONE, EXIT_RUNS_FAILED, EXIT_REFUSED, EXIT_INTERRUPTED) == (0, 1, 2, 3)


def test_a_refused_connection_is_reported_at_once(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    started = time.monotonic()
    status = cli_main(["bench", TASK, "--policy", f"openai:{MODEL}", "--base-url", url, "--out",
                       str(tmp_path / "suite")])  # the default 5 retries with backoff took 20 s and more
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err.strip().splitlines()
    # one attempt, as the message says (the default 5 retries with backoff took 20 s and more); the time is only a
    # ceiling for a hang, far above what a loaded machine takes
    assert status == EXIT_REFUSED and elapsed < 120, elapsed
    assert err == [f"mlgym-registry: error: cannot reach {url} ([Errno 111] Connection refused; 1 attempt): start "
                   f"the server or pass --base-url URL"]


def start_bench(out: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlgym_registry.cli", "bench", TASK, "--out", str(out), "--quiet",
                             "--seed", "0", *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_sigint)


def finished_runs(out: Path) -> int:
    count = 0
    for folder in out.glob("*__run_*"):
        try:
            results = json.loads((folder / "results.json").read_text())
        except (OSError, ValueError):
            continue
        count += "agent" in results and "failed" not in results and bool(results["agent"])
    return count


def interrupt_after_first_run(process: subprocess.Popen, out: Path, signum: int) -> tuple[str, str]:
    deadline = time.monotonic() + 300  # a ceiling for a loaded machine: the loop ends at the first finished run
    while finished_runs(out) < 1:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no run finished in 300 s"
        time.sleep(0.1)
    os.killpg(process.pid, signum)
    return process.communicate(timeout=300)  # a ceiling for a loaded machine, not a timing


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_suite_ends_cleanly_and_says_how_to_resume(signum, tmp_path):
    out = tmp_path / "suite"
    process = start_bench(out, "--runs", "20", "--max-steps", "30")
    stdout, stderr = interrupt_after_first_run(process, out, signum)
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr and "Traceback" not in stdout
    finished = finished_runs(out)
    assert f"mlgym-registry: interrupted: {finished} of 20 runs finished in {out}; run the same command again to " \
           f"resume" in stderr
    assert not (out / LOCK_NAME).exists()
    session = json.loads((out / "settings.json").read_text())["sessions"][-1]
    assert session["ended"] and session["played"] == finished and session["failed"] == 20 - finished


@pytest.mark.slow
def test_ctrl_c_with_worker_processes_ends_cleanly(tmp_path):
    out = tmp_path / "suite"
    process = start_bench(out, "--runs", "8", "--num-envs", "2", "--max-steps", "30")
    stdout, stderr = interrupt_after_first_run(process, out, signal.SIGINT)
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    assert "of 8 runs finished" in stderr and "run the same command again to resume" in stderr
    assert not (out / LOCK_NAME).exists()
