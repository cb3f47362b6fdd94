"""Finding recorded runs in folders and reading what a leaderboard needs from them.

Two layouts are read:

- MLGym's (and ``bench``'s): one folder per run, named ``<model>__<task>__...``, holding ``results.json`` and a
  ``.traj`` (``<task>.traj``, though some of MLGym's are named otherwise). The model is the folder name's first ``__``
  field (MLGym's ``metagen-`` prefix dropped), the task its second, as MLGym's own scripts pick runs (``folder_task``).
- flat: ``<task>/<model>_run<k>.traj`` beside ``<model>_run<k>.results.json`` (the task is the folder's name).

Scores come from ``results.json`` alone (``{"agent": [metric dicts], "baseline": {...}}``, plus ``"failed"`` when
our recorder gave up on the episode). A ``.traj`` can be megabytes, so only its end is read, for ``info.exit_status``;
it is parsed whole only when its end does not look like the end of a JSON object, to tell whether it is corrupt.

Every file is read through ``regular_files``: a FIFO, socket, device or folder where a run's file is expected (or a
symlink to one, or a symlink leading out of the folder given) is listed in ``bad_files`` and never opened, and no
file is read past ``regular_files.MAX_FILE_BYTES``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..bounded_json import JSONTooDeep
from ..bounded_json import loads as load_json
from ..records.regular_files import IrregularFile, open_regular, read_regular
from .tasks import model_name

RESULTS = "results.json"
FLAT_RESULTS = ".results.json"
TRAJ = ".traj"
TAIL_BYTES = 65536
_RUN_SUFFIX = re.compile(r"_run[-_]?\d+$")
_EXIT_STATUS = re.compile(rb'"exit_status"\s*:\s*"((?:[^"\\]|\\.)*)"')
_MODEL_STATS = re.compile(rb'"model_stats"\s*:\s*(\{[^{}]*\})')
SETTINGS = "settings.json"


def run_problems(failed: str | None, exit_status: str | None, model_stats: dict[str, Any] | None,
                 infra_errors: Any = 0) -> list[str]:
    """Why a run's score cannot be trusted: it failed, an evaluation of it failed for a reason not the agent's
    (``infra_errors``, ``results.json``'s count: its outcome is not the model's), its model's API failed
    (``exit_api``), the model never answered, answered with empty content, or answered without usage. Empty for a
    sound run."""
    problems = []
    if failed:
        problems.append(f"failed: {failed}")
    if isinstance(infra_errors, int) and not isinstance(infra_errors, bool) and infra_errors > 0:
        problems.append(f"{infra_errors} evaluation(s) failed for reasons not the agent's (infra_error)")
    if exit_status and "exit_api" in exit_status:
        problems.append(f"the model's API failed ({exit_status})")
    stats = model_stats or {}
    if stats.get("api_calls") == 0:
        problems.append("no answer from the model (api_calls 0)")
    if stats.get("empty_responses"):
        problems.append(f"{stats['empty_responses']} answers with empty content")
    if stats.get("missing_usage"):
        problems.append(f"{stats['missing_usage']} answers without usage (tokens and cost unknown)")
    return problems


@dataclass(frozen=True)
class BadFile:
    """A file that could not be used, and why."""

    path: Path
    reason: str


@dataclass
class Run:
    """One recorded run: who played which task, and its ``results.json`` content (None when absent or unreadable)."""

    label: str
    model: str
    task: str
    results_path: Path | None
    traj_path: Path | None
    results: dict[str, Any] | None = None
    unreadable: str | None = None
    exit_status: str | None = None
    model_stats: dict[str, Any] | None = None
    """The ``.traj``'s ``info.model_stats`` (usage of the model), None when it records none."""
    settings: dict[str, Any] | None = None
    """The ``settings`` of the run's ``settings.json`` (written by ``bench``), None when there is none."""
    named_by_folder: bool = False
    """The model and task come from a folder name that does not say them (``run``'s ``<task>-<time>``): the run
    records neither (see ``place_by_record``)."""
    replay_of: str | None = None
    """The recorded run this run replays (its ``.traj``), from the run's own record; None for a model's run."""

    @property
    def failed(self) -> str | None:
        """Why our recorder gave up on this run (``results.json``'s ``"failed"``), None for a run that did not fail."""
        if self.results is None or not self.results.get("failed"):
            return None
        return str(self.results["failed"])

    @property
    def problems(self) -> list[str]:
        """Why this run's score cannot be trusted (see ``run_problems``); empty for a sound run."""
        return run_problems(self.failed, self.exit_status, self.model_stats,
                            (self.results or {}).get("infra_errors", 0))

    @cached_property
    def attempts(self) -> list[dict[str, float]]:
        """The agent's metric dicts in order (every validate, then the submission), finite numbers only."""
        if self.results is None:
            return []
        return [clean_metrics(entry) for entry in self.results.get("agent") or [] if isinstance(entry, dict)]

    @cached_property
    def baseline(self) -> dict[str, float]:
        """The baseline metric dict recorded with the run ({} when none)."""
        base = (self.results or {}).get("baseline")
        return clean_metrics(base) if isinstance(base, dict) else {}


