"""Parallel throughput: episodes per second with N = 1, 2 and 4 envs, each in a worker process, and the speed-up.

Every worker plays episodes of a task with the scripted agent through TorchRL's multi-process collector
(``mlgym_registry.parallel.run_parallel``). Worker start-up (a fresh interpreter importing torch) and shut-down cost
the same however many episodes are played, so each N is run twice, with a few and with more episodes per env, and
the throughput is the extra episodes over the extra time. All settings run one after another in this process;
``--repeat R`` measures each R times and keeps the best, which filters out interference from other work on the
machine.

    python bench/bench_parallel.py [--task prisonersDilemma] [--short 1] [--long 4] [--envs 1 2 4] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import time

from mlgym_registry.parallel import run_parallel


def timed_run(task: str, num_envs: int, episodes_per_env: int) -> tuple[float, int]:
    """Wall time of ``num_envs`` workers playing ``episodes_per_env`` episodes each, and the episodes finished."""
    started = time.monotonic()
    results = run_parallel(task, "scripted", num_envs, episodes_per_env=episodes_per_env, seed=0)
    return time.monotonic() - started, sum(result.finished for result in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="prisonersDilemma")
    parser.add_argument("--short", type=int, default=1, help="episodes per env in the short run")
    parser.add_argument("--long", type=int, default=4, help="episodes per env in the long run")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=1, help="measurements per setting; the best one is kept")
    args = parser.parse_args()
    print(f"parallel throughput, task {args.task}, {os.cpu_count()} CPUs, "
          f"{args.short} then {args.long} episodes per env")
    rates: dict[int, float] = {}
    for num_envs in args.envs:
        for _ in range(args.repeat):
            short_time, short_done = timed_run(args.task, num_envs, args.short)
            long_time, long_done = timed_run(args.task, num_envs, args.long)
            rate = (long_done - short_done) / (long_time - short_time)
            rates[num_envs] = max(rate, rates.get(num_envs, 0.0))
            print(f"N={num_envs}: {short_done} episodes in {short_time:.1f} s, {long_done} in {long_time:.1f} s: "
                  f"{rate:.3f} episodes/s", flush=True)
    reference = min(rates)
    for num_envs, rate in rates.items():
        print(f"speed-up N={num_envs} over N={reference}: {rate / rates[reference]:.2f}x")


if __name__ == "__main__":
    main()
