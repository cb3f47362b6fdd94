"""Per-step cost of the chain ``registry.make`` builds, at ~20 and at ~400 messages of history.

The backend is the tests' stand-in, whose steps cost nothing, so the time measured is the chain's own overhead:
isolating the action, reading state, formatting the message, growing the history, rendering the prompt, the reward.
Both lengths are measured side by side in one run; the figure that matters is their ratio (flat: <= 1.5).

    python bench/bench_chain.py [--steps 30] [--layout default|seed]
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


def per_step_ms(env, td, layout, *, messages: int, steps: int):
    """Step until the history holds ``messages`` messages, then time ``steps`` more; returns (median ms, td)."""
    times = []
    while True:
        length = td[layout.history].shape[0]
        timing = length >= messages
        td.set(layout.response, RESPONSE)
        start = time.perf_counter()
        td = env.step(td)
        td = env.step_mdp(td)
        elapsed = time.perf_counter() - start
        if timing:
            times.append(elapsed * 1e3)
            if len(times) == steps:
                return statistics.median(times), td


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps timed at each history length")
    parser.add_argument("--layout", default="default", choices=["default", "seed"])
    args = parser.parse_args(argv)

    spec = TaskSpec(id="benchTask", description="A benchmark task.", baseline_scores=[{"Score": 1.0}], max_steps=10**6)
    registry.register("backend", "bench_standin", lambda spec, **kw: StandinBackend(spec, outputs=lambda a: OUTPUT))
    try:
        env = registry.make(spec, backend="bench_standin", layout=args.layout)
        layout = env.base_env.layout
        td = env.reset()
        short, td = per_step_ms(env, td, layout, messages=20, steps=args.steps)
        long, td = per_step_ms(env, td, layout, messages=400, steps=args.steps)
        env.close()
    finally:
        registry.unregister("backend", "bench_standin")
    print(f"layout={args.layout}, stand-in backend (zero-cost steps), median of {args.steps} steps each")
    print(f"per-step chain time at ~20 messages:  {short:7.3f} ms")
    print(f"per-step chain time at ~400 messages: {long:7.3f} ms")
    print(f"ratio 400/20: {long / short:.2f}  (target <= 1.5; target at 400 messages < 5 ms)")


if __name__ == "__main__":
    main()