@dataclass
class RunSet:
    """Every run found under some folders, and the files that could not be read."""

    runs: list[Run] = field(default_factory=list)
    bad_files: list[BadFile] = field(default_factory=list)


def clean_metrics(entry: dict[str, Any]) -> dict[str, float]:
    """The finite numeric values of a metric dict (booleans, strings, NaN and infinities left out)."""
    out = {}
    for key, value in entry.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


def find_runs(folders: Iterable[str | Path]) -> RunSet:
    """Every run under ``folders`` (searched recursively), read; each unreadable file is listed in ``bad_files``.

    ``FileNotFoundError`` when a folder does not exist.
    """
    found = RunSet()
    seen: set[Path] = set()
    for folder in folders:
        root = Path(folder)
        if not root.is_dir():
            if not root.exists():
                raise FileNotFoundError(f"{str(root)!r} does not exist")
            raise NotADirectoryError(f"{str(root)!r} is not a folder of runs")
        for run in _walk(root, found.bad_files):
            key = Path(run.label).resolve()
            if key in seen:  # the same folder given twice, or inside another one given
                continue
            seen.add(key)
            _read(run, found.bad_files, root)
            found.runs.append(run)
    found.runs.sort(key=lambda r: (r.task, r.model, r.label))
    return found


def _walk(root: Path, bad_files: list[BadFile]) -> Iterator[Run]:
    for here, dirs, files in os.walk(root):
        folder = Path(here)
        for name in [d for d in dirs if _names_a_file(d)]:  # a folder (or a link to one) where a file belongs
            dirs.remove(name)
            bad_files.append(BadFile(folder / name, "is a folder, not a file: skipped"))
        dirs.sort()
        names = set(files)
        trajs = sorted(n for n in names if n.endswith(TRAJ))
        if RESULTS in names or (trajs and "__" in folder.name):
            dirs.clear()  # a run folder holds nothing else of ours
            yield _folder_run(folder, trajs, RESULTS in names)
            continue
        stems = {n[: -len(TRAJ)] for n in trajs} | {n[: -len(FLAT_RESULTS)] for n in names if n.endswith(FLAT_RESULTS)}
        for stem in sorted(stems):
            traj, results = folder / (stem + TRAJ), folder / (stem + FLAT_RESULTS)
            yield Run(
                label=str(folder / stem),
                model=model_name(_RUN_SUFFIX.sub("", stem.split("__")[0])),
                task=folder.name or folder.resolve().name,
                results_path=results if results.name in names else None,
                traj_path=traj if traj.name in names else None,
            )


def _names_a_file(name: str) -> bool:
    return name == RESULTS or name.endswith(TRAJ) or name.endswith(FLAT_RESULTS)


def _folder_run(folder: Path, trajs: list[str], has_results: bool) -> Run:
    fields = folder.name.split("__")
    task = folder_task(folder.name, trajs)
    traj = next((t for t in trajs if t == task + TRAJ), trajs[0] if trajs else None)
    return Run(
        label=str(folder),
        model=model_name(fields[0]),
        task=task,
        results_path=folder / RESULTS if has_results else None,
        traj_path=folder / traj if traj else None,
    )


def folder_task(name: str, trajs: Iterable[str] = ()) -> str:
    """The task of the run folder ``name``: the field after the model (``<model>__<task>__...``), whatever its
    ``.traj`` files are called.

    MLGym picks a task's runs by folder name alone (``*<model>__<task>__*``), and some of its runs hold a ``.traj``
    named otherwise (``3SATHeuristic.traj`` in ``3SATTime`` folders). A ``.traj`` whose name is the whole rest of the
    name up to a ``__`` (a task id holding ``__``) names the task; a name without ``__`` gets its only ``.traj``'s
    stem, else the name itself.
    """
    fields = name.split("__")
    stems = [t[: -len(TRAJ)] for t in sorted(trajs) if t.endswith(TRAJ)]
    if len(fields) < 2:
        return stems[0] if len(stems) == 1 else name
    rest = name[len(fields[0]) + 2 :] + "__"
    return next((stem for stem in stems if "__" in stem and rest.startswith(stem + "__")), fields[1])


