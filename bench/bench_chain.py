"""Per-step cost of the chain ``registry.make`` builds, at ~20 and at ~400 messages of history.

The backend is the tests' stand-in, whose steps cost nothing, so the time measured is the chain's own overhead:
isolating the action, reading state, formatting the message, growing the history, rendering the prompt, the reward.
Both lengths are measured side by side in one run; the figure that matters is their ratio (flat: <= 1.5). It is
measured for each history processor named (default: all three built-in ones); the length counted is the whole
conversation's, whatever the processor shows the policy.

Targets (issue 20): with ``full``, at most 3 ms of CPU per step at ~20 and at ~400 messages; the other processors at
most 10% over that (3.3 ms); flat for every processor (ratio 400/20 <= 1.5). Each processor's CPU time is also
printed as a ratio to ``full``'s, measured in the same run.

    python bench/bench_chain.py [--steps 30] [--layout default|seed] [--history full last_n_observations ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from standin import StandinBackend  # noqa: E402

from mlgym_registry import TaskSpec, registry  # noqa: E402

RESPONSE = "I list the files to see what is there.\n```\nls -a\n```\n"
OUTPUT = "evaluate.py  strategy.py  target.py\n" * 5


def timed_step(env, td, layout) -> tuple[tuple[float, float], object]:
    """One ``step`` + ``step_mdp`` with a fenced command; returns ((cpu ms, wall ms), next root tensordict).

    CPU time (this process) is the headline: on a shared machine, wall time also counts the time spent waiting for
    a core.
    """
    td.set(layout.response, RESPONSE)
    cpu, wall = time.process_time(), time.perf_counter()
    td = env.step_mdp(env.step(td))
    return ((time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3), td


def advance(env, td, layout, messages: int):
    """Step (untimed) until the conversation holds at least ``messages`` messages."""
    while td[layout.stored_history].shape[-1] < messages:
        _, td = timed_step(env, td, layout)
    return td


def compare(make_env, *, short: int, long: int, steps: int) -> tuple[list[tuple], list[tuple]]:
    """Per-step times of two envs stepped alternately, one kept near ``short`` messages, one from ``long`` on.

    Alternating the two makes a burst of load on the machine hit both series alike.
    """
    short_env, long_env = make_env(), make_env()
    layout = short_env.base_env.layout
    td_long = advance(long_env, long_env.reset(), layout, long)
    td_short = advance(short_env, short_env.reset(), layout, short)
    short_ms, long_ms = [], []
    for _ in range(steps):
        if td_short[layout.stored_history].shape[-1] > short + 6:
            td_short = advance(short_env, short_env.reset(), layout, short)
        elapsed, td_short = timed_step(short_env, td_short, layout)
        short_ms.append(elapsed)
        elapsed, td_long = timed_step(long_env, td_long, layout)
        long_ms.append(elapsed)
    short_env.close()
    long_env.close()
    return short_ms, long_ms


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps timed at each history length")
    parser.add_argument("--layout", default="default", choices=["default", "seed"])
    parser.add_argument("--history", nargs="+", default=["full", "last_n_observations", "token_budget"],
                        help="history processors to measure")
    args = parser.parse_args(argv)

    spec = TaskSpec(id="benchTask", description="A benchmark task.", baseline_scores=[{"Score": 1.0}], max_steps=10**6)
    registry.register("backend", "bench_standin", lambda spec, **kw: StandinBackend(spec, outputs=lambda a: OUTPUT))
    print(f"layout={args.layout}, stand-in backend (zero-cost steps), median of {args.steps} alternated steps each")
    cpu: dict[str, tuple[float, float]] = {}
    try:
        for history in args.history:
            short_ms, long_ms = compare(
                lambda history=history: registry.make(spec, backend="bench_standin", layout=args.layout,
                                                      history=history),
                short=20,
                long=400,
                steps=args.steps,
            )
            for index, clock in ((0, "CPU"), (1, "wall")):
                short = statistics.median(sample[index] for sample in short_ms)
                long = statistics.median(sample[index] for sample in long_ms)
                print(f"history={history:<20} {clock:>4} per-step chain time at ~20 messages: {short:7.3f} ms, "
                      f"at ~400 messages: {long:7.3f} ms, ratio 400/20: {long / short:.2f}")
                if clock == "CPU":
                    cpu[history] = (short, long)
    finally:
        registry.unregister("backend", "bench_standin")
    if "full" in cpu:
        for history, (short, long) in cpu.items():
            if history != "full":
                print(f"history={history:<20} CPU / full's: at ~20 messages {short / cpu['full'][0]:.2f}, "
                      f"at ~400 messages {long / cpu['full'][1]:.2f}")
    print("targets: full <= 3 ms CPU at ~20 and ~400 messages, the others <= 3.3 ms; ratio 400/20 <= 1.5 (flat)")


if __name__ == "__main__":
    main()
