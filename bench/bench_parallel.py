"""Many envs on one machine: speed-up of N envs over one, and what building and shutting down N workers costs.

Three measures, each for N = 1, 2 and 4 envs (``--envs``) and for each way of starting workers (``--methods``:
``forkserver``, the warm server of ``mlgym_registry.scale.workers``, and ``spawn``, TorchRL's default and what
``--num-envs`` used before), run side by side in one run, ``--rounds`` times in turn; the best of the rounds is
kept, which filters out interference from other work on the machine.

1. ``mlgym-registry run TASK --num-envs N --episodes E`` as a command (scripted agent, ``--seed 0``): wall time of
   the same E episodes (seeds 0..E-1 whatever N) played by 1, 2, 4 envs, and the speed-up over one env. Whether
   every N gave the same scores is printed too.
2. TorchRL's multi-process ``Collector`` over the envs ``run_parallel`` plays
   (``interop.torchrl.collectors.episode_collector``): time to build N workers with their envs, turns/s while they
   play the E episodes, time to shut them down; each over N=1.
3. ``AsyncEnvPool(backend="multiprocessing")`` of N envs (``EnvFactory``, a trivial command every turn, the pool's
   async API as ``LLMCollector`` drives it): build (with the first reset), steps/s over ``--pool-steps`` rounds,
   close; each over N=1.

Before measures 2 and 3, the fork server is started once and waited for (printed): it is what the first warm build
of a process pays, and measure 1 includes it.

    python bench/bench_parallel.py [--task prisonersDilemma] [--episodes 4] [--envs 1 2 4] [--rounds 1]
        [--methods forkserver spawn] [--pool-steps 30] [--measures 1 2 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from mlgym_registry.scale.workers import START_METHOD_VARIABLE

RESPONSE = "DISCUSSION\nA trivial command.\n```\necho hi\n```"
"""The pool's answer every turn in measure 3: a valid command that never ends the episode."""


@contextlib.contextmanager
def start_method(method: str) -> Iterator[None]:
    """Workers started with ``method`` within the block (``MLGYM_REGISTRY_WORKER_START``)."""
    previous = os.environ.get(START_METHOD_VARIABLE)
    os.environ[START_METHOD_VARIABLE] = method
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(START_METHOD_VARIABLE, None)
        else:
            os.environ[START_METHOD_VARIABLE] = previous


def best(samples: dict[tuple, list[float]], key: tuple, high: bool = False) -> float:
    """The best sample of a setting: the lowest time, or the highest rate with ``high``."""
    return (max if high else min)(samples[key])


def load() -> str:
    """The 1-minute load average, to print beside each sample."""
    return f"load {os.getloadavg()[0]:.1f}"


# -- measure 1 -------------------------------------------------------------------------------------------------------
def cli_run(task: str, method: str, num_envs: int, episodes: int) -> tuple[float, list[float]]:
    """Wall time of ``mlgym-registry run`` playing ``episodes`` episodes on ``num_envs`` envs, and the final scores by
    seed order (env ``i``'s episode ``k`` has seed ``k * num_envs + i``)."""
    command = [sys.executable, "-m", "mlgym_registry.cli", "run", task, "--num-envs", str(num_envs), "--episodes",
               str(episodes), "--seed", "0", "--quiet"]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        started = time.perf_counter()
        done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True,
                              env={**os.environ, START_METHOD_VARIABLE: method}, timeout=900)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
        per_env = episodes // num_envs
        scores = {}
        for index in range(num_envs):
            for number in range(per_env):
                folder_name = f"env{index}" if per_env == 1 else f"env{index}-{number}"
                if episodes == 1:
                    folder_name = "."
                results = json.loads((out / folder_name / "results.json").read_text())
                scores[number * num_envs + index] = results["agent"][-1]["Score"] if results["agent"] else None
    return elapsed, [scores[seed] for seed in sorted(scores)]


