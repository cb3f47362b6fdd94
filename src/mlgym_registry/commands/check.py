"""``mlgym-registry check PATH_OR_NAME``: for task-suite maintainers, is this task sound?

Loads the task (a registered name or a task YAML file), checks that its files exist, runs its evaluator on the
starter code a few times with different seeds, prints the metrics, and compares the recorded baseline with the fresh
runs. Exit code 0 when everything holds, 1 when something does not.
"""

from __future__ import annotations

import argparse
import json

from ..validation import cli_integer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``check``."""
    parser.add_argument("task", metavar="PATH_OR_NAME", help="a registered task name or a task YAML file")
    parser.add_argument("--runs", type=cli_integer(1), default=3,
                        help="evaluator runs, each with its own seed (default: 3)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    """Check the task and print what was found."""
    from ..testing import check_task

    report = check_task(args.task, runs=args.runs, raise_on_failure=False)
    if args.json:
        print(json.dumps({
            "task": report.spec.id,
            "source": report.spec.source,
            "ok": report.ok,
            "runs": [{"seed": run.seed, "metrics": run.metrics} for run in report.runs],
            "baseline": report.spec.baseline,
            "problems": report.problems,
            "notes": report.notes,
        }, indent=2))
        return 0 if report.ok else 1
    print(f"task {report.spec.id} ({report.spec.source or 'registered in code'})")
    print(f"  files: {len(report.spec.starter_code)} starter file(s), evaluator {report.spec.evaluation_paths or '-'}")
    for run in report.runs:
        print(f"  evaluator run (seed {run.seed}): {run.metrics}")
    for note in report.notes:
        print(f"  baseline ok: {note}")
    for problem in report.problems:
        print(f"  PROBLEM: {problem}")
    print("OK" if report.ok else "FAILED")
    return 0 if report.ok else 1
