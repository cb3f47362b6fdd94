"""The ``report`` command's work: runs in, MLGym-shaped tables, a Markdown summary and a profile plot out.

``build_report`` reads the runs and computes the leaderboard; ``write_report`` writes into a folder:

- ``best_scores.csv``, ``last_scores.csv``: a row per task, a column for the baseline and for each model;
- ``best_ranks.csv``, ``last_ranks.csv``: a row per task with the columns best first, then the two overall orders;
- ``aup_scores.csv``: a row per model (and the baseline) with its best-attempt and last-submission AUP;
- ``runs.csv``: a row per run: its model (and settings), task, folder, exit status, scores, usage and problems;
- ``accounting.csv``: a row per model: calls, retries, tokens, cost, time waiting for the model, wall time
  (``accounting.py``);
- ``spread.csv``, ``noise_band.csv``: mean and std of each model's runs per task, and the starter code's scores under
  the runs' seeds (``context.py``);
- ``summary.md``: those tables, how each task is ranked, run counts, and every failed, incomplete or unreadable run;
- ``performance_profiles.png``: the profiles (needs matplotlib, the ``[report]`` extra; skipped with a note without).

Numbers in the CSV files are rounded to 3 decimals, as in MLGym's published tables. Runs of one model recorded with
different settings (``settings.json``, written by ``bench``) are different models here, named
``model[setting=value,...]`` by the settings that differ. Runs with problems (``runs.run_problems``: failed, the
API failed, no answer, empty answers, no usage) are left out of scores and ranks unless ``include_failed``.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MLGymRegistryError
from .accounting import ACCOUNTING_TABLE, accounting, accounting_markdown, accounting_rows
from .context import NOISE_TABLE, SPREAD_TABLE, Context, build_context, context_markdown, noise_rows, spread_rows
from .metrics import BASELINE, BORDA, MEAN_RANK, Leaderboard, Score, TaskResult, leaderboard, run_score
from .published import published_notes
from .runs import Run, RunSet, find_runs
from .tasks import TaskMetric, find_spec, resolve_metric, spec_baseline, task_order, task_title

RUNS_TABLE = "runs.csv"
TABLES = ("best_scores.csv", "last_scores.csv", "best_ranks.csv", "last_ranks.csv", "aup_scores.csv")
SUMMARY = "summary.md"
PLOT = "performance_profiles.png"
INSTALL_HINT = "pip install 'mlgym-registry[report]' (or pip install matplotlib)"
DIGITS = 3


class ReportError(MLGymRegistryError, ValueError):
    """Nothing to report on: no runs, or none of the runs' tasks can be ranked."""


@dataclass
class RunStatus:
    """A run as the report sees it, against its task's ranking metric."""

    run: Run
    score: tuple[float, float] | None
    problem: str | None
    """Why the run has no score (None when it has one)."""
    excluded: bool = False
    """True when the run has problems and its score is left out of the tables (no ``include_failed``)."""


@dataclass
class Report:
    """What ``build_report`` found and computed."""

    folders: list[str]
    found: RunSet
    metrics: dict[str, TaskMetric]
    board: Leaderboard
    statuses: list[RunStatus]
    unranked: dict[str, str] = field(default_factory=dict)
    left_out: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    include_failed: bool = False
    unknown_models: list[str] = field(default_factory=list)
    """Names asked for (``models``) that no run has: left out of the tables, with a warning."""
    context: Context | None = None
    """Spread over runs, the starter code's noise band and warnings (``context.build_context``)."""

    @property
    def failed(self) -> list[RunStatus]:
        """Runs with problems (``Run.problems``): left out of the tables unless ``include_failed``."""
        return [s for s in self.statuses if s.run.problems]

    @property
    def incomplete(self) -> list[RunStatus]:
        """Runs without a score: no ``results.json``, an unreadable one, or no attempt reporting the metric."""
        return [s for s in self.statuses if s.score is None]