def measure_cli(task: str, envs: list[int], methods: list[str], episodes: int, rounds: int) -> dict[str, float]:
    """Measure 1: the command's wall time per (method, N), and the speed-ups over N=1."""
    times: dict[tuple, list[float]] = {}
    scores: dict[tuple, list[float]] = {}
    print(f"1. mlgym-registry run {task} --num-envs N --episodes {episodes} --seed 0 (wall time of the command)")
    for round_number in range(rounds):
        for method in methods:
            for num_envs in envs:
                elapsed, scores[method, num_envs] = cli_run(task, method, num_envs, episodes)
                times.setdefault((method, num_envs), []).append(elapsed)
                print(f"   round {round_number + 1} {method:<10} N={num_envs}: {elapsed:5.1f} s ({load()})", flush=True)
    ratios = {}
    for method in methods:
        one = best(times, (method, min(envs)))
        cells = []
        for num_envs in envs:
            ratio = one / best(times, (method, num_envs))
            ratios[f"cli_{method}_{num_envs}"] = ratio
            cells.append(f"N={num_envs} {best(times, (method, num_envs)):.1f} s ({ratio:.2f}x)")
        print(f"   {method:<10} " + ", ".join(cells))
    if "forkserver" in methods and "spawn" in methods:
        cells = [f"N={n} {best(times, ('spawn', n)) / best(times, ('forkserver', n)):.2f}x" for n in envs]
        print("   forkserver over spawn, same N: " + ", ".join(cells))
    same = len({json.dumps(values) for values in scores.values()}) == 1
    print(f"   the same scores, seed by seed, for every N and method: {'yes' if same else 'NO'}"
          f" {next(iter(scores.values())) if same else scores}")
    return ratios


# -- measure 2 -------------------------------------------------------------------------------------------------------
def collector_run(task: str, num_envs: int, episodes: int) -> tuple[float, float, float]:
    """Build, play ``episodes`` episodes (``episodes / num_envs`` per env) and shut down a ``run_parallel``
    collector: (build seconds, turns/s, shutdown seconds)."""
    from mlgym_registry.episodes.episode import text_at
    from mlgym_registry.interop.torchrl.collectors import WORKER_KEY, episode_collector

    per_env = episodes // num_envs
    started = time.perf_counter()
    collector, _ = episode_collector(task, "scripted", num_envs, seed=0, episodes_per_env=per_env)
    built = time.perf_counter()
    finished: dict[int, int] = {}
    turns = 0
    try:
        for batch in collector:
            for frame in batch.reshape(-1).unbind(0):
                worker = int(text_at(frame, ("next", WORKER_KEY)))
                if finished.get(worker, 0) >= per_env:
                    continue  # an idle worker's step, as run_parallel drops them
                turns += 1
                finished[worker] = finished.get(worker, 0) + int(frame.get(("next", "done")).any())
            if sum(finished.values()) >= episodes:
                break
        played = time.perf_counter()
    finally:
        collector.shutdown()
    stopped = time.perf_counter()
    return built - started, turns / (played - built), stopped - played


def measure_collector(task: str, envs: list[int], methods: list[str], episodes: int, rounds: int) -> dict[str, float]:
    """Measure 2: build, turns/s and shutdown of the collector per (method, N), each over N=1."""
    samples: dict[str, dict[tuple, list[float]]] = {"build": {}, "rate": {}, "shutdown": {}}
    print(f"2. run_parallel's Collector (backend='process'), {task}, {episodes} episodes over N envs")
    for round_number in range(rounds):
        for method in methods:
            with start_method(method):
                for num_envs in envs:
                    build, rate, shutdown = collector_run(task, num_envs, episodes)
                    for name, value in (("build", build), ("rate", rate), ("shutdown", shutdown)):
                        samples[name].setdefault((method, num_envs), []).append(value)
                    print(f"   round {round_number + 1} {method:<10} N={num_envs}: build {build:5.2f} s, "
                          f"{rate:5.1f} turns/s, shutdown {shutdown:5.2f} s ({load()})", flush=True)
    return summarise("collector", samples, envs, methods)


# -- measure 3 -------------------------------------------------------------------------------------------------------
def pool_run(task: str, num_envs: int, steps: int) -> tuple[float, float, float]:
    """Build (and reset) an ``AsyncEnvPool(backend="multiprocessing")`` of ``num_envs`` envs, step it ``steps``
    rounds, close it: (build seconds, steps/s, close seconds)."""
    from torchrl.envs import AsyncEnvPool

    from mlgym_registry.interop.torchrl.env_factory import EnvFactory
    from mlgym_registry.scale.workers import WithParentEnviron, warm_workers

    factory = EnvFactory.from_spec(task, max_steps=10**6)
    started = time.perf_counter()
    with warm_workers():
        pool = AsyncEnvPool([WithParentEnviron(factory)] * num_envs, backend="multiprocessing", exchange="queue")
    try:
        td = pool.reset()
        built = time.perf_counter()
        for _ in range(steps):
            td.set(("text", "response"), [[RESPONSE]] * num_envs)
            pool.async_step_and_maybe_reset_send(td)
            _, td = pool.async_step_and_maybe_reset_recv(min_get=num_envs)
        stepped = time.perf_counter()
    finally:
        pool.close()
    closed = time.perf_counter()
    return built - started, steps * num_envs / (stepped - built), closed - stepped


