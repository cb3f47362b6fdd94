"""What the runs of each model cost: calls, retries, tokens, dollars, time waiting for the model, and wall time.

The numbers come from each run's ``.traj`` (``info.model_stats``, the policy's usage) and, for runs ``bench`` made,
from the run's ``settings.json`` (``wall_seconds``). Answers that came without ``usage`` have unknown tokens and
cost: they are counted (``missing_usage``), and a model with any has its cost marked as a lower bound. Runs whose
files record no usage at all (a scripted policy, MLGym's own runs without ``model_stats``) are counted apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runs import RESULTS, Run

ACCOUNTING_TABLE = "accounting.csv"
SUMMED = ("api_calls", "api_retries", "tokens_sent", "tokens_received", "task_cost", "model_seconds",
          "truncated_responses", "empty_responses", "missing_usage")
"""The ``model_stats`` keys that add up over a model's runs."""


@dataclass
class Accounting:
    """The usage of one model's runs (every run reported, counted or not: a failed run was paid for too)."""

    model: str
    runs: int = 0
    runs_without_usage: int = 0
    """Runs whose files record no usage (their policy keeps none, or they predate it)."""
    runs_missing_usage: int = 0
    """Runs with answers that came without ``usage``."""
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUMMED, 0))
    max_call_seconds: float | None = None
    wall_seconds: float | None = None
    """The sum of the runs' wall times, over the runs that record one (None when none does)."""

    @property
    def cost_known(self) -> bool:
        """False when some answers had no usage: the cost is then a lower bound."""
        return not self.totals["missing_usage"]

    @property
    def seconds_per_call(self) -> float | None:
        """Mean seconds waiting for the model per call (None without calls)."""
        calls = self.totals["api_calls"]
        return self.totals["model_seconds"] / calls if calls else None

    def add(self, run: Run) -> None:
        """Count ``run`` in."""
        self.runs += 1
        wall = run_wall_seconds(run)
        if wall is not None:
            self.wall_seconds = (self.wall_seconds or 0.0) + wall
        stats = run.model_stats
        if not isinstance(stats, dict) or "api_calls" not in stats:
            self.runs_without_usage += 1
            return
        for key in SUMMED:
            if _is_number(stats.get(key)):
                self.totals[key] += stats[key]
        self.runs_missing_usage += bool(stats.get("missing_usage"))
        longest = stats.get("max_call_seconds")
        if _is_number(longest):
            self.max_call_seconds = max(self.max_call_seconds or 0.0, float(longest))


def accounting(runs: Iterable[Run], models: Sequence[str]) -> list[Accounting]:
    """One ``Accounting`` per model of ``models`` (in that order), over ``runs``."""
    table = {model: Accounting(model) for model in models}
    for run in runs:
        if run.model in table:
            table[run.model].add(run)
    return list(table.values())


def run_wall_seconds(run: Run) -> float | None:
    """The run's wall time as ``bench`` recorded it in the run's ``settings.json``; None when not recorded."""
    from .settings import SETTINGS, read

    if run.results_path is None or run.results_path.name != RESULTS:
        return None
    record = read(Path(run.results_path).parent / SETTINGS) or {}
    seconds = record.get("wall_seconds")
    return float(seconds) if _is_number(seconds) else None


HEADER = ["Model", "Runs", "API calls", "Retries", "Tokens sent", "Tokens received", "Cost (USD)", "Cost complete",
          "Model seconds", "Seconds per call", "Longest call (s)", "Wall seconds", "Truncated answers",
          "Empty answers", "Answers without usage", "Runs without usage records"]


def accounting_rows(table: Sequence[Accounting]) -> list[list[str]]:
    """``accounting.csv``: a header, then a row per model."""
    rows = [list(HEADER)]
    for entry in table:
        totals = entry.totals
        rows.append([
            entry.model, str(entry.runs), *(str(int(totals[key])) for key in ("api_calls", "api_retries",
                                                                               "tokens_sent", "tokens_received")),
            f"{totals['task_cost']:.6f}", "yes" if entry.cost_known else "no (lower bound)",
            f"{totals['model_seconds']:.2f}", _seconds(entry.seconds_per_call), _seconds(entry.max_call_seconds),
            _seconds(entry.wall_seconds), *(str(int(totals[key])) for key in ("truncated_responses", "empty_responses",
                                                                               "missing_usage")),
            str(entry.runs_without_usage),
        ])
    return rows


def accounting_markdown(table: Sequence[Accounting]) -> list[str]:
    """The summary's paragraph under its table (the table itself is ``accounting_rows``)."""
    lines = []
    for entry in table:
        if not entry.cost_known:
            lines.append(f"- {entry.model}: {int(entry.totals['missing_usage'])} answers (in "
                         f"{entry.runs_missing_usage} runs) came without usage; their tokens and cost are unknown, "
                         f"so its cost is a lower bound.")
        if entry.runs_without_usage:
            lines.append(f"- {entry.model}: {entry.runs_without_usage} of {entry.runs} runs record no usage.")
    return lines


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
