"""Cost of the checked component outputs (``mlgym_registry.components.output_checks``): a chain step at ~400
messages with the checks on against the same step with them off, side by side in one run.

The backend is the tests' stand-in (zero-cost steps), so the time measured is the chain's own. One env is stepped
with the checks switched on and off on alternate steps (``output_checks.ENABLED``), so a burst of load on the
machine hits both series alike; its ``info["score"]`` holds a few validations, so the reward check copies and
compares a real score list. The figure that matters is the ratio on/off (target: under 1.05). The direct cost of the
checks alone (parser, isolator, reward with its info comparison, one template) is printed too, in microseconds.

    python bench/bench_output_checks.py [--steps 150] [--layout default|seed]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_chain import OUTPUT, advance, timed_step  # noqa: E402
from standin import StandinBackend  # noqa: E402

from mlgym_registry import TaskSpec, registry  # noqa: E402
from mlgym_registry.components import output_checks

VALIDATE = "I score the submission.\n```\nvalidate\n```\n"


def compare(env, layout, *, messages: int, steps: int) -> tuple[list[tuple], list[tuple]]:
    """Per-step times with the checks on and off, alternated on one env kept from ``messages`` messages on."""
    td = env.reset()
    for _ in range(3):  # a score list of a few entries for the reward check to copy and compare
        td.set(layout.response, VALIDATE)
        td = env.step_mdp(env.step(td))
    td = advance(env, td, layout, messages)
    on, off = [], []
    try:
        for index in range(2 * steps):
            checked = index % 2 == 0
            output_checks.ENABLED = checked
            elapsed, td = timed_step(env, td, layout)
            (on if checked else off).append(elapsed)
    finally:
        output_checks.ENABLED = True
    return on, off


def direct_cost(env) -> float:
    """Microseconds the checks themselves take per step (without the chain around them)."""
    task = env.base_env.task
    info = {"score": [{"Score": 1.0}, {"Score": 1.1}, {"Score": 1.2}], "exit_status": "", "submission": None}
    response = "I list the files.\n```\nls -a\n```\n"
    system = env.base_env.task.template
    system = getattr(system, "system_template", "")

    def checked() -> None:
        action = task.isolator(response, output_checks.checked_parser(task))
        output_checks.check_isolator_output(action, task)
        output_checks.call_reward(task, "output", info)
        output_checks.check_template_text(system, task, "system_template")

    def unchecked() -> None:
        task.isolator(response, task.parser)
        float(task.reward("output", info, task.spec))

    runs = 2000
    best_checked = min(timeit.repeat(checked, number=runs, repeat=5)) / runs
    best_unchecked = min(timeit.repeat(unchecked, number=runs, repeat=5)) / runs
    return (best_checked - best_unchecked) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="steps timed with the checks on (and as many off)")
    parser.add_argument("--layout", default="default", choices=["default", "seed"])
    args = parser.parse_args(argv)

    spec = TaskSpec(id="benchTask", description="A benchmark task.", baseline_scores=[{"Score": 1.0}], max_steps=10**6)
    registry.register("backend", "bench_checks_standin",
                      lambda spec, **kw: StandinBackend(spec, outputs=lambda a: OUTPUT, scores=[{"Score": 1.1}] * 3))
    try:
        env = registry.make(spec, backend="bench_checks_standin", layout=args.layout)
        layout = env.base_env.layout
        on, off = compare(env, layout, messages=400, steps=args.steps)
        extra_us = direct_cost(env)
        env.close()
    finally:
        registry.unregister("backend", "bench_checks_standin")
    print(f"layout={args.layout}, stand-in backend (zero-cost steps), ~400 messages, median of {args.steps} steps "
          "each, checks on and off alternated")
    for index, clock in ((0, "CPU"), (1, "wall")):
        checked = statistics.median(sample[index] for sample in on)
        unchecked = statistics.median(sample[index] for sample in off)
        print(f"{clock:>4} per-step chain time, checks on: {checked:7.3f} ms, off: {unchecked:7.3f} ms, "
              f"ratio on/off: {checked / unchecked:.3f}")
    print(f"direct cost of the checks: {extra_us:.1f} us per step")
    print("target: ratio on/off < 1.05")


if __name__ == "__main__":
    main()
