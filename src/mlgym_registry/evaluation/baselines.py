"""Recompute the baseline scores of tasks by running their starter/baseline code through their own evaluator.

    python -m mlgym_registry.evaluation.baselines [--seeds N] [--write] [TASK ...]

Each run is scored as ``mlgym-registry check`` scores it (``evaluator_runs.score_starter``): a fresh sandboxed
workspace, the run's seed as the evaluator's seed, the baseline program first, then the pristine evaluator. The
script prints the mean and standard deviation of every metric over the seeds; ``--write`` stores the means as
``baseline_scores`` in the task files of our own suite. Without TASK names it covers the whole suite.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from ..specs import TaskSpec
from ..tasks.suite import TASKS_DIR

SEED_ENVS = ("MLGYM_REGISTRY_EVAL_SEED", "MLGYM_REGISTRY_SEED")
ENTRYPOINTS = ("PythonSubmissionTasks", "CSVSubmissionTasks")


def run_baseline(spec: TaskSpec, seed: int | None = None) -> dict[str, float]:
    """Score the task's baseline once, as ``check`` and ``validate`` score it (``evaluator_runs.score_starter``: a
    sandboxed workspace, the baseline program, then the pristine evaluator with the evaluator's seed ``seed``)."""
    from .evaluator_runs import score_starter

    return score_starter(spec, seed=seed)


def summarise(runs: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """``{metric: (mean, standard deviation)}`` over ``runs`` (std 0 for a single run)."""
    summary = {}
    for key in runs[0]:
        values = [float(run[key]) for run in runs]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[key] = (math.fsum(values) / len(values), spread)
    return summary


def baseline_block(scores: dict[str, float]) -> str:
    """The ``baseline_scores:`` YAML block for one metric dict."""
    lines = ["baseline_scores:"]
    for index, (key, value) in enumerate(scores.items()):
        lines.append(f"{'- ' if index == 0 else '  '}{key}: {value!r}")
    return "\n".join(lines) + "\n"


def write_baseline(path: Path, scores: dict[str, float]) -> None:
    """Replace the ``baseline_scores`` block of the task file at ``path`` (comments and layout are kept)."""
    text = path.read_text()
    block = re.compile(r"^baseline_scores:.*\n(?:[ -].*\n)*", re.MULTILINE)
    if block.search(text):
        text = block.sub(lambda _: baseline_block(scores), text, count=1)
    else:
        text = text.rstrip("\n") + "\n" + baseline_block(scores)
    path.write_text(text)


def suite_task_names() -> list[str]:
    """The names of the tasks whose files live in our own suite folder."""
    from ..registry import registry

    return [e.name for e in registry.describe("task") if e.plugin == "mlgym_registry.tasks.plugin"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mlgym_registry.evaluation.baselines", description=__doc__.splitlines()[0]
    )
    parser.add_argument("tasks", nargs="*", metavar="TASK", help="task names (default: our whole suite)")
    parser.add_argument("--seeds", type=int, default=5, help="number of seeded runs per task (default 5)")
    parser.add_argument("--write", action="store_true", help="store the means as baseline_scores in our task files")
    args = parser.parse_args(argv)
    from ..registry import registry
    from .evaluator_runs import baseline_run

    for name in args.tasks or suite_task_names():
        spec = registry.spec(name)
        runs = [run_baseline(spec, seed) for seed in range(args.seeds)]
        summary = summarise(runs)
        shown = ", ".join(f"{k} {mean:.6g} ± {std:.2g}" for k, (mean, std) in summary.items())
        print(f"{name}: {shown} over {len(runs)} seeds (recorded: {spec.baseline}; baseline program: "
              f"{baseline_run(spec).description})")
        if args.write:
            source = Path(spec.source or "")
            if source.parent != TASKS_DIR:
                raise SystemExit(f"--write only updates our own task files; {name!r} comes from {spec.source!r}")
            write_baseline(source, {k: round(mean, 4) for k, (mean, _) in summary.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
