"""``mlgym-registry report DIR... --out OUT``: MLGym's leaderboard tables over recorded runs.

Reads every run under the folders (MLGym's layout: ``<model>__<task>__.../{results.json,<task>.traj}``, as ``bench``
writes it and MLGym publishes it) and writes into OUT the best/last score and rank tables and the AUP table shaped
like MLGym's ``results/tables``, a Markdown summary and a PNG of the performance profiles. Each unreadable file gets
one warning line on stderr; the other runs are still reported.
"""

from __future__ import annotations

import argparse
import sys

from ..terminal import printable


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of names, got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``report``."""
    parser.add_argument("folders", nargs="+", metavar="DIR", help="folders holding runs (searched recursively)")
    parser.add_argument("--out", required=True, metavar="OUT", help="folder to write the tables, summary and plot to")
    parser.add_argument(
        "--models", type=_names, metavar="A,B,...",
        help="the model columns, in this order (default: every model found, sorted); runs of other models are left "
        "out and counted in the summary",
    )
    parser.add_argument("--tasks", type=_names, metavar="T1,T2,...", help="only these tasks (default: all found)")
    parser.add_argument(
        "--metric", action="append", default=[], metavar="TASK=METRIC[:max|:min]",
        help="rank TASK by METRIC, in the direction given (else the task's own, else higher is better); for tasks "
        "whose spec names no metric (repeatable)",
    )
    parser.add_argument("--include-failed", action="store_true",
                        help="score runs that failed, got no answer, empty answers or no usage too (default: they are "
                        "listed but left out of scores and ranks)")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the performance-profile PNG")
    parser.add_argument("--no-noise-band", action="store_true",
                        help="do not score the starter code under the runs' seeds (it runs each task's evaluator "
                        "once per seed)")


def main(args: argparse.Namespace) -> int:
    """Build the report, write it and say what was written."""
    from ..evaluation.report import INSTALL_HINT, PLOT, build_report, write_report
    from ..evaluation.tasks import parse_metric_choice

    choices = {}
    for text in args.metric:
        task, metric, higher = parse_metric_choice(text)
        choices[task] = (metric, higher)
    report = build_report(args.folders, models=args.models, tasks=args.tasks, metric_choices=choices,
                          include_failed=args.include_failed, noise_band=not args.no_noise_band)
    for bad in report.found.bad_files:
        warn(f"{bad.path} {bad.reason}; its run is reported without it")
    for why in report.unranked.values():
        warn(why)
    for warning in report.context.warnings if report.context is not None else ():
        warn(warning)
    written = write_report(report, args.out, plot=not args.no_plot)
    board = report.board
    scored = sum(s.score is not None for s in report.statuses)
    print(
        f"{len(report.statuses)} runs ({scored} with a score) of {len(board.models)} models on {len(board.tasks)} "
        f"tasks; {len(report.failed)} with problems"
        f"{'' if args.include_failed else f' ({sum(s.excluded for s in report.statuses)} scores left out)'}, "
        f"{len(report.incomplete)} without a score, "
        f"{len(report.found.bad_files)} unreadable files"
    )
    for path in written:
        print(f"wrote {path}")
    if not args.no_plot and not any(path.name == PLOT for path in written):
        warn(f"no plot: matplotlib is not installed; {INSTALL_HINT}")
    return 0


def warn(message: str) -> None:
    """One ``mlgym-registry: warning: ...`` line on stderr."""
    print(f"mlgym-registry: warning: {printable(message)}", file=sys.stderr)
