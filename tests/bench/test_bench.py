"""The benchmarks run: ``bench/bench_training.py --quick`` measures every ratio and prints it with its target.

No timing threshold here: the ratios depend on the machine and its load; the bench prints whether each target is met.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re

import pytest
from conftest import load_bench_script


@pytest.mark.slow
def test_training_bench_quick_prints_every_ratio(capsys):
    ratios = load_bench_script("bench_training.py").main(["--quick"])
    out = capsys.readouterr().out

    assert set(ratios) >= {"vs_chat_20", "vs_chat_60", "flat_ours", "flat_ours-text", "tokens_vs_history",
                           "pool_vs_one"}
    assert all(math.isfinite(value) and value > 0 for value in ratios.values())
    # measure 1: ours against ChatEnv at both lengths, and the long/short ratio, each with its target
    assert re.search(r"ratio ours/ChatEnv per turn at ~20 messages: [\d.]+ .*target <= 1\.5: (met|NOT met)", out)
    assert re.search(r"ratio ours/ChatEnv per turn at ~60 messages: [\d.]+ .*target <= 1\.5: (met|NOT met)", out)
    assert re.search(r"ratio 60/20 messages per turn, ours: [\d.]+ .*target <= 1\.3: (met|NOT met)", out)
    # measure 2: tokens mode over history mode
    assert re.search(r"ratio tokens/history per turn: [\d.]+ .*target <= 1\.2: (met|NOT met)", out)
    # measure 3: AsyncEnvPools of 1, 2 and 4 real envs, threading and multiprocessing, TorchRL's default stack
    for backend in ("threading", "multiprocessing"):
        assert re.search(rf"{backend}: 1 env [\d.]+ turns/s \(1\.00x\), 2 envs [\d.]+ turns/s \([\d.]+x\), 4 envs", out)
        growth = rf"ratio pool of \d / pool of 1, turns/s, {backend}: [\d.]+ .*target >= 1\.5 .*: (met|NOT met)"
        assert re.search(growth, out)
    assert "done in" in out


@pytest.mark.slow
def test_evaluation_bench_quick_prints_each_ratio_with_its_target(capsys):
    ratios = load_bench_script("bench_evaluation.py").main(["--quick"])
    out = capsys.readouterr().out

    assert "prisonersDilemma" in ratios and all(math.isfinite(v) and v > 0 for v in ratios.values())
    assert re.search(r"prisonersDilemma +validate +[\d.]+ s +plain evaluate\.py +[\d.]+ s +ratio +[\d.]+ "
                     r"\(target <= 1\.5: (met|NOT met)\)", out)
    # beside one busy process per core, both sides alike
    assert re.search(r"prisonersDilemma \(busy\) +validate +[\d.]+ s +plain evaluate\.py +[\d.]+ s +ratio +[\d.]+ "
                     r"\(target <= 3: (met|NOT met)\)", out)
    if "mlgym/prisonersDilemma" in ratios:
        assert re.search(r"mlgym/prisonersDilemma +validate .*\(target <= 1\.5: (met|NOT met)\)", out)
        assert re.search(r"mlgym/prisonersDilemma \(busy\) +validate .*\(target <= 3: (met|NOT met)\)", out)
    else:
        assert "MLGYM_ROOT does not point at an MLGym checkout" in out
    assert "done in" in out


@pytest.mark.slow
def test_evaluation_paths_bench_quick_prints_reset_and_validate_ratios_of_the_rl_and_hub_paths(capsys):
    ratios = load_bench_script("bench_evaluation_paths.py").main(["--quick"])
    out = capsys.readouterr().out

    assert all(math.isfinite(v) and v > 0 for v in ratios.values())
    paths = ["rl"] + (["hub"] if importlib.util.find_spec("datasets") else [])
    for path in paths:
        assert {f"{path}_validate", f"{path}_reset"} <= set(ratios)
        assert re.search(rf"{path} +validate +[\d.]+ s +plain evaluate\.py +[\d.]+ s +ratio +[\d.]+ "
                         r"\(target <= 1\.5: (met|NOT met)\)", out)
        assert re.search(rf"{path} \(busy\) +validate +[\d.]+ s +plain evaluate\.py +[\d.]+ s +ratio +[\d.]+ "
                         r"\(target <= 3: (met|NOT met)\)", out)
        assert re.search(rf"{path} +reset +[\d.]+ s +plain copy of the workspace +[\d.]+ s +ratio +[\d.]+", out)
    # both sides score the same episodes: the same numbers
    score = re.search(r"rl +validate .*score (\{.*\}) \(plain: (\{.*\})\)", out)
    assert json.loads(score.group(2)) == ast.literal_eval(score.group(1))
    assert "done in" in out


@pytest.mark.slow
def test_env_drivers_bench_quick_prints_a_row_for_every_driver(capsys):
    module = load_bench_script("bench_env_drivers.py")
    results = module.main(["--quick", "--widths", "1,2"])
    out = capsys.readouterr().out

    assert list(results) == list(module.DRIVERS)
    assert all(sorted(cell.width for cell in cells) == [1, 2] for cells in results.values())
    header = r"\| driven by +\| 1 env +\| 2 envs +\| best +\| MiB/env \(PSS\) +\| first turn +\| target \|"
    assert re.search(header, out)
    for driver, label in module.DRIVERS.items():
        rows = [line for line in out.splitlines() if line.startswith(f"| {label} ")]
        assert len(rows) == 1, (driver, out)
        # N=1 in turns/s and N=2 as a ratio to it, or the reason there is no figure (reported, not raised)
        assert re.match(rf"\| {re.escape(label)} +\| ([\d.]+ t/s|failed|skipped) +\| ([\d.]+x|failed|skipped|-) +\|",
                        rows[0]), rows[0]
        if driver in module.PROCESS_DRIVERS:
            assert re.search(r"N=2 >= 1\.6x: (met|NOT met|n/a); N=32 within 10% of best: n/a; "
                             r"<= 50 MiB/env at the largest N: (met|NOT met|n/a)", rows[0]), rows[0]
        else:
            assert rows[0].endswith("| - (reference) |")
    assert "done in" in out


@pytest.mark.slow
def test_pool_turns_bench_prints_each_drivers_early_and_late_turn(capsys):
    bench = load_bench_script("bench_pool_turns.py")
    ratios = bench.main(["--turns", "8", "--window", "3", "--drivers", "inprocess,pool"])
    out = capsys.readouterr().out

    assert set(ratios) == {"inprocess", "pool"} and all(math.isfinite(v) and v > 0 for v in ratios.values())
    assert re.search(r"pool +early turn +[\d.]+ ms, late turn +[\d.]+ ms, late/early [\d.]+", out)
    assert re.search(r"multiprocessing pool late/early [\d.]+, target <= 1\.3 \(flat\): (met|NOT met)", out)


def test_env_drivers_bench_rates_the_command_while_every_env_plays():
    module = load_bench_script("bench_env_drivers.py")
    progress = [(1.0, [1]), (2.0, [3, 1]), (3.0, [6, 4]), (4.0, [8, 7]), (5.0, [8, 8])]
    # from 2.0 s (both episodes have a step) to 4.0 s (the first has all 8): 15 - 4 turns in 2 s
    assert module.all_playing(progress, width=2, steps=8) == (11, 2.0, 2.0, 4.0)
    assert module.all_playing([(1.0, [8, 8])], width=2, steps=8) is None  # never seen with both playing


def test_env_drivers_bench_keeps_each_widths_median_over_its_sweeps():
    module = load_bench_script("bench_env_drivers.py")
    Cell = module.Cell
    # in-process cells pool their blocks: the median of 2+3 blocks is the 50 turns/s one, whichever sweep it is in
    slow = Cell("processes", 2, 20, 1.0, first_turn=1.0, pss_mib=10.0, blocks=[(10, 1.0), (20, 1.0)])
    fast = Cell("processes", 2, 80, 1.0, first_turn=3.0, pss_mib=30.0, blocks=[(50, 1.0), (90, 1.0), (80, 1.0)])
    kept = module.merged([slow, fast])
    assert (kept.turns, kept.seconds, kept.rate) == (50, 1.0, 50.0)
    assert (kept.first_turn, kept.pss_mib, kept.sweep_rates) == (2.0, 20.0, [20.0, 80.0])
    # the command keeps the sweep of median rate, and a sweep that lost steps is never hidden by the others
    sweeps = [Cell("cli", 32, 100, 1.0), Cell("cli", 32, 300, 1.0, note="lost steps: 1 episodes recorded 3-4 of 5"),
              Cell("cli", 32, 200, 1.0)]
    kept = module.merged(sweeps)
    assert kept.rate == 200.0 and "lost steps" in kept.note and kept.sweep_rates == [100.0, 300.0, 200.0]
    # one sweep per width: as measured, no sweep rates printed
    assert module.merged([Cell("cli", 1, 10, 2.0)]).sweep_rates is None
    assert [cell.width for cell in module.by_width([Cell("cli", 1), Cell("cli", 2), Cell("cli", 1)])] == [1, 2]


def test_env_drivers_bench_counts_the_steps_each_record_holds(tmp_path):
    from mlgym_registry.records.trajectories import Step, TrajectoryWriter

    module = load_bench_script("bench_env_drivers.py")
    for episode, steps in enumerate([0, 1, 7]):
        writer = TrajectoryWriter(tmp_path / f"episode{episode}", "prisonersDilemma")
        writer.system("system prompt")
        for turn in range(steps):
            writer.user(f"prompt {turn}")
            # an observation that holds what a step line starts with counts nothing: only the step lines do
            writer.step(Step(action="echo hi\n", observation='\n    {"action": "x"}', response="r", state="{}",
                             thought="t"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "t.traj").write_text(json.dumps({"trajectory": [{}, {}], "history": []}, indent=4))
    (tmp_path / "other" / "u.traj").write_text('{"trajectory": [')  # being rewritten
    assert module.recorded_steps(tmp_path) == [0, 1, 7, 2, 0]


@pytest.mark.slow
def test_pool_ceiling_bench_prints_the_real_pool_beside_stand_ins_of_its_split(capsys):
    ratios = load_bench_script("bench_pool_ceiling.py").main(["--blocks", "2", "--rounds", "2", "--width", "2"])
    out = capsys.readouterr().out

    assert list(ratios) == ["the real pool", "a stand-in with the same split", "the stand-in, the trainer's T halved",
                            "the stand-in's workers alone (T = 0)"]
    assert all(math.isfinite(value) and value > 0 for value in ratios.values())
    assert re.search(r"the real pool at N=1: the trainer spends [\d.]+ ms of CPU a turn, the worker [\d.]+ ms", out)
    assert re.search(r"the real pool reaches \d+% of the ratio its split of the CPU allows here", out)


def test_pool_ceiling_stand_in_plays_every_turn_and_leaves_no_worker():
    module = load_bench_script("bench_pool_ceiling.py")
    stand_in = module.StandIn(2, trainer_ms=0.2, worker_ms=0.5)
    workers = list(stand_in.workers)
    try:
        rate = module.block_rate(stand_in, 5)
    finally:
        stand_in.close()
    assert math.isfinite(rate) and rate > 0
    assert not any(worker.is_alive() for worker in workers)