def build_report(
    folders: Sequence[str | Path],
    models: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
    metric_choices: Mapping[str, tuple[str, bool | None]] | None = None,
    include_failed: bool = False,
    noise_band: bool = False,
) -> Report:
    """Read the runs under ``folders`` and compute MLGym's leaderboard over them.

    ``models``: the model columns, in this order (default: every model found, sorted); ``tasks``: only these tasks;
    ``metric_choices``: task -> (metric, higher is better or None) overriding the task's own ranking metric;
    ``include_failed``: score runs with problems too; ``noise_band``: score the starter code under the runs' seeds
    (it runs each task's evaluator once per seed). ``ReportError`` when there are no runs to report on.
    """
    found = find_runs(folders)
    placement_notes = placement_warnings(found.runs)
    found.runs = [run for run in found.runs if run.replay_of is None]
    where = ", ".join(str(f) for f in folders)
    if not found.runs:
        raise ReportError(
            f"no runs found in {where}: a run is a folder holding results.json and <task>.traj (MLGym's layout, "
            f"as bench writes it), or <task>/<model>_run<k>.traj beside <model>_run<k>.results.json"
        )
    chosen_models = list(dict.fromkeys(models)) if models else sorted({r.model for r in found.runs})
    unknown = unknown_model_names(models, found.runs)
    chosen_models = [name for name in chosen_models if name not in unknown]
    wanted_tasks = set(tasks) if tasks else None
    kept = [r for r in found.runs if r.model in chosen_models and (wanted_tasks is None or r.task in wanted_tasks)]
    kept_ids = {id(r) for r in kept}
    left_out = [r for r in found.runs if id(r) not in kept_ids]
    if not kept:
        raise ReportError(
            f"none of the {len(found.runs)} runs found in {where} is of the models/tasks asked for "
            f"(models found: {', '.join(sorted({r.model for r in found.runs}))}; "
            f"tasks found: {', '.join(sorted({r.task for r in found.runs}))})"
        )
    chosen_models = name_by_settings(kept, chosen_models)
    by_task: dict[str, list[Run]] = {}
    for run in kept:
        by_task.setdefault(run.task, []).append(run)
    metrics: dict[str, TaskMetric] = {}
    unranked: dict[str, str] = {}
    results: list[TaskResult] = []
    statuses: list[RunStatus] = []
    notes: list[str] = [f"no runs of task {task!r}, which was asked for" for task in tasks or () if task not in by_task]
    notes += placement_notes
    for task in task_order(by_task):
        runs = by_task[task]
        spec = find_spec(task)
        choice = (metric_choices or {}).get(task)
        attempts = [attempt for run in runs for attempt in run.attempts]
        metric = resolve_metric(task, spec, (a.keys() for a in attempts), choice)
        if metric is None:
            names = sorted({name for attempt in attempts for name in attempt})
            unranked[task] = (
                f"no ranking metric known for {task!r} (its runs report {', '.join(names) or 'no metrics'}); "
                f"name one with --metric {task}=METRIC[:max|:min]"
            )
            continue
        metrics[task] = metric
        per_model: dict[str, list[tuple[float, float]]] = {}
        for run in runs:
            status = _status(run, metric)
            status.excluded = bool(run.problems) and not include_failed and status.score is not None
            statuses.append(status)
            if status.score is not None and not status.excluded:
                per_model.setdefault(run.model, []).append(status.score)
        baseline, note = _baseline(runs, metric, spec, chosen_models)
        if note:
            notes.append(note)
        results.append(TaskResult(task, task_title(task), metric.higher_is_better, baseline, per_model))
    if not results:
        unreadable = [f"{bad.path} {bad.reason}" for bad in found.bad_files]  # often why: name them in the one line
        raise ReportError("no task could be ranked: " + "; ".join([*unranked.values(), *unreadable]))
    board = leaderboard(results, chosen_models)
    notes += mlgym_rule_notes(folders, board, statuses)
    report = Report([str(f) for f in folders], found, metrics, board, statuses, unranked, left_out, notes,
                    include_failed, unknown)
    report.context = build_context(report, noise_band=noise_band)
    report.context.warnings[:0] = [unknown_model_warning(name, found.runs) for name in unknown]
    return report