def _read(run: Run, bad_files: list[BadFile], root: Path | None = None) -> None:
    if run.results_path is not None:
        try:
            data = load_json(read_regular(run.results_path, within=root))
        except (OSError, ValueError, MemoryError) as exc:
            run.unreadable = _reason(exc)
        else:
            problem = _results_problem(data)
            if problem:
                run.unreadable = problem
            else:
                run.results = data
        if run.unreadable:
            bad_files.append(BadFile(run.results_path, run.unreadable))
    if run.traj_path is not None:
        status, problem = read_exit_status(run.traj_path, within=root)
        run.exit_status = status
        run.model_stats = None if problem else read_model_stats(run.traj_path, within=root)
        if problem:
            bad_files.append(BadFile(run.traj_path, problem))
    if run.results_path is not None and run.results_path.name == RESULTS:  # bench's layout: one folder per run
        run.settings = _read_settings(run.results_path.parent / SETTINGS, bad_files, root)
    place_by_record(run)


def place_by_record(run: Run) -> None:
    """Take the model and task of a run whose folder name does not hold them (``run --out``'s folders) from its
    record (``results.json``'s ``"run"``: the policy's model, else its kind), and note a replay. A run with neither
    keeps its folder's name as model and is marked ``named_by_folder``."""
    record = (run.results or {}).get("run")
    record = record if isinstance(record, dict) else {}
    policy = record.get("policy") if isinstance(record.get("policy"), dict) else {}
    if policy.get("name") == "replay":
        run.replay_of = str(policy.get("source") or "a recorded run")
    if run.results_path is None or run.results_path.name != RESULTS or "__" in run.results_path.parent.name:
        return  # bench's and MLGym's folders say model and task; flat files say them in their names
    task = record.get("task") if isinstance(record.get("task"), dict) else {}
    if policy.get("model") or policy.get("name"):
        run.model = model_name(str(policy.get("model") or policy["name"]))
        run.task = str(task.get("id") or run.task)
    else:
        run.named_by_folder = True


def _read_settings(path: Path, bad_files: list[BadFile], root: Path | None = None) -> dict[str, Any] | None:
    try:
        data = load_json(read_regular(path, within=root))
    except IrregularFile as exc:
        bad_files.append(BadFile(path, exc.reason))
        return None
    except (OSError, ValueError, MemoryError):
        return None
    settings = data.get("settings") if isinstance(data, dict) else None
    return settings if isinstance(settings, dict) else None


def read_model_stats(path: Path, within: Path | None = None) -> dict[str, Any] | None:
    """``info.model_stats`` of a ``.traj`` from its last bytes (MLGym writes ``info`` last); None when absent (or
    the file is not a regular file inside ``within``)."""
    try:
        with open_regular(path, within) as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - TAIL_BYTES))
            tail = handle.read(TAIL_BYTES) or b""  # at most the tail, even of a file that grows meanwhile
    except OSError:
        return None
    matches = list(_MODEL_STATS.finditer(tail))
    if not matches:
        return None
    try:
        stats = json.loads(matches[-1].group(1))
    except ValueError:
        return None
    return stats if isinstance(stats, dict) else None


def _results_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"holds a JSON {type(data).__name__}, not an object with 'agent' and 'baseline'"
    if "agent" in data and data["agent"] is not None and not isinstance(data["agent"], list):
        return f"'agent' is a {type(data['agent']).__name__}, not a list of metric dicts"
    if "baseline" in data and data["baseline"] is not None and not isinstance(data["baseline"], dict):
        return f"'baseline' is a {type(data['baseline']).__name__}, not a metric dict"
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "is not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, JSONTooDeep):
        return f"is not usable JSON (nested deeper than {exc.max_depth} levels)"
    if isinstance(exc, MemoryError):
        return "is too large to read into memory"
    if isinstance(exc, IrregularFile):
        return exc.reason
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    return str(exc)


def read_exit_status(path: Path, within: Path | None = None) -> tuple[str | None, str | None]:
    """(``info.exit_status`` of a ``.traj`` or None, why the file is unusable or None), reading only its end.

    MLGym writes ``info`` last, so its ``exit_status`` is in the file's last bytes. The whole file is parsed only when
    it does not start with ``{`` and end with ``}``, to report it as corrupt. A path that is not a regular file (inside
    ``within`` when given) is unusable, and never opened.
    """
    try:
        with open_regular(path, within) as handle:
            head = (handle.read(64) or b"").lstrip()
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read(TAIL_BYTES) or b""  # at most the tail, even of a file that grows meanwhile
    except OSError as exc:
        return None, _reason(exc)
    if not (head.startswith(b"{") and tail.rstrip().endswith(b"}")):
        try:
            data = load_json(read_regular(path, within=within))
        except (OSError, ValueError, MemoryError) as exc:
            return None, _reason(exc)
        if not isinstance(data, dict):
            return None, f"holds a JSON {type(data).__name__}, not a trajectory object"
        info = data.get("info")
        status = info.get("exit_status") if isinstance(info, dict) else None
        return (str(status) if status is not None else None), None
    matches = list(_EXIT_STATUS.finditer(tail))
    if not matches:
        return None, None
    try:
        return json.loads(b'"' + matches[-1].group(1) + b'"'), None
    except ValueError:
        return None, None
