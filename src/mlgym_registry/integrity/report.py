"""The audit's table for a terminal, and the audit results kept per task for ``list`` and ``info`` to show."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

RESULTS_FOLDER = "integrity"
"""Under the package's cache folder: the last audit of each task, ``<task>.json``."""


def _number(value: float | None) -> str:
    if value is None or not isinstance(value, (int, float)):
        return "-"
    return "inf" if math.isinf(value) else f"{value:.4g}"


def render_table(report: Any) -> str:
    """One row per canary: name, what it tries, its reward under each reward name, the limit, the verdict."""
    names = report.rewards
    header = ["canary", "tries", *names, "limit", "verdict"]
    rows = []
    for result in report.results:
        limit = ", ".join(f"{_number(result.limits.get(n))}" for n in names) if result.limits else "-"
        rows.append([result.canary.name, _short(result.canary.tries, 58),
                     *(_number(result.rewards.get(n)) for n in names),
                     f"{result.canary.bound} {limit}" if result.canary.family != "reference" else "-",
                     result.verdict])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [f"integrity audit of {report.task} ({report.task_hash[:19]}), {len(report.results)} canaries in "
             f"{report.seconds:.0f} s",
             "honest reference: " + ", ".join(f"{n} {_number(report.honest.get(n))}" for n in names)
             + "; floor (a failed evaluation): " + ", ".join(f"{n} {_number(report.floor.get(n))}" for n in names),
             "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for result in report.results:
        if result.detail:
            lines.append(f"  {result.canary.name}: {result.detail}")
    lines += [f"  note: {note}" for note in report.notes]
    gap = ", ".join(f"{n} {_number(v)}" for n, v in report.gap.items())
    cost = report.seconds / max(1, len(report.results))
    lines.append(f"gameability gap: {gap}; {cost:.1f} s per canary")
    failed = report.failures
    lines.append("OK: no canary beat honesty" if not failed else
                 f"FAILED: {', '.join(f'{r.canary.name} ({r.verdict})' for r in failed)}")
    return "\n".join(lines)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def results_folder() -> Path:
    from ..tasks.suite import cache_dir

    return cache_dir() / RESULTS_FOLDER


def save_result(report: Any) -> Path:
    """Keep ``report`` as the task's last audit (what ``list`` and ``info`` show)."""
    folder = results_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_file_name(report.name or report.task)}.json"
    summary = {"task": report.task, "task_hash": report.task_hash, "ok": report.ok, "gap": report.gap,
               "failures": [f"{r.canary.name} ({r.verdict})" for r in report.failures]}
    path.write_text(json.dumps(summary, indent=2))
    return path


def has_result(task: str) -> bool:
    """Whether an audit of the task named ``task`` was kept (of any version of it)."""
    return (results_folder() / f"{_file_name(task)}.json").is_file()


def last_result(spec: Any) -> dict[str, Any] | None:
    """The last audit of the task ``spec``, when it audited the task as it is now (same task hash); else None."""
    from ..records.provenance import task_hash

    path = results_folder() / f"{_file_name(str(spec.registered_as or spec.id))}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("task_hash") == task_hash(spec) else None


def integrity_status(spec: Any) -> str:
    """``ok``, ``FAILED (...)`` or ``not audited``: the task's last integrity audit, for the task as it is now."""
    result = last_result(spec)
    if result is None:
        return "not audited"
    if result.get("ok"):
        return "ok"
    return f"FAILED ({', '.join(result.get('failures') or [])})"


def _file_name(task: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task)
