"""``mlgym-registry check PATH_OR_NAME``: for task-suite maintainers, is this task sound?

Loads the task (a registered name or a task YAML file), checks that its files exist, runs its evaluator on the
starter code a few times with different seeds (after its baseline program, which it names: the task's own, or the one
of the MLGym task it derives from), prints the metrics, and compares the recorded baseline (saying which scores, from
which file) with the fresh runs. Exit code 0 when everything holds, 1 when something does not.

``check --integrity TASK...`` audits each task's reward: it plays the canary suite (``mlgym_registry.integrity``)
through the task's real env and prints a table per task; exit 1 when any canary beats honesty or a reference fails.

``check --plugin DIST`` checks every component an installed distribution registered, and ``check --kind KIND NAME``
one component: each lazy reference is imported (an import or syntax error is that component's failure, naming the
module) and the conformance kit's check for its kind runs on it; one line per component, exit 1 when any fails.
"""

from __future__ import annotations

import argparse
import json

from ..kinds import KINDS
from ..options import cli_integer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``check``."""
    parser.add_argument("task", metavar="PATH_OR_NAME", nargs="*",
                        help="a registered task name or a task YAML file (with --kind: a component's name; with "
                             "--integrity: one or more tasks)")
    parser.add_argument("--integrity", action="store_true",
                        help="audit the tasks' rewards: play the canary suite against each and print what it paid")
    parser.add_argument("--reward", action="append", metavar="NAME",
                        help="with --integrity: judge under this reward (repeatable; default: the task's own and "
                             "mlgym_best_improvement)")
    parser.add_argument("--canary", action="append", metavar="NAME",
                        help="with --integrity: play only this canary besides the references (repeatable)")
    parser.add_argument("--plugin", metavar="DIST",
                        help="check every component the installed distribution DIST registered")
    parser.add_argument("--kind", choices=KINDS, help="check NAME as a component of this kind (default: task)")
    parser.add_argument("--runs", type=cli_integer(1), default=3,
                        help="evaluator runs, each with its own seed (default: 3)")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="seconds each run's baseline program (its training) may take (default: the task's "
                             "training_timeout); one that does not finish in it is reported, never scored")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    """Check the task (or the plugin's components, or one component) and print what was found."""
    from ..testing import check_task

    if args.integrity:
        return _check_integrity(args)
    if args.reward or args.canary:
        raise SystemExit("--reward and --canary go with --integrity")
    if len(args.task) > 1:
        raise SystemExit(f"check takes one PATH_OR_NAME (got {len(args.task)}); --integrity takes several")
    args.task = args.task[0] if args.task else None
    if args.plugin is not None or (args.kind not in (None, "task")):
        return _check_components(args)
    if args.task is None:
        raise SystemExit("check needs a task (PATH_OR_NAME), --plugin DIST or --kind KIND NAME")
    _refuse_components(args.task)
    report = check_task(args.task, runs=args.runs, raise_on_failure=False, budget=args.budget)
    if args.json:
        print(json.dumps({
            "task": report.spec.id,
            "source": report.spec.source,
            "ok": report.ok,
            "runs": [{"seed": run.seed, "metrics": run.metrics} for run in report.runs],
            "baseline": report.spec.baseline,
            "baseline_program": report.baseline_program,
            "compared_with": report.compared_with,
            "problems": report.problems,
            "notes": report.notes,
            "known_differences": report.known_differences,
            "warnings": report.warnings,
        }, indent=2))
        return 0 if report.ok else 1
    print(f"task {report.spec.id} ({report.spec.source or 'registered in code'})")
    print(f"  files: {len(report.spec.starter_code)} starter file(s), evaluator {report.spec.evaluation_paths or '-'}")
    if report.baseline_program:
        print(f"  baseline program: {report.baseline_program}")
    for run in report.runs:
        print(f"  evaluator run (seed {run.seed}): {run.metrics}")
    if report.compared_with:
        print(f"  compared with: {report.compared_with}")
    for note in report.notes:
        print(f"  baseline reproduced: {note}")
    for difference in report.known_differences:
        print(f"  baseline differs, known cause: {difference}")
    for warning in report.warnings:
        print(f"  WARNING: {warning}")
    for problem in report.problems:
        print(f"  PROBLEM: {problem}")
    print("OK" if report.ok else "FAILED")
    return 0 if report.ok else 1


def _check_integrity(args: argparse.Namespace) -> int:
    """``--integrity TASK...``: the audit's table per task (or JSON), saved for ``list`` and ``info``; exit 1 when
    any task failed it."""
    import shutil

    from ..integrity import audit
    from ..integrity.report import exploits_folder, save_result
    from ..registry import registry
    from ..terminal import printable

    if not args.task:
        raise SystemExit("check --integrity needs one or more tasks (PATH_OR_NAME)")
    if args.plugin is not None or args.kind not in (None, "task"):
        raise SystemExit("check --integrity audits tasks; it takes no --plugin or --kind")
    for name in args.task:
        _refuse_components(name)
    reports = []
    for name in args.task:
        spec = registry.spec(name)
        exploits = exploits_folder(str(spec.registered_as or spec.id))
        shutil.rmtree(exploits, ignore_errors=True)  # the last audit's exploits only
        report = audit(name, rewards=args.reward, canaries=args.canary, exploits=exploits)
        save_result(report)
        reports.append(report)
        if not args.json:
            print(printable(report.table()), flush=True)
    if args.json:
        print(json.dumps([report.to_dict() for report in reports], indent=2))
    return 0 if all(report.ok for report in reports) else 1


def _check_components(args: argparse.Namespace) -> int:
    """``--plugin DIST`` or ``--kind KIND NAME``: one line per component, exit 1 when any failed."""
    from ..testing import check_component, check_plugin

    if args.plugin is not None and args.task is not None:
        raise SystemExit(f"check --plugin takes no PATH_OR_NAME (got {args.task!r}); give one or the other")
    if args.plugin is not None and args.kind is not None:
        raise SystemExit("check --plugin checks every kind; use --kind KIND NAME to check one component")
    if args.plugin is None and args.task is None:
        raise SystemExit(f"check --kind {args.kind} needs the NAME of the {args.kind} to check")
    if args.plugin is not None:
        results = check_plugin(args.plugin, runs=args.runs)
    else:
        results = [check_component(args.kind, args.task, runs=args.runs)]
    if args.json:
        print(json.dumps([{**result.__dict__, "ok": result.ok} for result in results], indent=2))
    else:
        from ..terminal import printable

        if not results:
            print(f"distribution {args.plugin!r} registered no components")
        for result in results:
            print(printable(result.line()).replace("\n", "\n    "))
        counts = {status: sum(result.status == status for result in results) for status in ("ok", "skip", "FAIL")}
        print(f"{counts['ok']} ok, {counts['skip']} skipped, {counts['FAIL']} failed")
    return 0 if all(result.ok for result in results) else 1


def _refuse_components(name: str) -> None:
    """A name that is no task but a component of some kind: say so and point at ``--kind``."""
    from ..errors import MLGymRegistryError
    from ..registry import registry

    if name.endswith((".yaml", ".yml")) or name in registry.names("task"):
        return
    kinds = [kind for kind in KINDS if kind != "task" and name in registry.names(kind)]
    if kinds:
        commands = " or ".join(f"`mlgym-registry check --kind {kind} {name}`" for kind in kinds)
        raise MLGymRegistryError(f"{name!r} is not a task but a {' and a '.join(kinds)}; check it with {commands}")
