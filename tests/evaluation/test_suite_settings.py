"""``bench``'s settings record and failure policy, and how ``report`` groups and scores the runs.

The settings and resume cases use the scripted policy; API failures use the scripted OpenAI-compatible endpoint of
``test_openai_policy`` (a server answering 500 on demand, which a real server cannot); the record of a served model
uses ``transformers serve`` over the tiny model.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from model_server import MODEL, Endpoint, completion, error

from mlgym_registry.cli import main as cli_main
from mlgym_registry.evaluation.report import build_report
from mlgym_registry.policies import make_policy

TASK = "prisonersDilemma"


def bench(out: Path, *options: str) -> int:
    return cli_main(["bench", TASK, "--out", str(out), "--quiet", *options])


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_resume_with_other_settings_is_refused_unless_forced_and_report_splits_them(tmp_path, capsys):
    out = tmp_path / "suite"
    assert bench(out, "--runs", "1", "--max-steps", "2", "--seed", "0") == 0
    record = read_json(out / "settings.json")
    assert record["settings"]["max_steps"] == 2 and record["settings"]["seed"] == 0
    assert record["tasks"][TASK].startswith("sha256:") and record["versions"]["mlgym-registry"]
    run = read_json(out / f"scripted__{TASK}__run_0" / "settings.json")
    assert run["settings"] == record["settings"] and run["task_hash"] == record["tasks"][TASK]
    assert run["started"] <= run["ended"] and run["exit_status"] and run["problems"] == []

    capsys.readouterr()
    assert bench(out, "--runs", "2", "--max-steps", "1", "--seed", "3") == 2
    err = capsys.readouterr().err
    assert "max_steps 2 (now 1)" in err and "seed 0 (now 3)" in err
    assert "--force" in err and "new --out folder" in err
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [f"scripted__{TASK}__run_0"]

    assert bench(out, "--runs", "1", "--max-steps", "2", "--seed", "0") == 0  # the same settings resume as before
    assert "1 already finished, 0 played now" in capsys.readouterr().out

    assert bench(out, "--runs", "2", "--max-steps", "1", "--seed", "3", "--force") == 0
    assert "mixing settings" in capsys.readouterr().err
    forced = read_json(out / f"scripted__{TASK}__run_1" / "settings.json")
    assert forced["settings"]["max_steps"] == 1 and forced["run_seed"] == 4
    report = build_report([out])
    assert report.board.models == ["scripted[max_steps=1,seed=3]", "scripted[max_steps=2,seed=0]"]


def test_one_run_at_a_time_an_api_failure_ends_that_run_and_the_suite_goes_on(tmp_path, capsys):
    out = tmp_path / "suite"
    with Endpoint([error(500, "boom", kind="server_error")]) as endpoint:
        status = bench(out, "--policy", f"openai:{MODEL}", "--base-url", endpoint.url, "--max-retries", "0",
                       "--runs", "2", "--seed", "0", "--temperature", "0.5")
    printed = capsys.readouterr()
    assert status == 1, printed.err  # two runs did not end well (bench's EXIT_RUNS_FAILED); both were played
    assert len(endpoint.requests) == 2 and "2 did not end" in printed.out
    for number in (0, 1):
        folder = out / f"{MODEL}__{TASK}__run_{number}"
        results = read_json(folder / "results.json")
        assert results["failed"].startswith("PolicyError:") and "failed 1 times" in results["failed"]
        assert "no answer from the model (api_calls 0)" in results["problems"]
        assert "exit_api" in read_json(folder / f"{TASK}.traj")["info"]["exit_status"]
        run = read_json(folder / "settings.json")
        assert run["settings"]["endpoint"] == endpoint.url and run["settings"]["sampling"] == {"temperature": 0.5}
        assert run["usage"]["api_calls"] == 0 and run["problems"]
    assert read_json(out / "settings.json")["totals"]["runs_with_problems"] == 2

    report_out = tmp_path / "report"
    assert cli_main(["report", str(out), "--out", str(report_out), "--no-plot"]) == 0
    best = list(csv.reader((report_out / "best_scores.csv").open()))
    assert best[1][2] == ""  # the autosubmitted starter code is not the model's score
    rows = list(csv.DictReader((report_out / "runs.csv").open()))
    assert [row["Counted"] for row in rows] == ["excluded", "excluded"] and "api_calls 0" in rows[0]["Problems"]
    summary = (report_out / "summary.md").read_text()
    assert "2 runs have problems" in summary and "2 scores left out of the tables" in summary

    assert cli_main(["report", str(out), "--out", str(report_out), "--no-plot", "--include-failed"]) == 0
    assert list(csv.reader((report_out / "best_scores.csv").open()))[1][2] != ""


def test_empty_answers_and_answers_without_usage_are_counted():
    without_usage = completion("DISCUSSION\nok\n```\nls\n```")
    del without_usage["body"]["usage"]
    with Endpoint([completion(""), without_usage]) as endpoint:
        agent = make_policy(f"openai:{MODEL}", base_url=endpoint.url)
        agent.reset()
        agent([{"role": "system", "content": "S"}, {"role": "user", "content": "T"}])
        agent([{"role": "system", "content": "S"}, {"role": "user", "content": "T"}])
    stats = agent.stats()
    assert (stats["api_calls"], stats["empty_responses"], stats["missing_usage"]) == (2, 1, 1)


@pytest.mark.serve
@pytest.mark.slow
def test_a_served_model_suite_records_its_settings_and_usage(served, tmp_path, capsys):
    out = tmp_path / "suite"
    options = ["--policy", f"openai:{served.model}", "--base-url", served.url, "--runs", "1", "--max-steps", "1",
               "--max-tokens", "8", "--temperature", "0", "--seed", "0", "--model-name", "tiny"]
    assert bench(out, *options) == 0, capsys.readouterr().err
    record = read_json(out / "settings.json")
    calls = record["totals"]["api_calls"]
    assert f"usage of tiny over 1 runs: {calls} calls" in capsys.readouterr().out and calls >= 1
    assert record["settings"]["sampling"] == {"temperature": 0, "max_tokens": 8}
    assert record["settings"]["endpoint"] == served.url
    usage = read_json(out / f"tiny__{TASK}__run_0" / "settings.json")["usage"]
    assert usage["api_calls"] == calls and usage["tokens_sent"] > 0 and 0 < usage["tokens_received"] <= 8 * calls

    assert bench(out, *options, "--temperature", "1.5") == 2
    assert "temperature 0.0 (now 1.5)" in capsys.readouterr().err
