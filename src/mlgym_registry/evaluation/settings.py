"""The settings record of a suite and of each of its runs (``settings.json``), and the resume check built on it.

A suite folder holds ``settings.json`` (what ``bench`` was asked to play, each session that played into the folder,
package versions and usage totals) and every run folder its own ``settings.json`` (the same settings, its task's
hash and seed, start and end times, usage and what went wrong). Two runs are comparable when their ``settings``
entries are equal: ``report`` puts runs of one model with different settings in different rows. A resume whose
``settings`` (or the hash of a task already in the folder) differ from the folder's is refused, naming each
difference, unless forced.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import MLGymRegistryError
from ..records.clock import now
from ..records.provenance import package_versions, public_endpoint

SETTINGS = "settings.json"
FORMAT = 1
USAGE_KEYS = ("api_calls", "tokens_sent", "tokens_received", "task_cost", "api_retries", "empty_responses",
              "missing_usage", "model_seconds", "truncated_responses")
"""The keys of a policy's ``model_stats`` that add up over runs."""
RUN_KEYS = ("max_call_seconds",)
"""Keys of ``model_stats`` kept in a run's ``usage`` beside ``USAGE_KEYS`` (not a sum: a maximum)."""
SAMPLING = ("temperature", "top_p", "max_tokens")


class SettingsMismatch(MLGymRegistryError):
    """A resume asked for other settings than the suite folder was made with."""


def policy_settings(policy: str) -> dict[str, Any]:
    """The endpoint, sampling and cost-limit settings of a policy string (a ``PolicyText`` carries the openai options).

    Only the openai policy is built here (it connects on its first call only); other policies have none. The cost
    limit is ``{"usd", "price_in", "price_out"}`` (the prices decide when it is reached), or None.
    """
    if str(policy).partition(":")[0] != "openai":
        return {"endpoint": None, "sampling": {}, "cost_limit": None}
    from ..policies import make_policy

    built = make_policy(policy)
    try:
        limit = None if built.cost_limit is None else {"usd": built.cost_limit, "price_in": built.price_in,
                                                       "price_out": built.price_out}
        return {"endpoint": public_endpoint(built.url), "sampling": dict(built.sampling), "cost_limit": limit}
    finally:
        built.close()