def placement_warnings(runs: Sequence[Run]) -> list[str]:
    """Notes on runs the report leaves out or cannot place: replays (they replay a model's run, they are not one)
    and folders whose name says no model and whose run records none (named after the folder)."""
    notes = []
    replays = [run.label for run in runs if run.replay_of is not None]
    if replays:
        notes.append(f"left out {len(replays)} replay(s) of recorded runs (not a model's own runs): "
                     + ", ".join(replays[:5]) + (" ..." if len(replays) > 5 else ""))
    for run in runs:
        if run.named_by_folder and run.replay_of is None:
            notes.append(f"{run.label}: neither its folder name (<model>__<task>__...) nor its results.json says "
                         f"which model played it; it is reported as model {run.model!r}")
    return notes


def unknown_model_names(models: Sequence[str] | None, runs: Sequence[Run]) -> list[str]:
    """The names of ``models`` that no run has (a typo must not add an empty column)."""
    from .context import unknown_models

    return unknown_models(models, (run.model for run in runs))


def unknown_model_warning(name: str, runs: Sequence[Run]) -> str:
    """``--models NAME`` matched no run: say so, with the models found."""
    return (f"--models {name}: no run of this model; it is left out (models found: "
            f"{', '.join(sorted({run.model for run in runs}))})")


def mlgym_rule_notes(folders: Sequence[str | Path], board: Leaderboard, statuses: Sequence[RunStatus]) -> list[str]:
    """Where the report departs from MLGym's own tables: the scores it leaves out (MLGym counts every run's score,
    whatever its exit status or usage) and, for runs inside an MLGym checkout, the published cells it does not
    reproduce (``published.published_notes``)."""
    titles = {task.task: task.title for task in board.tasks}
    left = [s for s in statuses if s.excluded]
    notes = []
    if left:
        notes.append(
            f"{len(left)} runs with a score are left out for their problems "
            f"({_counts(f'{s.run.model}/{s.run.task}' for s in left)}); MLGym's own tables count every run's score "
            f"whatever its exit status or usage, as --include-failed does"
        )
    left_out = {(s.run.model, titles.get(s.run.task, s.run.task)) for s in left}
    return notes + published_notes(folders, board, left_out)


def name_by_settings(runs: Sequence[Run], models: Sequence[str]) -> list[str]:
    """Rename the runs of a model recorded with several settings ``model[key=value,...]`` (the keys that differ;
    ``model[no settings]`` for runs without a record) and return ``models`` with each such model replaced by its
    names, sorted."""
    from .settings import flat

    groups: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        key = json.dumps(run.settings, sort_keys=True) if run.settings is not None else ""
        groups.setdefault(run.model, {}).setdefault(key, []).append(run)
    names: dict[str, list[str]] = {}
    for model, by_key in groups.items():
        if len(by_key) < 2:
            continue
        flats = {key: flat(json.loads(key)) if key else {} for key in by_key}
        differing = sorted({name for f in flats.values() for name in f
                            if len({json.dumps(g.get(name), sort_keys=True) for k, g in flats.items() if k}) > 1})
        for key, group in by_key.items():
            label = ",".join(f"{name}={_setting(flats[key].get(name))}" for name in differing) if key else ""
            name = f"{model}[{label or 'no settings'}]"
            names.setdefault(model, []).append(name)
            for run in group:
                run.model = name
    return [name for model in models for name in sorted(names.get(model, [model]))]


def _setting(value: object) -> str:
    if value is None:
        return "unset"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _status(run: Run, metric: TaskMetric) -> RunStatus:
    if run.results_path is None:
        return RunStatus(run, None, "no results.json")
    if run.results is None:
        return RunStatus(run, None, f"results.json {run.unreadable}")
    score = run_score(run.attempts, metric.metric, metric.higher_is_better)
    if score is None:
        attempts = run.attempts
        why = "no agent score" if not attempts else f"no attempt reports {metric.metric!r}"
        return RunStatus(run, None, why)
    return RunStatus(run, score, None)


