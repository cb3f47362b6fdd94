"""Audit every task of our suite (and each MLGym task an MLGym checkout at $MLGYM_ROOT provides) and print the
integrity table that docs/tasks.md publishes; ``--write`` puts it in docs/tasks.md between its markers.

    python bench/integrity_table.py [--write] [TASK ...]

Each row is one task's audit (``mlgym_registry.integrity.audit``, every canary, under mlgym_best_improvement, every
task's default, and mlgym_score_delta, the reference chain's reward): how many canaries ran, which failed, the
gameability gap under each reward and what the audit cost per canary on this machine.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "tasks.md"
START, END = "<!-- integrity-table:start -->", "<!-- integrity-table:end -->"
REWARDS = ("mlgym_best_improvement", "mlgym_score_delta")
"""The rewards every task is judged under: every task's default, and the reference chain's."""


def task_names(asked: list[str]) -> list[str]:
    from mlgym_registry import registry
    from mlgym_registry.evaluation.baselines import suite_task_names

    if asked:
        return asked
    names = suite_task_names()
    if os.environ.get("MLGYM_ROOT"):
        names += [name for name in registry.names("task") if name.startswith("mlgym/")]
    return names


def table(reports: list, skipped: dict[str, str] | None = None) -> str:
    lines = [f"| Task | Canaries | Failed | Gap, {REWARDS[0]} | Gap, {REWARDS[1]} (the reference's) | Randomness | "
             "Per canary |", "|---|---|---|---|---|---|---|"]
    for report in reports:
        failed = ", ".join(f"{r.canary.name} ({r.verdict})" for r in report.failures) or "none"
        per = report.seconds / max(1, len(report.results))
        best, reference = (report.gap.get(reward, 0.0) for reward in REWARDS)
        lines.append(f"| {report.name or report.task} | {len(report.results)} | {failed} | {best:.3g} | "
                     f"{reference:.3g} | {randomness(report)} | {per:.1f} s |")
    lines += [f"| {name} | - | not audited: {why} | - | - | - | - |"
              for name, why in (skipped or {}).items()]
    return "\n".join(lines)


def still_needed(name: str, refusal: Exception) -> str:
    """Why a task does not run here, in a few words: what ``prepare`` would still need (the local backend's
    blockers: packages, data, devices, models), else the refusal's first clause."""
    from mlgym_registry import registry
    from mlgym_registry.backends.local.task_checks import blockers

    try:
        kinds = list(dict.fromkeys(blocker.kind for blocker in blockers(registry.spec(name))))
    except Exception:  # noqa: BLE001 - a task file that does not even load
        kinds = []
    if kinds:
        return f"needs {', '.join(kinds)} (`mlgym-registry prepare {name}` says what)"
    return str(refusal).split("; ")[0].split(" (")[0].replace(os.environ.get("MLGYM_ROOT", "\0"), "$MLGYM_ROOT")


def randomness(report) -> str:
    """Where the evaluator's randomness came from, as the references' traces said."""
    said = report.randomness
    if said.get("fixed_seeds"):
        return "fixed seed: " + "; ".join(said["fixed_seeds"])
    if said.get("unfollowed"):
        return "does not follow the seed: " + "; ".join(said["unfollowed"][:2])
    used = said.get("followed") or []
    return f"follows the seed ({', '.join(used)})" if used else "none drawn"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*", metavar="TASK")
    parser.add_argument("--write", action="store_true", help="replace the table in docs/tasks.md")
    args = parser.parse_args(argv)
    from mlgym_registry.errors import MLGymRegistryError
    from mlgym_registry.integrity import audit

    reports, skipped = [], {}
    for name in task_names(args.tasks):
        try:
            report = audit(name, rewards=list(REWARDS))
        except MLGymRegistryError as exc:  # a task this machine cannot run (its data, packages or devices)
            if not name.startswith("mlgym/") or args.tasks:
                raise
            skipped[name] = still_needed(name, exc)
            print(f"{name}: not run here: {exc}", flush=True)
            continue
        print(f"{name}: {'ok' if report.ok else 'FAILED'}, gap {report.gap}, {report.seconds:.0f} s", flush=True)
        reports.append(report)
    text = table(reports, skipped)
    print(text)
    if args.write:
        page = DOCS.read_text()
        if START not in page or END not in page:
            raise SystemExit(f"{DOCS} has no {START} ... {END} markers")
        page = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: f"{START}\n{text}\n{END}", page,
                      flags=re.S)
        DOCS.write_text(page)
    return 0 if all(report.ok for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
