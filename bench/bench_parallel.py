"""Parallel throughput: episodes per second with N = 1, 2 and 4 envs, each in a worker process, and the speed-up.

Every worker plays several episodes of a task with the scripted agent through TorchRL's multi-process collector
(``mlgym_registry.parallel.run_parallel``). The clock starts when the first step arrives, so worker start-up (importing
torch) is left out, and stops when the last episode ends. All settings run one after another in this process.

    python bench/bench_parallel.py [--task prisonersDilemma] [--episodes 3] [--envs 1 2 4]
"""

from __future__ import annotations

import argparse
import os
import time

from mlgym_registry.parallel import run_parallel


def episodes_per_second(task: str, num_envs: int, episodes_per_env: int) -> tuple[float, int]:
    """Measured throughput (episodes per second) and how many episodes finished."""
    first: list[float] = []

    def on_step(finished: int, steps: int) -> None:
        if not first:
            first.append(time.monotonic())

    results = run_parallel(task, "scripted", num_envs, on_step=on_step, episodes_per_env=episodes_per_env)
    elapsed = time.monotonic() - first[0]
    done = sum(result.finished for result in results)
    return done / elapsed, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="prisonersDilemma")
    parser.add_argument("--episodes", type=int, default=3, help="episodes each env plays")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    print(f"parallel throughput, task {args.task}, {args.episodes} episodes per env, {os.cpu_count()} CPUs")
    rates = {}
    for num_envs in args.envs:
        rate, done = episodes_per_second(args.task, num_envs, args.episodes)
        rates[num_envs] = rate
        print(f"N={num_envs}: {done} episodes, {rate:.3f} episodes/s", flush=True)
    reference = rates.get(1) or rates[args.envs[0]]
    for num_envs, rate in rates.items():
        print(f"speed-up N={num_envs} over N={min(rates)}: {rate / reference:.2f}x")


if __name__ == "__main__":
    main()
