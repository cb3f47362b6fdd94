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
        if result.fix:
            lines.append(f"    fix: {result.fix}")
        if result.exploit:
            lines.append(f"    exploit: {replay_command(report, result)}")
    lines += [f"  note: {note}" for note in report.notes]
    gap = ", ".join(f"{n} {_number(v)}" for n, v in report.gap.items())
    cost = report.seconds / max(1, len(report.results))
    lines.append(f"gameability gap: {gap}; {cost:.1f} s per canary")
    failed = report.failures
    lines.append("OK: no canary beat honesty" if not failed else
                 f"FAILED: {', '.join(f'{r.canary.name} ({r.verdict})' for r in failed)}")
    return "\n".join(lines)


def replay_command(report: Any, result: Any) -> str:
    """The command that plays a failure's recorded exploit again on the audited task."""
    import shlex

    return f"mlgym-registry replay {shlex.quote(result.exploit)} --task {shlex.quote(report.name or report.task)}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def results_folder() -> Path:
    from ..tasks.suite import cache_dir

    return cache_dir() / RESULTS_FOLDER


CARD_VERSION = 1
"""The version of the integrity card's layout (``integrity_card``); a new key keeps it, a changed meaning raises it."""
AUDIT_VERSION = 3
"""The version of the audit's method (its canaries and how it judges them): a card of an older audit was made by a
weaker method. 2: traces of what the evaluator trusts and metamorphic canaries; 3: the randomness references (another
seed, the band) and an exploit recorded per failure."""


def integrity_card(report: Any) -> dict[str, Any]:
    """The task's integrity card: what was audited (the task's hash, the package's, the audit's and the card's
    versions), every canary run with its verdict and episode rewards, the honest reference, its band and the floor
    per reward, the gap, where the evaluator's randomness came from, and the failures with their details and fixes.
    Its ``reward`` and ``capabilities`` keys use the words of OpenEnv's manifest (``reward.floor_margin``: how far the
    honest reference lies above the floor; ``capabilities.canaries``: the canaries the task was audited with)."""
    from .._version import __version__

    failures = [f"{r.canary.name} ({r.verdict})" for r in report.failures]
    return {
        "card_version": CARD_VERSION,
        "task": report.task,
        "name": report.name or report.task,
        "task_hash": report.task_hash,
        "package_version": __version__,
        "audit_version": AUDIT_VERSION,
        "ok": report.ok,
        "verdict": "ok" if report.ok else f"FAILED ({', '.join(failures)})",
        "failures": failures,
        "exploits": [{"canary": r.canary.name, "verdict": r.verdict, "fix": r.fix, "scores": r.scores,
                      "exploit": r.exploit,
                      **({"replay": replay_command(report, r)} if r.exploit else {})} for r in report.failures],
        "reward": {
            "audited": list(report.rewards),
            "honest": dict(report.honest),
            "floor": dict(report.floor),
            "floor_margin": {name: report.honest[name] - report.floor[name] for name in report.rewards
                             if name in report.honest and name in report.floor},
            "gap": dict(report.gap),
            "band": {name: list(band) for name, band in report.band.items()},
        },
        "randomness": dict(report.randomness),
        "capabilities": {"canaries": [r.canary.name for r in report.results]},
        "canaries": [{"name": r.canary.name, "family": r.canary.family, "source": r.canary.source,
                      "bound": r.canary.bound, "verdict": r.verdict, "rewards": dict(r.rewards),
                      **({"detail": r.detail} if r.detail else {})} for r in report.results],
        "notes": list(report.notes),
        "seconds": round(report.seconds, 1),
    }


def exploits_folder(task: str) -> Path:
    """Where ``check --integrity`` keeps the recorded exploits of the task named ``task`` (its last audit's)."""
    return results_folder() / f"{_file_name(task)}.exploits"


def save_result(report: Any) -> Path:
    """Keep ``report``'s integrity card (``integrity_card``) as the task's last audit (what ``list`` and ``info``
    show); its path."""
    folder = results_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_file_name(report.name or report.task)}.json"
    path.write_text(json.dumps(integrity_card(report), indent=2, default=_json_number))
    return path


def _json_number(value: Any) -> Any:
    return str(value)


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


def card_summary(spec: Any) -> dict[str, Any] | None:
    """What ``info`` shows of the task's integrity card (the last audit of the task as it is now): its verdict, what
    was audited and the rewards' honest reference, floor, margin and gap, and where the whole card is; None when
    the task as it is now was not audited."""
    card = last_result(spec)
    if card is None:
        return None
    keep = ("verdict", "task_hash", "package_version", "card_version", "reward")
    return {**{key: card[key] for key in keep if key in card},
            "canaries": len((card.get("capabilities") or {}).get("canaries") or []),
            "card": str(results_folder() / f"{_file_name(str(spec.registered_as or spec.id))}.json")}


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
