"""Accounting of a suite's runs (tokens, cost, calls, retries, latency, wall time, ``finish_reason`` per step), the
``--cost-limit`` that ends a run with MLGym's ``exit_cost``, and the report's accounting, spread, noise band and
warnings.

A served model is ``transformers serve`` over the tiny model (the session's ``served``, tests/conftest.py); the
scripted endpoint (``Endpoint``) stands in only for what a real server does not do on demand: an answer without
``usage``.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import pytest
from model_server import MODEL, Endpoint, completion

from mlgym_registry.cli import main as cli_main
from mlgym_registry.evaluation.report import build_report
from mlgym_registry.records.trajectories import Step, load_traj, trajectory_from_dict

TASK = "prisonersDilemma"
PRICE_IN, PRICE_OUT = 2.0, 10.0


def bench(out: Path, *options: str) -> int:
    return cli_main(["bench", TASK, "--out", str(out), "--quiet", *options])


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def csv_rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


@pytest.mark.serve
@pytest.mark.slow
def test_a_served_suite_accounts_for_tokens_cost_time_and_finish_reasons(served, tmp_path, capsys):
    out = tmp_path / "suite"
    options = ["--policy", f"openai:{served.model}", "--base-url", served.url, "--runs", "2", "--max-steps", "2",
               "--max-tokens", "8", "--temperature", "0", "--seed", "0", "--model-name", "tiny",
               "--price-in", str(PRICE_IN), "--price-out", str(PRICE_OUT)]
    before, started = served.chat_requests(), time.monotonic()
    assert bench(out, *options) == 0, capsys.readouterr().err
    elapsed = time.monotonic() - started
    printed = capsys.readouterr().out
    calls = served.chat_requests() - before
    sent = received = 0
    for number in (0, 1):
        folder = out / f"tiny__{TASK}__run_{number}"
        trajectory = load_traj(folder / f"{TASK}.traj")
        stats = trajectory.info["model_stats"]
        calls_here = [step.call for step in trajectory.steps]
        assert len(calls_here) == stats["api_calls"] >= 1
        # each step records its call: the server's finish_reason (8 tokens cut the tiny model's babble), its time
        # and its usage, which add up to the run's model_stats
        assert all(call["finish_reason"] in ("length", "stop") for call in calls_here)
        assert stats["truncated_responses"] == sum(call["finish_reason"] == "length" for call in calls_here)
        assert sum(call["usage"]["prompt_tokens"] for call in calls_here) == stats["tokens_sent"] > 0
        assert sum(call["usage"]["completion_tokens"] for call in calls_here) == stats["tokens_received"] > 0
        assert all(call["model_seconds"] > 0 for call in calls_here)
        assert stats["model_seconds"] == pytest.approx(sum(c["model_seconds"] for c in calls_here), abs=1e-3)
        assert stats["max_call_seconds"] == pytest.approx(max(c["model_seconds"] for c in calls_here), abs=1e-3)
        assert stats["task_cost"] == pytest.approx((stats["tokens_sent"] * PRICE_IN
                                                    + stats["tokens_received"] * PRICE_OUT) / 1e6)
        assert (stats["api_retries"], stats["missing_usage"]) == (0, 0)
        run = read_json(folder / "settings.json")
        assert run["usage"]["model_seconds"] == stats["model_seconds"]
        assert stats["model_seconds"] < run["wall_seconds"] <= elapsed  # the run's own clock, within the bench's
        sent, received = sent + stats["tokens_sent"], received + stats["tokens_received"]
    totals = read_json(out / "settings.json")["totals"]
    assert (totals["api_calls"], totals["tokens_sent"], totals["tokens_received"]) == (calls, sent, received)
    cost = (sent * PRICE_IN + received * PRICE_OUT) / 1e6
    assert f"usage of tiny over 2 runs: {calls} calls (0 retries), {sent} tokens sent, {received} received, " \
           f"${cost:.4f}; model " in printed
    assert "wall " in printed and "WARNING" not in printed

    report = tmp_path / "report"
    assert cli_main(["report", str(out), "--out", str(report), "--no-plot", "--no-noise-band"]) == 0
    [row] = csv_rows(report / "accounting.csv")
    assert (row["Model"], row["Runs"], row["API calls"], row["Retries"]) == ("tiny", "2", str(calls), "0")
    assert (row["Tokens sent"], row["Tokens received"]) == (str(sent), str(received))
    assert float(row["Cost (USD)"]) == pytest.approx(cost, abs=1e-6) and row["Cost complete"] == "yes"
    assert float(row["Wall seconds"]) == pytest.approx(totals["wall_seconds"], abs=0.01)
    assert float(row["Seconds per call"]) == pytest.approx(totals["model_seconds"] / calls, abs=0.01)
    assert "## Accounting" in (report / "summary.md").read_text()


@pytest.mark.serve
@pytest.mark.slow
def test_the_cost_limit_ends_a_run_with_exit_cost_and_the_env_autosubmits(served, tmp_path, capsys):
    out = tmp_path / "suite"
    # at $1000 per million tokens, the first call (the task prompt is thousands of tokens) passes the $0.01 limit
    status = bench(out, "--policy", f"openai:{served.model}", "--base-url", served.url, "--runs", "1", "--max-steps",
                   "5", "--max-tokens", "8", "--seed", "0", "--model-name", "tiny", "--price-in", "1000",
                   "--price-out", "1000", "--cost-limit", "0.01")
    assert status == 0, capsys.readouterr().err  # an exit_cost run ended well, as in MLGym
    folder = out / f"tiny__{TASK}__run_0"
    trajectory = load_traj(folder / f"{TASK}.traj")
    stats = trajectory.info["model_stats"]
    assert stats["api_calls"] == 1 and stats["task_cost"] >= 0.01
    assert [step.action.strip() for step in trajectory.steps] == ["exit_cost"]
    # the answer that crossed the limit is not used: the step is MLGym's exit_cost, with the call that crossed it
    assert "Exit due to cost limit" in trajectory.steps[0].thought
    assert trajectory.steps[0].call["usage"]["prompt_tokens"] == stats["tokens_sent"]
    assert "exit_cost" in trajectory.info["exit_status"]
    results = read_json(folder / "results.json")
    assert results["agent"] and "failed" not in results and not results.get("problems")  # autosubmitted, scored
    limit = read_json(out / "settings.json")["settings"]["cost_limit"]
    assert limit == {"usd": 0.01, "price_in": 1000.0, "price_out": 1000.0}


def test_a_cost_limit_needs_prices(tmp_path, capsys):
    assert bench(tmp_path / "s", "--policy", f"openai:{MODEL}", "--cost-limit", "1") == 2
    assert "--cost-limit 1 needs the model's prices" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_answers_without_usage_are_flagged_in_the_run_the_bench_and_the_report(tmp_path, capsys):
    out = tmp_path / "suite"
    without_usage = completion("DISCUSSION\nThe starter strategy will do.\n```\nsubmit\n```")
    del without_usage["body"]["usage"]
    with Endpoint([without_usage]) as endpoint:
        status = bench(out, "--policy", f"openai:{MODEL}", "--base-url", endpoint.url, "--runs", "1", "--seed", "0",
                       "--price-in", "1", "--price-out", "1")
    printed = capsys.readouterr().out
    assert status == 0
    assert "WARNING: 1 answers came without usage" in printed and "lower bound" in printed
    folder = out / f"{MODEL}__{TASK}__run_0"
    step = load_traj(folder / f"{TASK}.traj").steps[0]
    assert step.call["usage"] is None and step.call["finish_reason"] == "stop"
    assert read_json(folder / "results.json")["problems"] == ["1 answers without usage (tokens and cost unknown)"]

    report = tmp_path / "report"
    assert cli_main(["report", str(out), "--out", str(report), "--no-plot", "--no-noise-band"]) == 0
    [row] = csv_rows(report / "accounting.csv")
    assert (row["Answers without usage"], row["Cost complete"], row["Tokens sent"]) == ("1", "no (lower bound)", "0")
    assert "so its cost is a lower bound" in (report / "summary.md").read_text()


def test_steps_keep_their_call_and_older_files_stay_readable():
    step = Step(action="ls", observation="", response="r", state="{}", thought="t",
                call={"finish_reason": "length", "model_seconds": 0.5, "usage": None})
    entry = step.to_dict()
    assert (entry["finish_reason"], entry["model_seconds"], entry["usage"]) == ("length", 0.5, None)
    data = {"environment": "e", "trajectory": [entry, Step("ls", "", "r", "{}", "t").to_dict()], "history": [],
            "info": {}}
    again = trajectory_from_dict(json.loads(json.dumps(data)))
    assert again.steps[0].call == step.call and again.steps[1].call is None
    assert "finish_reason" not in again.steps[1].to_dict()  # an older file is written back as it was


def test_the_report_shows_spread_the_starter_codes_noise_band_and_warnings(tmp_path, capsys):
    out = tmp_path / "suite"
    # two steps of the scripted policy only look around: each run submits the starter code
    assert bench(out, "--runs", "3", "--max-steps", "2", "--seed", "0") == 0
    other = tmp_path / "other"
    assert bench(other, "--runs", "1", "--max-steps", "2", "--seed", "0", "--model-name", "other") == 0
    copy = tmp_path / "copy"
    shutil.copytree(other / f"other__{TASK}__run_0", copy / f"other__{TASK}__run_0")
    capsys.readouterr()

    report_out = tmp_path / "report"
    assert cli_main(["report", str(out), str(other), str(copy), "--out", str(report_out), "--no-plot",
                     "--models", "scripted,other,scriptd"]) == 0
    err = capsys.readouterr().err
    assert "--models scriptd: no run of this model; it is left out (models found: other, scripted)" in err
    assert f"other/{TASK}: run other__{TASK}__run_0 is recorded 2 times" in err
    assert list(csv.reader((report_out / "best_scores.csv").open()))[0] == ["Task", "baseline", "scripted", "other"]

    lasts = [read_json(out / f"scripted__{TASK}__run_{k}" / "results.json")["agent"][-1]["Score"] for k in range(3)]
    [band] = csv_rows(report_out / "noise_band.csv")
    assert band["Seeds"] == "3" and band["Runs scoring as the starter"] == "5"  # the copy, too
    assert band["Per seed"] == " ".join(f"{k}:{round(v, 3)!r}" for k, v in enumerate(lasts))
    spread = {row["Model"]: row for row in csv_rows(report_out / "spread.csv")}
    mean = sum(lasts) / 3
    std = (sum((v - mean) ** 2 for v in lasts) / 2) ** 0.5
    # the table rounds to 3 places: a mean that falls on a half (2.3795) may round either way, depending on the
    # order its floats were summed in, so the check is "within half a unit of the last place", not equality
    assert spread["scripted"]["Runs"] == "3"
    assert float(spread["scripted"]["Last mean"]) == pytest.approx(mean, abs=0.0005 + 1e-9)
    assert float(spread["scripted"]["Last std"]) == pytest.approx(std, abs=0.0005 + 1e-9)
    assert (spread["other"]["Runs"], spread["other"]["Last std"]) == ("2", "0.0")  # the run and its copy
    summary = (report_out / "summary.md").read_text()
    assert f"{TASK}: models have different numbers of runs (scripted 3, other 2)" in summary
    assert "## Noise band of the starter code" in summary and "scores exactly as the starter code" in summary

    report = build_report([out], models=["scripted"])  # from Python: no noise band unless asked
    assert report.context.bands == {} and report.context.spreads[0].last == lasts