def _baseline(
    runs: Sequence[Run], metric: TaskMetric, spec: object | None, models: Sequence[str] = ()
) -> tuple[Score, str | None]:
    """The baseline of the first run that records one for the metric, else the spec's. Runs are taken as MLGym's
    ``get_ranks.py`` takes them: model by model in column order (``models``), each model's folders in path order;
    any run counts, scored or not."""
    column = {model: index for index, model in enumerate(models)}
    ordered = sorted(runs, key=lambda r: (column.get(r.model, len(column)), r.label))
    values = [run.baseline[metric.metric] for run in ordered if metric.metric in run.baseline]
    if values:
        distinct = sorted(set(values))
        note = None
        if len(distinct) > 1:
            note = (
                f"{metric.task}: runs record {len(distinct)} different baselines for {metric.metric!r} "
                f"({_number(distinct[0])} .. {_number(distinct[-1])}); the first run's (by model column, then folder, "
                f"as MLGym takes it), {_number(values[0])}, is used"
            )
        return values[0], note
    from_spec = spec_baseline(spec).get(metric.metric)
    if isinstance(from_spec, (int, float)) and not isinstance(from_spec, bool):
        return float(from_spec), None
    return None, None


# -- writing ---------------------------------------------------------------------------------------------------------


def _number(value: Score) -> str:
    """A score as MLGym's tables show it: rounded to 3 decimals, empty when missing."""
    return "" if value is None else repr(round(float(value), DIGITS))


def table_rows(board: Leaderboard) -> dict[str, list[list[str]]]:
    """The five CSV tables (header row first) by file name."""
    tables: dict[str, list[list[str]]] = {}
    for name, scores in (("best_scores.csv", board.best), ("last_scores.csv", board.last)):
        rows = [["Task", *board.columns]]
        rows += [[t.title, *(_number(scores[t.task][c]) for c in board.columns)] for t in board.tasks]
        tables[name] = rows
    width = len(board.columns)
    for name, ranks, overall in (
        ("best_ranks.csv", board.best_ranks, board.best_overall),
        ("last_ranks.csv", board.last_ranks, board.last_overall),
    ):
        rows = [["Rank", *(str(i) for i in range(1, width + 1))]]
        rows += [[t.title, *ranks[t.task]] for t in board.tasks]
        rows += [[label, *overall[label]] for label in (MEAN_RANK, BORDA) if overall[label]]
        tables[name] = rows
    tables["aup_scores.csv"] = [["Model", "Best AUP", "Last AUP"]] + [
        [name, _number(board.aup[name][0]), _number(board.aup[name][1])] for name in board.solvers
    ]
    return tables


def run_rows(report: Report) -> list[list[str]]:
    """``runs.csv``: one row per reported run, with whether its score counts and why not."""
    rows = [["Model", "Task", "Run", "Exit status", "Best", "Last", "API calls", "Tokens sent", "Tokens received",
             "Cost", "Counted", "Problems"]]
    for status in report.statuses:
        run, stats = status.run, status.run.model_stats or {}
        best, last = status.score if status.score is not None else (None, None)
        counted = "no score" if status.score is None else "excluded" if status.excluded else "yes"
        rows.append([run.model, run.task, Path(run.label).name, run.exit_status or "", _number(best), _number(last),
                     *(str(stats.get(key, "")) for key in ("api_calls", "tokens_sent", "tokens_received")),
                     str(stats.get("task_cost", "")), counted, "; ".join(run.problems)])
    return rows


def write_report(report: Report, out: str | Path, plot: bool = True) -> list[Path]:
    """Write the tables, the summary and (when ``plot`` and matplotlib allow) the plot into ``out``; the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    tables = table_rows(report.board)
    extra = context_tables(report)
    for name, rows in {**tables, RUNS_TABLE: run_rows(report), **extra}.items():
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(rows)
        (out / name).write_text(buffer.getvalue(), encoding="utf-8")
        written.append(out / name)
    plot_note = None
    if plot:
        try:
            written.append(plot_profiles(report.board, out / PLOT))
        except ImportError:
            plot_note = f"The performance-profile plot needs matplotlib, which is not installed: {INSTALL_HINT}."
    summary = summary_markdown(report, tables, plot_note, plotted=(out / PLOT) in written)
    summary += "\n".join(context_sections(report, extra)) + "\n"
    (out / SUMMARY).write_text(summary, "utf-8")
    written.append(out / SUMMARY)
    return written


def context_tables(report: Report) -> dict[str, list[list[str]]]:
    """``accounting.csv``, and ``spread.csv`` and ``noise_band.csv`` when the report has its context."""
    tables = {ACCOUNTING_TABLE: accounting_rows(accounting((s.run for s in report.statuses), report.board.models))}
    if report.context is not None:
        tables[SPREAD_TABLE] = spread_rows(report.context)
        tables[NOISE_TABLE] = noise_rows(report.context)
    return tables


def context_sections(report: Report, tables: Mapping[str, list[list[str]]]) -> list[str]:
    """The summary's sections after the others: accounting, spread, noise band, warnings."""
    table = accounting((s.run for s in report.statuses), report.board.models)
    lines = ["", "## Accounting", "", f"`{ACCOUNTING_TABLE}`: what each model's runs used (every run reported, "
             "counted or not).", ""]
    lines += _md_table(tables[ACCOUNTING_TABLE]) + [""]
    notes = accounting_markdown(table)
    lines += notes + ([""] if notes else [])
    if report.context is not None:
        lines += context_markdown(report.context, tables[SPREAD_TABLE], tables[NOISE_TABLE], _md_table)
    return lines


