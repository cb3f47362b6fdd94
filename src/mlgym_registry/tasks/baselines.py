"""Recompute the baseline scores of tasks by running their starter/baseline code through their own evaluator.

    python -m mlgym_registry.tasks.baselines [--seeds N] [--write] [TASK ...]

Each run happens in a fresh temporary workspace with the run's seed as ``MLGYM_REGISTRY_EVAL_SEED`` (the evaluator's
seed; also as ``MLGYM_REGISTRY_SEED``, for scripts that read the older name), as MLGym runs a baseline: the
baseline script (``baseline_paths[0]``) first, then the evaluator (``evaluation_paths[0]``). The script prints the
mean and standard deviation of every metric over the seeds; ``--write`` stores the means as ``baseline_scores`` in
the task files of our own suite. Without TASK names it covers the whole suite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import InvalidTaskError
from ..specs import TaskSpec
from .suite import TASKS_DIR
from .workspace import stage_workspace

SEED_ENVS = ("MLGYM_REGISTRY_EVAL_SEED", "MLGYM_REGISTRY_SEED")
ENTRYPOINTS = ("PythonSubmissionTasks", "CSVSubmissionTasks")


def run_python(script: str, args: Sequence[str], workspace: Path, seed: int | None, timeout: float) -> str:
    """Run ``python <script> <args>`` in ``workspace``; its stdout, or ``RuntimeError`` with its output on failure."""
    env = {k: v for k, v in os.environ.items() if k not in SEED_ENVS}
    if seed is not None:
        env.update(dict.fromkeys(SEED_ENVS, str(seed)))
    result = subprocess.run(
        [sys.executable, script, *args], cwd=workspace, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise RuntimeError(f"`python {script}` failed with exit code {result.returncode}:\n{result.stderr.strip()}")
    return result.stdout


def evaluate_workspace(spec: TaskSpec, workspace: Path, seed: int | None = None) -> dict[str, float]:
    """Run the task's evaluator in an already staged ``workspace``; the metric dict it prints."""
    if spec.task_entrypoint not in ENTRYPOINTS:
        raise InvalidTaskError(f"task {spec.id!r}: cannot run {spec.task_entrypoint} evaluators here ({ENTRYPOINTS})")
    if not spec.evaluation_paths:
        raise InvalidTaskError(f"task {spec.id!r} has no evaluation_paths")
    args = ["--submission_file", "submission.csv"] if spec.task_entrypoint == "CSVSubmissionTasks" else []
    output = run_python(spec.evaluation_paths[0], args, workspace, seed, spec.training_timeout or 3600)
    try:
        metrics = json.loads(output)
    except json.JSONDecodeError:
        raise RuntimeError(f"task {spec.id!r}: the evaluator printed more than one JSON dict:\n{output}") from None
    if not isinstance(metrics, dict):
        raise RuntimeError(f"task {spec.id!r}: the evaluator printed {output.strip()!r}, not a metric dict")
    return metrics


def run_baseline(spec: TaskSpec, seed: int | None = None) -> dict[str, float]:
    """Score the task's baseline once, in a temporary workspace: its baseline script, then its evaluator."""
    with tempfile.TemporaryDirectory(prefix=f"baseline-{spec.id}-") as folder:
        workspace = stage_workspace(spec, folder)
        evaluator = spec.evaluation_paths[0] if spec.evaluation_paths else None
        if spec.baseline_paths and spec.baseline_paths[0] != evaluator:
            run_python(spec.baseline_paths[0], [], workspace, seed, spec.training_timeout or 3600)
        return evaluate_workspace(spec, workspace, seed)


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
        prog="python -m mlgym_registry.tasks.baselines", description=__doc__.splitlines()[0]
    )
    parser.add_argument("tasks", nargs="*", metavar="TASK", help="task names (default: our whole suite)")
    parser.add_argument("--seeds", type=int, default=5, help="number of seeded runs per task (default 5)")
    parser.add_argument("--write", action="store_true", help="store the means as baseline_scores in our task files")
    args = parser.parse_args(argv)
    from ..registry import registry

    for name in args.tasks or suite_task_names():
        spec = registry.spec(name)
        runs = [run_baseline(spec, seed) for seed in range(args.seeds)]
        summary = summarise(runs)
        shown = ", ".join(f"{k} {mean:.6g} ± {std:.2g}" for k, (mean, std) in summary.items())
        print(f"{name}: {shown} over {len(runs)} seeds (recorded: {spec.baseline})")
        if args.write:
            source = Path(spec.source or "")
            if source.parent != TASKS_DIR:
                raise SystemExit(f"--write only updates our own task files; {name!r} comes from {spec.source!r}")
            write_baseline(source, {k: round(mean, 4) for k, (mean, _) in summary.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
