"""Regenerate the table of MLGym's tasks that docs/tasks.md publishes, from an MLGym checkout and this package alone.

    MLGYM_ROOT=/path/to/MLGym python bench/mlgym_tasks_table.py [--write] [--tasks A,B] [--prepare]
        [--check [--budget SECONDS] [--runs N]] [--python [PATTERN=]PATH ...] [--data-dir DIR]

One row per task file of the checkout's ``configs/tasks/*.yaml``, each cell asked of the package, never kept by hand:

- *registered as*: the name the registry gives the file (``mlgym/<id>``; for a file reusing another's id its file's
  stem, or its path only: ``mlgym_source.task_names``), or why it does not load at all;
- *prepare*: what ``mlgym-registry prepare`` would still need (the local backend's ``task_checks.blockers``, the
  checks ``make`` runs); nothing is installed or made unless ``--prepare`` is given, which runs ``registry.prepare``
  first and says how long it took;
- *make*: whether ``registry.make`` builds the task's env on this machine (then closes it), and how long it took;
- *baseline* and *vs published*: only with ``--check``, ``check_task``'s runs of the baseline program and evaluator
  (``--budget`` seconds for each run's baseline program), their mean per metric and the verdict against MLGym's
  published score; without it the cells say "not run: pass --check";
- *still needed*: each blocker's kind and first sentence, and the command its message names; the messages in full
  follow the table. Paths of this machine read ``$MLGYM_ROOT``, ``~`` and ``this Python``.

``--python PATTERN=PATH`` runs the tasks whose file stem or name matches the glob ``PATTERN`` with that interpreter
(the local backend's ``python=`` option), e.g. ``--python 'rl*=/path/to/venv/bin/python'``; a bare PATH applies to
every task. ``--write`` replaces the table between its markers in docs/tasks.md; without it the table is printed.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs" / "tasks.md"
START, END = "<!-- mlgym-tasks-table:start -->", "<!-- mlgym-tasks-table:end -->"
NOT_CHECKED = "not run: pass --check"


@dataclass
class Options:
    """What the table measures: ``prepare`` runs ``registry.prepare`` first, ``check`` runs the baseline (``runs``
    times, ``budget`` seconds for each run's baseline program); ``pythons`` maps a glob to an interpreter."""

    prepare: bool = False
    check: bool = False
    budget: float | None = None
    runs: int = 1
    pythons: list[tuple[str, str]] = field(default_factory=list)
    data_dir: str | None = None


@dataclass
class Row:
    """One task file's cells, and the full messages of what blocks it."""

    file: str
    registered: str
    prepare: str = ""
    make: str = ""
    baseline: str = NOT_CHECKED
    published: str = NOT_CHECKED
    seconds: str = ""
    needed: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def scrub(text: str, root: Path) -> str:
    """``text`` with this machine's paths in words: the checkout as ``$MLGYM_ROOT``, the home folder as ``~``, this
    interpreter as ``this Python``."""
    text = text.replace(sys.executable, "this Python").replace(str(root), "$MLGYM_ROOT")
    return text.replace(os.path.expanduser("~"), "~")


def first_sentence(message: str) -> str:
    """The first sentence of an error message, without its ``task 'X':`` prefix and the list of places it looked."""
    text = re.sub(r"^task '[^']*':? ", "", message.strip())
    text = text.split("; looked in:")[0].split("\n")[0]
    match = re.match(r"(.+?[.)])(?:\s+[A-Z`]|$)", text)
    return (match.group(1) if match else text).rstrip(".")


def fix_command(message: str) -> str | None:
    """The first command a message names in backquotes (how to make or get what is missing), if any."""
    for command in re.findall(r"`([^`]+)`", message):
        if command.startswith(("mlgym-registry ", "python ", "huggingface-cli ")):
            return command
    return None


def interpreter_for(path: Path, name: str | None, options: Options) -> str | None:
    """The ``python=`` interpreter ``--python`` gives the task file ``path`` (registered as ``name``), if any."""
    chosen = None
    for pattern, python in options.pythons:
        keys = [path.stem, path.name] + ([name, name.split("/", 1)[-1]] if name else [])
        if pattern == "*" or any(fnmatch.fnmatchcase(key, pattern) for key in keys):
            chosen = python
    return chosen


def checkout_files(root: Path) -> list[tuple[Path, str | None, str | None]]:
    """``(path, registered name or None, why it does not load or None)`` for every task file of the checkout, by file
    name, as the registry names them (``mlgym_source.task_names``)."""
    from mlgym_registry.tasks import mlgym_source

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        headers = mlgym_source.checkout_headers(root, warn=False)
        names = mlgym_source.task_names(headers)
    read = {path for path, _ in headers}
    found = []
    for path in sorted((root / "configs" / "tasks").glob("*.yaml")):
        if path in read:
            name = names[path]
            found.append((path, mlgym_source.NAMESPACE + name if name is not None else None, None))
            continue
        try:
            mlgym_source.task_header(path)
        except Exception as exc:  # noqa: BLE001 - the refusal is the row
            found.append((path, None, f"{type(exc).__name__}: {exc}"))
    return found


def shared_ids(root: Path) -> dict[Path, list[str]]:
    """For each task file, the other files of the checkout that declare its id."""
    from mlgym_registry.tasks import mlgym_source

    headers = mlgym_source.checkout_headers(root, warn=False)
    by_id: dict[str, list[Path]] = {}
    for path, data in headers:
        by_id.setdefault(str(data["id"]), []).append(path)
    return {path: [other.name for other in by_id[str(data["id"])] if other != path] for path, data in headers}


def task_row(path: Path, name: str | None, root: Path, options: Options, registry: Any = None,
             unreadable: str | None = None) -> Row:
    """Measure one task file: load it, what ``prepare`` would still need (after running it with ``--prepare``),
    ``make``, and with ``--check`` its baseline against the published score."""
    from mlgym_registry.backends.local.task_checks import blockers

    if registry is None:
        from mlgym_registry import registry
    target = name or str(path)
    sharing = shared_ids(root).get(path, [])
    registered = f"`{name}`" if name else "by its path only"
    if sharing:
        registered += f" (its id is also declared by {', '.join(sharing)})"
    row = Row(path.name, registered)
    if unreadable is not None:
        row.registered = "no: unreadable"
        row.needed, row.details = [first_sentence(unreadable)], [unreadable]
        row.prepare = row.make = row.baseline = row.published = row.seconds = "-"
        return row
    try:
        spec = registry.spec(target)
    except Exception as exc:  # noqa: BLE001 - the refusal is the row
        message = scrub(str(exc), root)
        row.registered = f"`{name}`: does not load" if name else "does not load"
        row.prepare = row.make = row.baseline = row.published = row.seconds = "-"
        row.needed, row.details = [first_sentence(message)], [f"{type(exc).__name__}: {message}"]
        return row
    python = interpreter_for(path, name, options)
    backend_options = {key: value for key, value in (("python", python), ("data_dir", options.data_dir)) if value}
    times = []
    prefix = ""
    if options.prepare:
        started = time.perf_counter()
        try:
            registry.prepare(target, data_dir=options.data_dir, echo=lambda _line: None)
            prefix = f"ran in {time.perf_counter() - started:.0f} s; "
        except Exception as exc:  # noqa: BLE001 - a failed prepare is the cell
            prefix = f"failed in {time.perf_counter() - started:.0f} s ({first_sentence(scrub(str(exc), root))}); "
    found = blockers(spec, **backend_options)
    row.prepare = prefix + ("ready" if not found else "still needs " + ", ".join(b.kind for b in found))
    if not options.prepare:
        row.prepare = row.prepare.replace("still needs", "needs")
    if python:
        from mlgym_registry.preparation.task_packages import missing_requirements, task_requirements

        lacking = missing_requirements(task_requirements(spec), python)
        row.prepare += (" (with --python's interpreter" + (f", which lacks {', '.join(lacking)})" if lacking else ")"))
        if lacking:
            row.needed.append(f"packages: --python's interpreter lacks {', '.join(lacking)}")
    for blocker in found:
        message = scrub(str(blocker.error), root)
        command = fix_command(message)
        summary = first_sentence(message)
        fix = f"; `{command}`" if command and command not in summary else ""
        row.needed.append(f"{blocker.kind}: {summary}{fix}")
        row.details.append(f"{blocker.kind}: {message}")
    started = time.perf_counter()
    try:
        env = registry.make(target, backend_options=backend_options)
        env.close()
        seconds = time.perf_counter() - started
        row.make = "builds"
        times.append(f"make {seconds:.2f} s")
    except Exception as exc:  # noqa: BLE001 - a refused make is the cell
        message = scrub(str(exc), root)
        kinds = [b.kind for b in found if scrub(str(b.error), root) == message]
        row.make = (f"refused ({kinds[0]}, as prepare says)" if kinds
                    else f"refused: {type(exc).__name__}: {first_sentence(message)}")
    if options.check:
        if found:
            row.baseline = row.published = "not run: blocked"
        else:
            _check(row, spec, options, backend_options, times, root)
    row.seconds = ", ".join(times) or "-"
    return row


def _check(row: Row, spec: Any, options: Options, backend_options: dict[str, str], times: list[str],
           root: Path) -> None:
    """``check_task``'s baseline runs of ``spec`` (the task as the table's registry gave it) into the row's
    *baseline*, *vs published* and time cells."""
    from mlgym_registry.testing import check_task

    started = time.perf_counter()
    report = check_task(spec, runs=options.runs, raise_on_failure=False, budget=options.budget,
                        backend_options=backend_options)
    budget = f" (budget {options.budget:.0f} s)" if options.budget else ""
    times.append(f"check {time.perf_counter() - started:.0f} s for {options.runs} run(s){budget}")
    if report.runs:
        metrics = report.runs[0].metrics
        means = {key: statistics.fmean(float(run.metrics[key]) for run in report.runs) for key in metrics}
        row.baseline = ", ".join(f"{key} {value:.6g}" for key, value in means.items())
    else:
        row.baseline = "not scored"
    published = ", ".join(f"{key} {float(value):.6g}" for key, value in (report.spec.baseline or {}).items())
    published = f"published {published}: " if published else "nothing published: "
    if report.problems:
        row.published = published + "problem: " + first_sentence(scrub(report.problems[0], root))
        row.details += [f"check: {scrub(problem, root)}" for problem in report.problems]
    elif report.known_differences:
        row.published = published + "differs, known cause: " + first_sentence(scrub(report.known_differences[0], root))
    else:
        row.published = published + "reproduced"


def rows(root: Path, options: Options, asked: list[str] | None = None, registry: Any = None) -> list[Row]:
    """One row per task file of the checkout at ``root`` (or only those whose stem or name is in ``asked``)."""
    found = []
    for path, name, unreadable in checkout_files(root):
        if asked and not ({path.stem, path.name} | ({name, name.split("/", 1)[-1]} if name else set())) & set(asked):
            continue
        print(f"{path.name}: ...", file=sys.stderr, flush=True)
        found.append(task_row(path, name, root, options, registry, unreadable))
    return found


def table(found: list[Row], options: Options, machine: str) -> str:
    """The Markdown table, then each blocked task's messages in full."""
    command = ["python bench/mlgym_tasks_table.py", *(["--prepare"] if options.prepare else []),
               *(["--check"] if options.check else []), *([f"--budget {options.budget:g}"] if options.budget else []),
               *([f"--runs {options.runs}"] if options.check and options.runs != 1 else []),
               *(f"--python '{pattern}=...'" for pattern, _ in options.pythons)]
    lines = [f"Generated by `{' '.join(command)}` on {machine}.", "",
             "| task file | registered as | prepare | make | baseline (check) | vs published | time | still needed |",
             "|---|---|---|---|---|---|---|---|"]
    for row in found:
        cells = [f"`{row.file}`", row.registered, row.prepare, row.make, row.baseline, row.published, row.seconds,
                 "<br>".join(row.needed) or "nothing"]
        lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |")
    blocked = [row for row in found if row.details]
    if blocked:
        lines += ["", "What each message says in full:", ""]
        for row in blocked:
            for detail in row.details:
                text = " ".join(line.strip() for line in detail.splitlines() if line.strip())
                lines.append(f"- `{row.file}`, {text}")
    return "\n".join(lines)


def machine() -> str:
    """This machine in a few words: CPU cores, whether it has an NVIDIA device."""
    from mlgym_registry.backends.local import sandbox

    gpu = "an NVIDIA GPU" if sandbox.gpu_devices() else "no GPU"
    return f"{os.cpu_count()} CPU cores, {gpu}"


def merged(old: str, new: str, files: list[str]) -> str:
    """The table ``old`` with the rows and messages of ``files`` taken from ``new`` (a run on some tasks only), and
    ``new``'s first line (the command that measured them) added to its own."""
    def own(line: str) -> str | None:
        match = re.match(r"(?:\| |- )`([^`]+)`", line)
        return match.group(1) if match and match.group(1) in files else None

    fresh = new.splitlines()
    rows_new = {own(line): line for line in fresh if line.startswith("| ") and own(line)}
    details_new = [line for line in fresh if line.startswith("- ") and own(line)]
    lines, placed = [], False
    for line in old.splitlines():
        if line.startswith("| ") and own(line):
            lines.append(rows_new.pop(own(line)))
        elif line.startswith("- ") and own(line):
            continue
        elif line.startswith("- ") and not placed:
            lines += details_new
            lines.append(line)
            placed = True
        else:
            lines.append(line)
    if not placed:
        lines += details_new
    lines[0] += f" The rows of {', '.join(f'`{name}`' for name in files)}: {fresh[0][0].lower()}{fresh[0][1:]}"
    return "\n".join(lines)


def write(text: str, docs: Path = DOCS, files: list[str] | None = None) -> None:
    """Replace what lies between the markers in ``docs`` with ``text``, or only the rows of ``files`` (``merged``)."""
    page = docs.read_text()
    if START not in page or END not in page:
        raise SystemExit(f"{docs} has no {START} ... {END} markers")
    if files:
        old = page.split(START, 1)[1].split(END, 1)[0].strip("\n")
        text = merged(old, text, files) if old.startswith("Generated by") else text
    page = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: f"{START}\n{text}\n{END}", page, flags=re.S)
    docs.write_text(page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mlgym-root", metavar="DIR", help="the MLGym checkout (default: $MLGYM_ROOT)")
    parser.add_argument("--tasks", default="", help="comma-separated file stems or names (default: every task file)")
    parser.add_argument("--prepare", action="store_true", help="run prepare for each task first (installs packages, "
                        "makes data)")
    parser.add_argument("--check", action="store_true", help="run each unblocked task's baseline and compare it with "
                        "the published score")
    parser.add_argument("--budget", type=float, metavar="SECONDS", help="with --check: seconds each run's baseline "
                        "program may take (default: the task's training_timeout)")
    parser.add_argument("--runs", type=int, default=1, help="with --check: evaluator runs, each with its own seed")
    parser.add_argument("--python", action="append", default=[], metavar="[PATTERN=]PATH",
                        help="the interpreter for the tasks matching PATTERN (all without one); repeatable")
    parser.add_argument("--data-dir", metavar="DIR", help="the data folder(s) for the local backend and prepare")
    parser.add_argument("--write", action="store_true", help="replace the table in docs/tasks.md")
    args = parser.parse_args(argv)
    if args.mlgym_root:
        os.environ["MLGYM_ROOT"] = args.mlgym_root
    if not os.environ.get("MLGYM_ROOT"):
        raise SystemExit("no MLGym checkout: set MLGYM_ROOT or pass --mlgym-root DIR")
    root = Path(os.environ["MLGYM_ROOT"]).expanduser().resolve()
    pythons = [tuple(item.split("=", 1)) if "=" in item else ("*", item) for item in args.python]
    options = Options(prepare=args.prepare, check=args.check, budget=args.budget, runs=args.runs,
                      pythons=pythons, data_dir=args.data_dir)  # type: ignore[arg-type]
    started = time.perf_counter()
    from mlgym_registry.backends import local  # noqa: F401 - imported once here, not in the first task's make time
    from mlgym_registry.transforms import chain  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the duplicate id's warning: the table says it
        found = rows(root, options, [t for t in args.tasks.split(",") if t])
    text = table(found, options, machine())
    print(text)
    print(f"done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.write:
        write(text, files=[row.file for row in found] if args.tasks else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