def plot_profiles(board: Leaderboard, path: Path) -> Path:
    """Draw the best-attempt and last-submission profiles side by side into a PNG; ``ImportError`` without
    matplotlib."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(11, 4.5))
    figure.subplots_adjust(left=0.07, right=0.99, bottom=0.12, top=0.92, wspace=0.12)
    axes = figure.subplots(1, 2, sharey=True)
    palette = colormaps["tab10" if len(board.models) <= 10 else "tab20"]
    styles = {name: {"color": palette(index % palette.N)} for index, name in enumerate(board.models)}
    styles[BASELINE] = {"color": "black", "linestyle": "--"}
    for ax, profiles, title in (
        (axes[0], board.best_profiles, "Best attempt"),
        (axes[1], board.last_profiles, "Last submission"),
    ):
        for name in board.solvers:
            ax.step(board.taus, profiles[name], where="post", label=name, linewidth=1.4, **styles[name])
        count = len(board.tasks)
        ax.set_title(f"{title} ({count} task{'' if count == 1 else 's'})")
        ax.set_xlabel("τ (log10 of the performance ratio)")
        ax.set_xlim(0, float(board.taus[-1]))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, prune="upper"))  # the panels' end labels would collide
        ax.set_ylim(-0.04, 1.08)  # a profile that reaches 1.0 is drawn inside the frame, not on it
        ax.grid(True, linestyle=":", alpha=0.6)
    axes[0].set_ylabel("share of tasks with ratio ≤ 10^τ")
    axes[1].legend(loc="lower right", fontsize="small")
    figure.savefig(path, dpi=120)
    return path


def _md_table(rows: Sequence[Sequence[str]]) -> list[str]:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows[1:]]
    return lines


def _counts(items: Iterable[str]) -> str:
    ordered = sorted(Counter(items).items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {count}" for name, count in ordered)


def _exit_status(run: Run) -> str:
    if run.traj_path is None:
        return "no .traj"
    return run.exit_status or "none recorded"


def _counted(status: RunStatus) -> bool:
    return status.score is not None and not status.excluded


def summary_markdown(
    report: Report, tables: Mapping[str, Sequence[Sequence[str]]], plot_note: str | None, plotted: bool
) -> str:
    """The Markdown summary: sources, how tasks are ranked, run counts, the tables and every run left unscored."""
    board = report.board
    statuses = report.statuses
    lines = ["# Leaderboard report", ""]
    lines.append(
        f"{len(report.found.runs)} runs read from {', '.join(f'`{f}`' for f in report.folders)}: "
        f"{len(statuses)} reported here ({sum(s.score is not None for s in statuses)} with a score), "
        f"{len(board.models)} models, {len(board.tasks)} tasks."
    )
    excluded = sum(s.excluded for s in statuses)
    if report.failed:
        lines.append(
            f"{len(report.failed)} runs have problems (failed, no answer, empty answers or no usage)"
            + (f": {excluded} scores left out of the tables." if excluded else ", counted (--include-failed).")
        )
    lines.append(f"`{RUNS_TABLE}` lists every run, its usage and whether its score counts.")
    if report.left_out:
        lines.append(
            f"{len(report.left_out)} runs are of models or tasks not asked for and left out: "
            f"{_counts(f'{r.model}/{r.task}' for r in report.left_out)}."
        )
    lines.append("")
    lines += ["## How tasks are ranked", ""]
    rows = [["Task", "Row", "Metric", "Better", "Chosen by", "Baseline", "Runs"]]
    for task in board.tasks:
        metric = report.metrics[task.task]
        runs = sum(1 for s in statuses if s.run.task == task.task)
        rows.append([task.task, task.title, metric.metric, metric.direction, metric.source, _number(task.baseline),
                     str(runs)])
    lines += _md_table(rows) + [""]
    lines += [
        "Best: the best score of any attempt (validate or submission) over a model's runs. Last: the best over its "
        "runs of each run's last attempt (its submission). Ranks put the columns without a score last, in column "
        "order. AUP: area under the performance profile (MLGym's rules; see the `mlgym_registry.evaluation.metrics` "
        "docstring).",
        "",
    ]
    for note in report.notes:
        lines.append(f"- Note: {note}")
    for why in report.unranked.values():
        lines.append(f"- Not ranked: {why}")
    if report.notes or report.unranked:
        lines.append("")

    counted = "Runs with a counted score / runs found" + (
        "." if report.include_failed else " (runs with problems are not counted: see Failed runs below).")
    lines += ["## Runs per model and task", "", counted, ""]
    rows = [["Model", *(t.title for t in board.tasks), "Total", "Failed", "Without a score"]]
    for model in board.models:
        mine = [s for s in statuses if s.run.model == model]
        cells = []
        for task in board.tasks:
            these = [s for s in mine if s.run.task == task.task]
            cells.append(f"{sum(_counted(s) for s in these)}/{len(these)}")
        total = f"{sum(_counted(s) for s in mine)}/{len(mine)}"
        failed = sum(1 for s in mine if s.run.problems)
        rows.append([model, *cells, total, str(failed), str(sum(s.score is None for s in mine))])
    lines += _md_table(rows) + [""]
    if any(s.run.exit_status for s in statuses):
        lines += ["Exit status of the runs (each `.traj`'s `info.exit_status`):", ""]
        rows = [["Model", "Exit statuses"]]
        for model in board.models:
            mine = [_exit_status(s.run) for s in statuses if s.run.model == model]
            if mine:
                rows.append([model, _counts(mine)])
        lines += _md_table(rows) + [""]

    titles = {
        "best_scores.csv": "Best attempt scores",
        "last_scores.csv": "Last submission scores",
        "best_ranks.csv": "Ranks by best attempt",
        "last_ranks.csv": "Ranks by last submission",
        "aup_scores.csv": "AUP (area under the performance profile)",
    }
    for name, title in titles.items():
        lines += [f"## {title}", "", f"`{name}`", ""] + _md_table(tables[name]) + [""]
    lines += ["## Performance profiles", ""]
    if plotted:
        lines += [f"![performance profiles]({PLOT})", ""]
    elif plot_note:
        lines += [plot_note, ""]
    else:
        lines += ["Not drawn (--no-plot).", ""]

    lines += ["## Failed runs", ""]
    if report.failed:
        fate = ("the scores they reached still count (--include-failed)" if report.include_failed
                else "their scores are left out of every table (--include-failed counts them)")
        lines += [f"{len(report.failed)} runs failed, got no answer, empty answers or answers without usage; {fate}. "
                  f"Per model: {_counts(s.run.model for s in report.failed)}.", ""]
        lines += [f"- `{s.run.label}` ({s.run.model}, {s.run.task}): {'; '.join(s.run.problems)}"
                  + (f" ({s.problem})" if s.problem else "") for s in report.failed]
    else:
        lines.append("None.")
    lines += ["", "## Runs without a score", ""]
    if report.incomplete:
        lines += [f"- `{s.run.label}` ({s.run.model}, {s.run.task}): {s.problem}"
                  + (f"; exit status {s.run.exit_status}" if s.run.exit_status else "")
                  for s in report.incomplete]
    else:
        lines.append("None.")
    lines += ["", "## Unreadable files", ""]
    if report.found.bad_files:
        lines += [f"- `{bad.path}`: {bad.reason}" for bad in report.found.bad_files]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"