def suite_settings(*, policy: str, model: str, max_steps: int | None, seed: int | None,
                   training_timeout: int | None = None, backend_options: Mapping[str, Any] | None = None,
                   components: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings that make two suites' runs comparable: a resume must ask for the same ones."""
    return {
        "policy": str(policy),
        "model": model,
        **policy_settings(policy),
        "max_steps": max_steps,
        "seed": seed,
        "training_timeout": training_timeout,
        "backend_options": dict(backend_options or {}),
        "components": dict(components or {}),
    }


def flat(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with ``sampling`` spread into its keys (``temperature``, ...), the names users know."""
    out = {k: v for k, v in settings.items() if k != "sampling"}
    out.update(settings.get("sampling") or {})
    return out


def differences(before: Mapping[str, Any], now_: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(name, before, now)`` for each flat setting that differs (a sampling value not sent shows as None)."""
    old, new = flat(before), flat(now_)
    return [(key, old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]


def describe(changes: Sequence[tuple[str, Any, Any]]) -> str:
    """``max_steps 5 (now 3), temperature unset (now 1.5)``."""
    def shown(value: Any) -> str:
        return "unset" if value is None else json.dumps(value) if isinstance(value, (dict, list, str)) else str(value)

    return ", ".join(f"{name} {shown(old)} (now {shown(new)})" for name, old, new in changes)


def read(path: Path) -> dict[str, Any] | None:
    """A ``settings.json`` as a dict; None when absent or unreadable."""
    from ..records.regular_files import read_regular_text

    try:
        data = json.loads(read_regular_text(path, within=Path(path).parent))  # never a FIFO, device or outside link
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write(path: Path, data: Mapping[str, Any]) -> None:
    """Write a ``settings.json`` atomically."""
    from ..records.trajectories import atomic_write_json

    atomic_write_json(Path(path), json.loads(json.dumps(data, default=str)))


def check_resume(out: Path, settings: Mapping[str, Any], tasks: Mapping[str, str], force: bool) -> list[str]:
    """Compare a suite folder's recorded settings with those asked for now; return the differences as text.

    ``SettingsMismatch`` when they differ and ``force`` is false. A folder without a record (new, or from before
    records) has nothing to compare.
    """
    recorded = read(Path(out) / SETTINGS)
    if recorded is None or not isinstance(recorded.get("settings"), dict):
        return []
    changes = differences(recorded["settings"], settings)
    old_tasks = recorded.get("tasks") or {}
    changes += [(f"task {task}", "hash " + old_tasks[task][:19], "hash " + digest[:19])
                for task, digest in tasks.items() if task in old_tasks and old_tasks[task] != digest]
    if not changes:
        return []
    text = describe(changes)
    if not force:
        raise SettingsMismatch(
            f"{out} holds runs made with other settings: {text}; run with the settings recorded in "
            f"{Path(out) / SETTINGS}, pass --force to mix both settings in this folder (report shows each as its own "
            f"row), or choose a new --out folder"
        )
    return [text]


def start_suite(out: Path, settings: Mapping[str, Any], tasks: Mapping[str, str], recorded: Mapping[str, Any],
                mixed: list[str]) -> dict[str, Any]:
    """Open a session in the suite's ``settings.json`` (created when missing) and return the record."""
    path = Path(out) / SETTINGS
    record = read(path) or {"format": FORMAT, "settings": dict(settings), "tasks": {}, "started": now(),
                            "sessions": []}
    record.setdefault("sessions", [])
    record["tasks"] = {**record.get("tasks", {}), **tasks}
    session: dict[str, Any] = {"started": now(), "ended": None, "recorded": dict(recorded),
                               "versions": package_versions()}
    if mixed:
        session["settings"] = dict(settings)
        session["forced"] = mixed[0]
    record["sessions"].append(session)
    record["versions"] = session["versions"]
    record["ended"] = None
    write(path, record)
    return record


def end_suite(out: Path, record: dict[str, Any], run_folders: Iterable[Path], played: int, failed: int) -> None:
    """Close the session: its end, the runs it played, and usage totals over every run recorded in the folder."""
    session = record["sessions"][-1]
    session.update(ended=now(), played=played, failed=failed)
    record["ended"] = session["ended"]
    record["totals"] = usage_totals(read(folder / SETTINGS) for folder in run_folders)
    write(Path(out) / SETTINGS, record)


def usage_totals(records: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """Runs, runs with problems, and the sums of their known usage (``runs_without_usage`` counts the others)."""
    totals: dict[str, Any] = {"runs": 0, "runs_with_problems": 0, "runs_without_usage": 0}
    totals.update({key: 0 for key in USAGE_KEYS})
    totals.update(max_call_seconds=0.0, wall_seconds=0.0)
    for record in records:
        if record is None:
            continue
        totals["runs"] += 1
        totals["runs_with_problems"] += bool(record.get("problems"))
        if _is_number(record.get("wall_seconds")):
            totals["wall_seconds"] += record["wall_seconds"]
        usage = record.get("usage")
        if not isinstance(usage, dict):
            totals["runs_without_usage"] += 1
            continue
        add_usage(totals, usage)
    return totals


def add_usage(totals: dict[str, Any], usage: Mapping[str, Any]) -> None:
    """Add a run's ``usage`` (its ``model_stats``) into ``totals``: the sums, and the longest call."""
    for key in USAGE_KEYS:
        if _is_number(usage.get(key)):
            totals[key] = totals.get(key, 0) + usage[key]
    if _is_number(usage.get("max_call_seconds")):
        totals["max_call_seconds"] = max(totals.get("max_call_seconds", 0.0), usage["max_call_seconds"])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_record(suite: Mapping[str, Any], *, task: str, number: int, task_digest: str, seed: int | None,
               max_steps: int, pid: int | None = None) -> dict[str, Any]:
    """The start of a run's ``settings.json``: the suite's settings, the task's hash, the run's seed, the process
    that plays it (``pid``, None when not known yet)."""
    session = suite["sessions"][-1]
    return {
        "format": FORMAT,
        "settings": dict(session.get("settings") or suite["settings"]),
        "task": task,
        "run": number,
        "task_hash": task_digest,
        "run_seed": seed,
        "task_max_steps": max_steps,
        "recorded": session["recorded"],
        "versions": session["versions"],
        "pid": pid,
        "started": now(precise=True),
        "ended": None,
    }


def usage_of(info: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The usage keys of an episode's ``info["model_stats"]``; None when the policy records none."""
    stats = (info or {}).get("model_stats")
    keys = (*USAGE_KEYS, *RUN_KEYS)
    usage = {key: stats[key] for key in keys if key in stats} if isinstance(stats, dict) else {}
    return usage or None
