"""What a turn costs as the conversation grows, in process and through TorchRL's process-based pools.

One env of ``--task`` plays ``--turns`` turns of the same fenced command (``echo hi``; no episode ends) driven four
ways, one after another in this run: in this process (``step_and_maybe_reset``), through an
``AsyncEnvPool(backend="multiprocessing")`` built as docs/scaling.md builds it, and through ``ParallelEnv`` with
TorchRL's defaults and with ``consolidate=False``. Each turn is timed as the trainer sees it (send, step, receive);
the bench prints, per driver, the median turn over the first ``--window`` turns and over the last ones (the
conversation then holds about 2 x ``--turns`` messages), their ratio (flat = 1.00), and each driver's late turn over
the in-process one. The pool's queues carry only the messages the other end lacks (``interop/torchrl/pool_wire.py``);
``ParallelEnv`` sends every env's whole batch to every worker (TorchRL's design), so its turns grow with the
conversation.

Target (issue: many envs on one machine): the multiprocessing pool's late/early ratio <= 1.3 (flat in the episode's
length). Nothing fails on a missed target: the line says met or NOT met.

    python bench/bench_pool_turns.py [--turns 200] [--window 20] [--task prisonersDilemma]
        [--drivers inprocess,pool,parallel,parallel-noconsolidate]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

RESPONSE = "DISCUSSION\nSay hi.\n```\necho hi\n```"
DRIVERS = ("inprocess", "pool", "parallel", "parallel-noconsolidate")


def timed_turns(td, step: Callable, response, turns: int) -> list[float]:
    """Seconds of each of ``turns`` calls of ``step`` (one turn: ``td`` in, the next turn's ``td`` out), with the
    reply ``response`` set before each."""
    times = []
    for _ in range(turns):
        td["text", "response"] = response
        start = time.perf_counter()
        td = step(td)
        times.append(time.perf_counter() - start)
    return times


def time_in_process(factory: Callable, turns: int) -> list[float]:
    env = factory()
    try:
        return timed_turns(env.reset(), lambda td: env.step_and_maybe_reset(td)[1], RESPONSE, turns)
    finally:
        env.close()


def time_pool(factory: Callable, turns: int) -> list[float]:
    from torchrl.envs import AsyncEnvPool

    from mlgym_registry.scale.workers import warm_workers

    with warm_workers():
        pool = AsyncEnvPool([factory], backend="multiprocessing", exchange="queue")

    def step(td):
        pool.async_step_and_maybe_reset_send(td)
        return pool.async_step_and_maybe_reset_recv(min_get=1)[1]

    try:
        return timed_turns(pool.reset(), step, [[RESPONSE]], turns)
    finally:
        pool.close()


def time_parallel(factory: Callable, turns: int, consolidate: bool) -> list[float]:
    from torchrl.envs import ParallelEnv

    from mlgym_registry.scale.workers import warm_workers

    with warm_workers():
        env = ParallelEnv(1, factory, consolidate=consolidate)
        td = env.reset()
    try:
        return timed_turns(td, lambda td: env.step_and_maybe_reset(td)[1], [[RESPONSE]], turns)
    finally:
        env.close()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="prisonersDilemma")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=20, help="turns in each of the early and late medians")
    parser.add_argument("--drivers", default=",".join(DRIVERS), help="comma-separated, of: " + ", ".join(DRIVERS))
    args = parser.parse_args(argv)

    from mlgym_registry.interop.torchrl.env_factory import EnvFactory
    from mlgym_registry.scale.workers import WithParentEnviron

    factory = WithParentEnviron(EnvFactory.from_spec(args.task, max_steps=10**6))
    timers = {
        "inprocess": lambda: time_in_process(factory, args.turns),
        "pool": lambda: time_pool(factory, args.turns),
        "parallel": lambda: time_parallel(factory, args.turns, consolidate=True),
        "parallel-noconsolidate": lambda: time_parallel(factory, args.turns, consolidate=False),
    }
    drivers = [name.strip() for name in args.drivers.split(",") if name.strip()]
    unknown = sorted(set(drivers) - set(DRIVERS))
    if unknown:
        parser.error(f"unknown driver(s) {unknown}: choose from {', '.join(DRIVERS)}")
    print(f"{args.task}, {args.turns} turns of `echo hi` per driver; medians of the first and last {args.window} "
          f"turns (about {2 * args.turns} messages at the end)")
    late: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for name in drivers:
        times = timers[name]()
        early = statistics.median(times[1:args.window + 1]) * 1000
        late[name] = statistics.median(times[-args.window:]) * 1000
        ratios[name] = late[name] / early
        print(f"{name:<24} early turn {early:7.2f} ms, late turn {late[name]:7.2f} ms, late/early {ratios[name]:.2f}")
    if "inprocess" in late:
        for name in drivers:
            if name != "inprocess":
                print(f"{name:<24} late turn over in-process: {late[name] / late['inprocess']:.2f}")
    if "pool" in ratios:
        met = "met" if ratios["pool"] <= 1.3 else "NOT met"
        print(f"multiprocessing pool late/early {ratios['pool']:.2f}, target <= 1.3 (flat): {met}")
    return ratios


if __name__ == "__main__":
    main()