def measure_pool(task: str, envs: list[int], methods: list[str], steps: int, rounds: int) -> dict[str, float]:
    """Measure 3: build, steps/s and close of a multiprocessing ``AsyncEnvPool`` per (method, N), each over N=1."""
    samples: dict[str, dict[tuple, list[float]]] = {"build": {}, "rate": {}, "shutdown": {}}
    print(f"3. AsyncEnvPool(backend='multiprocessing'), {task}, `echo hi` every turn, {steps} rounds")
    for round_number in range(rounds):
        for method in methods:
            with start_method(method):
                for num_envs in envs:
                    build, rate, shutdown = pool_run(task, num_envs, steps)
                    for name, value in (("build", build), ("rate", rate), ("shutdown", shutdown)):
                        samples[name].setdefault((method, num_envs), []).append(value)
                    print(f"   round {round_number + 1} {method:<10} N={num_envs}: build {build:5.2f} s, "
                          f"{rate:5.1f} steps/s, close {shutdown:5.2f} s ({load()})", flush=True)
    return summarise("pool", samples, envs, methods)


def summarise(name: str, samples: dict[str, dict[tuple, list[float]]], envs: list[int],
              methods: list[str]) -> dict[str, float]:
    """Print, per method, build and shutdown of N over N=1 and the rate of N over N=1; return the ratios."""
    ratios = {}
    for method in methods:
        one = min(envs)
        cells = []
        for num_envs in envs:
            build = best(samples["build"], (method, num_envs)) / best(samples["build"], (method, one))
            shutdown = best(samples["shutdown"], (method, num_envs)) / best(samples["shutdown"], (method, one))
            rate = best(samples["rate"], (method, num_envs), high=True)
            speed = rate / best(samples["rate"], (method, one), high=True)
            ratios.update({f"{name}_{method}_{num_envs}_build": build, f"{name}_{method}_{num_envs}_shutdown": shutdown,
                           f"{name}_{method}_{num_envs}_rate": speed})
            cells.append(f"N={num_envs}: build {build:.2f}x, shutdown {shutdown:.2f}x, {rate:.1f}/s ({speed:.2f}x)")
        print(f"   {method:<10} over N={one}: " + "; ".join(cells))
    return ratios


def warm_up(methods: list[str]) -> None:
    """Start the fork server and wait until it has imported its modules (a forked no-op process)."""
    if "forkserver" not in methods:
        return
    import multiprocessing

    from mlgym_registry.scale.workers import start_worker_server

    with start_method("forkserver"):
        started = time.perf_counter()
        start_worker_server()
        process = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(0,))
        process.start()
        process.join()
    print(f"fork server started and ready in {time.perf_counter() - started:.1f} s (once per process)")


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the measures; return their ratios by name."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="prisonersDilemma")
    parser.add_argument("--episodes", type=int, default=4, help="episodes played by every N in measures 1 and 2")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--methods", nargs="+", default=["forkserver", "spawn"], choices=["forkserver", "spawn"])
    parser.add_argument("--rounds", type=int, default=1, help="measurements per setting, in turn; the best is kept")
    parser.add_argument("--pool-steps", type=int, default=30, help="rounds of steps timed in measure 3")
    parser.add_argument("--measures", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    args = parser.parse_args(argv)
    for num_envs in args.envs:
        if args.episodes % num_envs:
            parser.error(f"--episodes {args.episodes} must be a multiple of every N (not of {num_envs})")
    print(f"many envs, task {args.task}, {os.cpu_count()} CPUs, {load()}; methods {' '.join(args.methods)}")
    ratios: dict[str, float] = {}
    if 1 in args.measures:
        ratios.update(measure_cli(args.task, args.envs, args.methods, args.episodes, args.rounds))
    if 2 in args.measures or 3 in args.measures:
        warm_up(args.methods)
    if 2 in args.measures:
        ratios.update(measure_collector(args.task, args.envs, args.methods, args.episodes, args.rounds))
    if 3 in args.measures:
        ratios.update(measure_pool(args.task, args.envs, args.methods, args.pool_steps, args.rounds))
    return ratios


if __name__ == "__main__":
    main()
