"""``bench --num-envs N``: one pool of N worker processes for the whole suite, each taking the next pending run of any
task as soon as it is done with one; and the progress line.

Suites are played through the command (``mlgym-registry bench``) with real tasks and the scripted policy; times and
worker process ids come from each run's ``settings.json``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import default_sigint
from model_server import MODEL, Endpoint, completion, error

from mlgym_registry.cli import main as cli_main
from mlgym_registry.commands.bench import EXIT_DONE, EXIT_INTERRUPTED, EXIT_RUNS_FAILED, SuiteBar
from mlgym_registry.commands.out_folder import LOCK_NAME
from mlgym_registry.evaluation.suite import SuiteProgress

TASKS = ("prisonersDilemma", "battleOfSexes")  # the two cheapest games to evaluate
SUITE = [*TASKS, "--max-steps", "4", "--seed", "0", "--quiet"]


def run_records(out: Path) -> dict[tuple[str, int], dict]:
    """Each run's ``settings.json``, by (task, run number)."""
    records = {}
    for path in out.glob("*__run_*/settings.json"):
        record = json.loads(path.read_text())
        records[(record["task"], record["run"])] = record
    return records


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def outcomes(out: Path) -> dict[str, tuple]:
    """Each run's scores and exit status, by folder name."""
    found = {}
    for folder in sorted(out.glob("*__run_*")):
        results = json.loads((folder / "results.json").read_text())
        trajectory = json.loads(next(folder.glob("*.traj")).read_text())
        found[folder.name] = (results.get("agent"), results.get("failed"), trajectory["info"].get("exit_status"))
    return found


@pytest.mark.slow
def test_workers_start_once_and_stay_busy_across_the_task_boundary(tmp_path):
    out = tmp_path / "suite"
    assert cli_main(["bench", *SUITE, "--runs", "3", "--num-envs", "2", "--out", str(out)]) == EXIT_DONE
    records = run_records(out)
    assert len(records) == 6
    pids = {record["pid"] for record in records.values()}
    assert len(pids) == 2 and os.getpid() not in pids  # two workers played every run of both tasks
    first_task_over = max(when(records[(TASKS[0], k)]["ended"]) for k in range(3))
    second_task_began = min(when(records[(TASKS[1], k)]["started"]) for k in range(3))
    # three runs on two workers: the worker done first took the second task's first run while the other still
    # played the first task's last one (with a barrier between tasks it would have waited)
    assert second_task_began < first_task_over
    for record in records.values():
        assert record["wall_seconds"] == pytest.approx(when(record["ended"]) - when(record["started"]), abs=0.5)
    suite = json.loads((out / "settings.json").read_text())
    assert suite["totals"]["runs"] == 6 and suite["sessions"][-1]["played"] == 6
    assert suite["totals"]["wall_seconds"] == pytest.approx(sum(r["wall_seconds"] for r in records.values()),
                                                            abs=0.01)


def start_bench(out: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlgym_registry.cli", "bench", *SUITE, "--out", str(out),
                             *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_sigint)


