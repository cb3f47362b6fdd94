"""`mlgym-registry report` over MLGym's published runs, against the time to just read (json-load) their files.

Three figures, each the median of a few rounds after one untimed round that warms the OS file cache:

- read: ``json.load`` of every ``results.json`` and every ``.traj`` under the folder (nothing else);
- report: ``mlgym-registry report DIR --out TMP`` as a user runs it (a fresh process: start-up, imports, the plot);
- the same in-process, split into reading the runs and computing + writing the tables, summary and plot.

Target: the command under 10 s. The runs folder is the argument, else ``$MLGYM_ROOT/trajectories/mlgym_bench_v0``.

    python bench/bench_report.py [RUNS_DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlgym_registry.evaluation.report import build_report, write_report
from mlgym_registry.evaluation.runs import find_runs


def read_everything(folder: Path) -> tuple[int, int, int]:
    """json-load every results.json and .traj under ``folder``: (results files, .traj files, bytes read)."""
    results = trajs = size = 0
    for here, _, files in os.walk(folder):
        for name in files:
            if name == "results.json" or name.endswith((".results.json", ".traj")):
                data = (Path(here) / name).read_bytes()
                json.loads(data)
                size += len(data)
                if name.endswith(".traj"):
                    trajs += 1
                else:
                    results += 1
    return results, trajs, size


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - start, value


def run_command(folder: Path, out: Path) -> None:
    command = [sys.executable, "-m", "mlgym_registry.cli", "report", str(folder), "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def in_process(folder: Path, out: Path) -> tuple[float, float]:
    """(seconds to find and read the runs, seconds to build the report from them and write it)."""
    read_s, _ = timed(find_runs, [folder])
    total_s, report = timed(build_report, [folder])
    write_s, _ = timed(write_report, report, out)
    return read_s, total_s - read_s + write_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", help="a folder of runs (default: $MLGYM_ROOT/trajectories/mlgym_bench_v0)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.folder:
        folder = Path(args.folder)
    elif os.environ.get("MLGYM_ROOT"):
        folder = Path(os.environ["MLGYM_ROOT"]) / "trajectories" / "mlgym_bench_v0"
    else:
        parser.error("give a folder of runs, or set MLGYM_ROOT to a checkout of facebookresearch/MLGym")
    if not folder.is_dir():
        parser.error(f"{folder} is not a folder")

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        counts = read_everything(folder)  # warms the file cache
        run_command(folder, out / "warm")
        reads, commands, finds, builds = [], [], [], []
        for index in range(args.rounds):
            reads.append(timed(read_everything, folder)[0])
            commands.append(timed(run_command, folder, out / f"cli{index}")[0])
            find_s, build_s = in_process(folder, out / f"lib{index}")
            finds.append(find_s)
            builds.append(build_s)
        runs = len(find_runs([folder]).runs)

    read, command = statistics.median(reads), statistics.median(commands)
    print(f"{folder}: {runs} runs, {counts[0]} results.json + {counts[1]} .traj files, {counts[2] / 1e6:.0f} MB")
    print(f"median of {args.rounds} rounds, warm file cache")
    print(f"  read every file (json.load):           {read:6.2f} s")
    print(f"  mlgym-registry report (fresh process): {command:6.2f} s   ratio report/read: {command / read:.2f}")
    print(f"    in-process: find + read runs {statistics.median(finds):.2f} s, "
          f"tables + summary + plot {statistics.median(builds):.2f} s")
    print(f"target: report under 10 s -> {'met' if command < 10 else 'NOT met'}")


if __name__ == "__main__":
    main()