def wait_for(condition, process: subprocess.Popen, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{what} did not happen in {seconds:g} s"
        time.sleep(0.05)


def finished_runs(out: Path) -> int:
    return sum(bool(record.get("ended")) and not record.get("problems") for record in run_records(out).values())


@pytest.mark.slow
def test_an_interrupted_concurrent_suite_resumes_to_what_a_fresh_suite_plays(tmp_path):
    out = tmp_path / "suite"
    options = ["--runs", "3", "--num-envs", "2"]
    process = start_bench(out, *options)
    wait_for(lambda: finished_runs(out) >= 1, process, "a finished run")
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the bench and its workers
    stdout, stderr = process.communicate(timeout=300)  # a ceiling for a loaded machine, not a timing
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr + stdout, stderr
    finished = sum(1 for folder in out.glob("*__run_*") if outcomes_of(folder))
    assert 1 <= finished < 6
    assert f"interrupted: {finished} of 6 runs finished in {out}; run the same command again to resume" in stderr
    assert not (out / LOCK_NAME).exists()

    assert cli_main(["bench", *SUITE, *options, "--out", str(out)]) == EXIT_DONE
    fresh = tmp_path / "fresh"
    assert cli_main(["bench", *SUITE, "--runs", "3", "--out", str(fresh)]) == EXIT_DONE  # one at a time, here
    assert outcomes(out) == outcomes(fresh)
    assert len(outcomes(out)) == 6
    suite = json.loads((out / "settings.json").read_text())
    assert suite["totals"]["runs"] == 6 and suite["totals"]["runs_with_problems"] == 0
    assert [session["played"] for session in suite["sessions"]] == [finished, 6 - finished]


def outcomes_of(folder: Path) -> bool:
    """True when the run in ``folder`` finished (what a resume skips)."""
    from mlgym_registry.evaluation.suite import run_finished

    return run_finished(folder, next((p.name for p in folder.glob("*.traj")), "none.traj"))


@pytest.mark.slow
def test_an_api_failure_ends_only_its_runs_and_the_workers_go_on(tmp_path, capsys):
    def reply(request: dict) -> dict:  # battleOfSexes's model is down; prisonersDilemma's submits at once
        if "battle of the sexes" in json.dumps(request["messages"]).lower():
            return error(500, "boom", kind="server_error")
        return completion("DISCUSSION\nThe starter strategy will do.\n```\nsubmit\n```")

    out = tmp_path / "suite"
    with Endpoint(reply) as endpoint:
        status = cli_main(["bench", *SUITE, "--runs", "2", "--num-envs", "2", "--out", str(out), "--policy",
                           f"openai:{MODEL}", "--base-url", endpoint.url, "--max-retries", "0"])
    assert status == EXIT_RUNS_FAILED
    assert "2 runs did not end well; run the same command again" in capsys.readouterr().out
    found = outcomes(out)
    for k in range(2):
        agent, failed, status_ = found[f"{MODEL}__prisonersDilemma__run_{k}"]
        assert agent and not failed and status_ == "submitted"
        agent, failed, status_ = found[f"{MODEL}__battleOfSexes__run_{k}"]
        assert failed.startswith("PolicyError: ") and "(500: boom)" in failed and "exit_api" in status_
    records = run_records(out)
    assert len({record["pid"] for record in records.values()}) <= 2
    assert json.loads((out / "settings.json").read_text())["totals"]["runs_with_problems"] == 2


@pytest.mark.slow
def test_a_worker_that_dies_fails_only_its_run_and_is_replaced(tmp_path):
    out = tmp_path / "suite"
    process = start_bench(out, "--runs", "3", "--num-envs", "2")

    def playing() -> list[dict]:
        return [r for r in run_records(out).values() if r.get("pid") and not r.get("ended")]

    wait_for(lambda: bool(playing()), process, "a run in flight")
    victim = playing()[0]
    os.kill(victim["pid"], signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == EXIT_RUNS_FAILED, stderr
    assert "Traceback" not in stderr
    records = run_records(out)
    killed = records[(victim["task"], victim["run"])]
    assert killed["problems"] == [f"failed: its worker process died (exit code -{int(signal.SIGKILL)})"]
    assert sum(bool(record["problems"]) for record in records.values()) == 1
    assert len({record["pid"] for record in records.values()}) <= 3  # the two workers, and the one in its place
    assert "1 runs did not end well" in stdout


@pytest.mark.serve
@pytest.mark.slow
def test_a_served_concurrent_suite_accounts_for_every_call(served, tmp_path, capsys):
    out = tmp_path / "suite"
    before = served.chat_requests()
    status = cli_main(["bench", *SUITE, "--runs", "2", "--num-envs", "2", "--out", str(out), "--policy",
                       f"openai:{served.model}", "--base-url", served.url, "--max-tokens", "8", "--temperature", "0",
                       "--model-name", "tiny", "--price-in", "2", "--price-out", "10"])
    assert status == EXIT_DONE, capsys.readouterr().err
    calls = served.chat_requests() - before
    usages = [record["usage"] for record in run_records(out).values()]
    totals = json.loads((out / "settings.json").read_text())["totals"]
    assert totals["runs"] == 4 and totals["api_calls"] == calls == sum(u["api_calls"] for u in usages) >= 4
    for key in ("tokens_sent", "tokens_received", "task_cost"):
        assert totals[key] == pytest.approx(sum(usage[key] for usage in usages)) and totals[key] > 0
    assert f"usage of tiny over 4 runs: {calls} calls (0 retries)" in capsys.readouterr().out


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_fits_the_terminal_and_shows_runs_in_flight_failures_and_cost(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    screen = Terminal()
    bar = SuiteBar(12, "my-model", stream=screen)
    progress = SuiteProgress(total=12, skipped=2, done=3, failed=1, steps=40, in_flight=4, cost=0.0123,
                             last_scores=["blotto#3: Score=0.1126"])
    bar(progress)
    progress.steps += 1
    bar(progress)
    bar.close()
    written = screen.getvalue()
    assert written.count("\n") == 1 and written.endswith("\n")  # one line, redrawn in place
    drawn = [line for line in written.rstrip("\n").split("\r") if line]
    assert len(drawn) == 2 and all(len(line) <= 79 for line in drawn)
    assert drawn[0].startswith("my-model: 6/12 runs finished, 4 in flight, 1 failed, $0.0123, 40 steps")
    assert drawn[1].startswith("my-model: 6/12 runs finished, 4 in flight, 1 failed, $0.0123, 41 steps")
    assert drawn[1].endswith("...")

    log = io.StringIO()  # not a terminal: whole lines, one whenever a run ends
    bar = SuiteBar(12, "my-model", stream=log)
    bar(progress)
    bar(progress)  # a step: no line
    progress.done += 1
    bar(progress)
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "7/12 runs finished" in lines[1] and lines[1].endswith("blotto#3: Score=0.1126")
