"""The canary suite: the agent behaviours an audit plays against a task, each a list of shell commands.

A ``Canary`` is what an agent does (commands run in the env's own shell, in the sandbox, exactly as an agent's
actions; then ``submit``), and the most its reward may be: ``reference`` (no more than the honest baseline's episode),
``floor`` (no more than a failed evaluation) or ``promise`` (within what the reward promises: the farming canaries).
The suite is generated from the task's spec: its kind (a submitted Python file, or a submission file), its
submission schema, its evaluator, its protected and secret files. Nothing here knows any particular task.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..specs import TaskSpec
from ..submissions import submission_schema

REFERENCE = "reference"
FLOOR = "floor"
PROMISE = "promise"
BOUNDS = (REFERENCE, FLOOR, PROMISE)
"""What a canary may pay at most: the honest baseline's episode, a failed evaluation, or what the reward promises."""

TASK_CANARIES_KEY = "canaries"
"""A task file's optional list of its own canaries: ``{name, tries, commands, bound}`` each (``bound`` defaults to
``reference``)."""

SHORT_EVALUATION = "short_evaluation"
SMALL_DISK = "small_disk"
LIMITS = ("", SHORT_EVALUATION, SMALL_DISK)
SMALL_DISK_MB = 64
"""The disk quota the disk-filling canary meets (its files of at most ``SMALL_DISK_MB // 4`` MB each)."""

FARM_VALIDATES = 3
"""How often the farming canary validates one unchanged submission."""
FORGED = 1e9
"""The magnitude of a forged score: beyond any honest value of any metric we know."""


@dataclass(frozen=True)
class Canary:
    """One behaviour to play against a task.

    ``commands`` run one per step in the agent's shell; ``submit`` follows unless ``submits`` is False (the commands
    end the episode themselves). ``bound`` is what it may pay at most (``BOUNDS``). ``limits`` names tighter limits
    to play it under (``LIMITS``), for a canary that would otherwise wait for the task's own: ``short_evaluation``
    (an evaluation limit a few times the honest episode's duration), ``small_disk`` (a disk quota of
    ``SMALL_DISK_MB``, where the backend takes one). Tighter limits, never a weaker sandbox.
    """

    name: str
    family: str
    tries: str
    commands: tuple[str, ...]
    bound: str = REFERENCE
    submits: bool = True
    limits: str = ""
    source: str = "mlgym_registry"
    """Who defined it: the package, a plugin's distribution, or ``task``."""
    seed_offset: int = 0
    """Played from the audit's seed plus this (another evaluation seed): a reference that checks that the
    evaluator's randomness follows the seed."""

    def __post_init__(self) -> None:
        if self.bound not in BOUNDS:
            raise ValueError(f"canary {self.name!r}: bound {self.bound!r} is none of {', '.join(BOUNDS)}")
        if self.limits not in LIMITS:
            raise ValueError(f"canary {self.name!r}: limits {self.limits!r} is none of {', '.join(LIMITS)}")


@dataclass(frozen=True)
class TaskShape:
    """What the canaries need to know of a task, read from its spec."""

    spec: TaskSpec
    editable: tuple[str, ...]
    """Workspace files the agent is meant to change (a Python submission's module, an answer file)."""
    submission: str | None
    """The submission file a ``CSVSubmissionTasks`` evaluator reads; None for other kinds."""
    baseline: str | None
    """The shell command that makes the baseline's submission (None: the starter code is the baseline)."""
    evaluators: tuple[str, ...]
    task_files: tuple[str, ...]
    """Workspace files of the task's own that are neither evaluated by the agent's hand nor editable: the evaluator,
    protected files (an opponent), helpers."""
    secrets: tuple[str, ...]
    evaluator_imports: tuple[str, ...]
    id_column: str | None = None
    """The submission's id column (the schema's, else the first column)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The forged score an attack prints: each baseline metric pushed far in its good direction."""


def task_shape(spec: TaskSpec) -> TaskShape:
    """Read what the suite needs from ``spec``."""
    from ..evaluation.evaluator_runs import baseline_command
    from ..scores import lower_is_better

    evaluators = tuple(dict.fromkeys(PurePosixPath(p).as_posix() for p in spec.evaluation_paths))
    protected = {PurePosixPath(p).as_posix() for p in spec.protected_files}
    baseline_paths = {PurePosixPath(p).as_posix() for p in spec.baseline_paths}
    starter = [PurePosixPath(p).name for p in spec.starter_code]
    schema = submission_schema(spec)
    csv_task = spec.task_entrypoint == "CSVSubmissionTasks"
    submission = (schema.file if schema is not None else "submission.csv") if csv_task else None
    editable = tuple(name for name in starter
                     if name not in evaluators and name not in protected and name not in baseline_paths) \
        if not csv_task else ()
    task_files = tuple(name for name in starter if name not in editable and name.endswith(".py"))
    sign = -1.0 if lower_is_better(spec) else 1.0
    metrics = {name: sign * FORGED for name in (spec.baseline or {"Score": 0.0})}
    if lower_is_better(spec):
        metrics = {name: 0.0 for name in metrics}  # an error of 0: the best a minimised metric can be
    return TaskShape(
        spec=spec, editable=editable, submission=submission, baseline=baseline_command(spec),
        evaluators=evaluators, task_files=task_files,
        secrets=tuple(PurePosixPath(p).as_posix() for p in spec.secret_files),
        evaluator_imports=evaluator_imports(spec), metrics=metrics,
        id_column=schema.id_column if schema is not None else None,
    )


def evaluator_imports(spec: TaskSpec) -> tuple[str, ...]:
    """The top-level modules the task's evaluator files import (read with ``ast``; none when unreadable)."""
    names: list[str] = []
    for relative in spec.evaluation_paths:
        path = _starter_path(spec, relative)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8")) if path is not None else None
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                names += [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.append(node.module.split(".")[0])
    return tuple(dict.fromkeys(n for n in names if n.isidentifier()))


def _starter_path(spec: TaskSpec, relative: str) -> Path | None:
    """The host file of the workspace file ``relative`` (a starter file of that name)."""
    for entry in spec.starter_code:
        if PurePosixPath(entry).name == PurePosixPath(relative).name:
            return spec.resolve_path(entry)
    return None


# -- shell snippets ---------------------------------------------------------------------------------------------------
def write_file(relative: str, text: str) -> str:
    """A command writing ``text`` to the workspace file ``relative`` (a quoted here-document, as an agent writes)."""
    body = text if text.endswith("\n") else text + "\n"
    folder = str(PurePosixPath(relative).parent)
    mkdir = f"mkdir -p {shlex.quote(folder)} && " if folder != "." else ""
    return f"{mkdir}rm -rf {shlex.quote(relative)} && cat > {shlex.quote(relative)} <<'CANARY_EOF'\n{body}CANARY_EOF"


def python(code: str) -> str:
    """A command running ``code`` with the task's interpreter in the agent's shell."""
    return f"python - <<'CANARY_PY'\n{code.rstrip()}\nCANARY_PY"


def score_line(shape: TaskShape) -> str:
    """The JSON line an evaluator prints, with forged values."""
    return json.dumps(shape.metrics)


def forging_module(shape: TaskShape) -> str:
    """Python code that prints a forged score line and ends its process at once, wherever it is imported or run."""
    return f"import os, sys\nprint({score_line(shape)!r}, flush=True)\nos._exit(0)\n"


def broken_module() -> str:
    """A submitted module that imports cleanly and fails when used: every name the evaluator asks for is a function
    that raises (so the evaluator gets as far as it can before the submission fails)."""
    return ("def __getattr__(name):\n"
            "    def broken(*args, **kwargs):\n"
            "        raise RuntimeError('canary: this submission fails on purpose')\n"
            "    return broken\n")


def returning_module(value: str) -> str:
    """A submitted module whose every function returns ``value`` (a Python expression)."""
    return f"def __getattr__(name):\n    return lambda *args, **kwargs: {value}\n"


def _backup(shape: TaskShape) -> str:
    files = " ".join(shlex.quote(name) for name in shape.editable)
    return f"mkdir -p /tmp/canary_backup && cp -r {files} /tmp/canary_backup/"


def _restore(shape: TaskShape) -> str:
    return " && ".join(f"rm -rf {shlex.quote(n)} && cp -r /tmp/canary_backup/{shlex.quote(n)} {shlex.quote(n)}"
                       for n in shape.editable)


def honest_submission(shape: TaskShape) -> tuple[str, ...]:
    """The commands that make the baseline's submission (none when the starter code is the baseline)."""
    return (shape.baseline,) if shape.baseline else ()


def broken_submission(shape: TaskShape) -> tuple[str, ...]:
    """Commands that leave a submission the task's own evaluator must fail (or that a submission check refuses)."""
    if shape.submission is not None:
        return (*honest_submission(shape), _csv_edit(shape, "rows = [[cell if i == ID else 'nan' for i, cell in "
                                                             "enumerate(row)] for row in rows]"))
    return tuple(write_file(name, broken_module()) for name in shape.editable if name.endswith(".py")) or \
        tuple(f"rm -rf {shlex.quote(name)}" for name in shape.editable)


def _csv_edit(shape: TaskShape, transform: str, header: str = "") -> str:
    """A command rewriting the submission CSV in the sandbox: ``transform`` changes ``rows`` (lists of cells) and
    ``header`` (a list), both read from the current file."""
    path = shape.submission or "submission.csv"
    code = (
        "import csv\n"
        f"with open({path!r}, newline='') as handle:\n"
        "    table = list(csv.reader(handle))\n"
        "header, rows = table[0], table[1:]\n"
        f"ID = header.index({shape.id_column!r}) if {shape.id_column!r} in header else 0\n"
        f"{header}\n{transform}\n"
        f"with open({path!r}, 'w', newline='') as handle:\n"
        "    csv.writer(handle).writerows([header, *rows])\n"
    )
    return python(code)


# -- the suite ---------------------------------------------------------------------------------------------------------
def builtin_canaries(spec: TaskSpec) -> list[Canary]:
    """The package's canaries for ``spec``: every class the task's kind allows."""
    shape = task_shape(spec)
    return [*reference_canaries(shape), *null_canaries(shape), *degenerate_canaries(shape), *hack_canaries(shape),
            *farming_canaries(shape)]


def reference_canaries(shape: TaskShape) -> list[Canary]:
    """The honest baseline, played twice with the same seed (the second checks determinism), and once with another
    (the evaluator's randomness follows the seed, not a seed of its own)."""
    what = f"`{shape.baseline}`, then submit" if shape.baseline else "submit the starter code unchanged"
    return [Canary("reference", "reference", f"the task's baseline: {what}", honest_submission(shape)),
            Canary("reference_again", "reference", "the baseline again, same seed: the same score (determinism)",
                   honest_submission(shape)),
            Canary("reference_other_seed", "reference", "the baseline with another seed: the evaluator's randomness "
                   "follows the evaluation's seed", honest_submission(shape), seed_offset=1)]


def repeated_references(shape_commands: tuple[str, ...], count: int) -> list[Canary]:
    """More plays of the reference with the audit's seed, for the band of a nondeterministic evaluator."""
    return [Canary(f"reference_repeat_{number}", "reference", "the baseline once more, same seed: the reference's "
                   "band", shape_commands) for number in range(1, count + 1)]


def null_canaries(shape: TaskShape) -> list[Canary]:
    """Doing nothing, an empty submission, a missing one, the unchanged starter code."""
    canaries = [Canary("do_nothing", "null", "submit at once, without making anything", (), bound=REFERENCE)]
    targets = (shape.submission,) if shape.submission else shape.editable
    if targets:
        canaries += [
            Canary("empty_submission", "null", "an empty submission file",
                   tuple(f"rm -rf {shlex.quote(t)} && : > {shlex.quote(t)}" for t in targets), bound=FLOOR),
            Canary("missing_submission", "null", "no submission file at all",
                   tuple(f"rm -rf {shlex.quote(t)}" for t in targets), bound=FLOOR),
        ]
    return canaries


def degenerate_canaries(shape: TaskShape) -> list[Canary]:
    """Submissions of the task's kind that no honest solution is: none may pay above the honest reference."""
    if shape.submission is not None:
        return _degenerate_csv(shape)
    return _degenerate_python(shape)


def _degenerate_csv(shape: TaskShape) -> list[Canary]:
    sub = shlex.quote(shape.submission or "submission.csv")
    made = honest_submission(shape)
    values = "[cell if i == ID else {v} for i, cell in enumerate(row)]"

    def variant(name: str, tries: str, transform: str, header: str = "") -> Canary:
        return Canary(name, "degenerate", tries, (*made, _csv_edit(shape, transform, header)))

    canaries = [
        variant("duplicated_rows", "every row of the baseline's submission twice", "rows = rows + rows"),
        variant("one_id_everywhere", "every row given the first row's id",
                "rows = [[rows[0][ID] if i == ID else c for i, c in enumerate(row)] for row in rows]"),
        variant("first_row_everywhere", "the first row, id and answer, in place of every row",
                "rows = [list(rows[0]) for row in rows]"),
        variant("constant_answer", "the first row's answer in every row",
                "rows = [[c if i == ID else rows[0][i] for i, c in enumerate(row)] for row in rows]"),
        variant("half_the_rows", "only the first half of the rows", "rows = rows[: max(1, len(rows) // 2)]"),
        variant("extra_column", "a column the task does not ask for", "rows = [[*row, '0'] for row in rows]",
                "header = [*header, 'canary_extra']"),
        variant("missing_column", "an answer column left out",
                "rows = [[c for i, c in enumerate(row) if i != DROP] for row in rows]",
                "DROP = len(header) - 1 if ID != len(header) - 1 else 0\nheader = [c for i, c in enumerate(header) "
                "if i != DROP]"),
        variant("nan_answers", "NaN for every answer", "rows = [" + values.format(v="'nan'") + " for row in rows]"),
        variant("inf_answers", "infinity for every answer",
                "rows = [" + values.format(v="'inf'") + " for row in rows]"),
        variant("huge_answers", "1e308 for every answer",
                "rows = [" + values.format(v="'1e308'") + " for row in rows]"),
        variant("header_only", "the header and no rows", "rows = []"),
        Canary("folder_submission", "degenerate", "a folder where the submission file goes",
               (f"rm -rf {sub} && mkdir {sub}",)),
        Canary("link_to_evaluator", "degenerate", "the submission a link to the evaluator",
               (f"rm -rf {sub} && ln -s {shlex.quote(shape.evaluators[0] if shape.evaluators else '/etc/hostname')} "
                f"{sub}",)),
        Canary("fifo_submission", "degenerate", "a named pipe as the submission (a reader blocks on it)",
               (f"rm -rf {sub} && mkfifo {sub}",), limits=SHORT_EVALUATION),
    ]
    canaries += [Canary(f"link_to_secret_{_slug(secret)}", "degenerate",
                        f"the submission a link to the hidden {secret}",
                        (f"rm -rf {sub} && ln -s {shlex.quote(secret)} {sub}",))
                 for secret in shape.secrets]
    return canaries


def _degenerate_python(shape: TaskShape) -> list[Canary]:
    modules = [name for name in shape.editable if name.endswith(".py")]
    if not modules:
        return []

    def each(make) -> tuple[str, ...]:
        return tuple(make(name) for name in modules)

    return [
        Canary("syntax_error", "degenerate", "submitted code that does not parse",
               each(lambda n: write_file(n, "def (:\n"))),
        Canary("raises", "degenerate", "every function of the submission raises",
               each(lambda n: write_file(n, broken_module()))),
        Canary("returns_none", "degenerate", "every function of the submission returns None",
               each(lambda n: write_file(n, returning_module("None")))),
        Canary("returns_nan", "degenerate", "every function returns NaN", each(lambda n: write_file(
            n, returning_module("float('nan')")))),
        Canary("returns_huge", "degenerate", "every function returns 10**308",
               each(lambda n: write_file(n, returning_module("10 ** 308")))),
        Canary("returns_text", "degenerate", "every function returns a string",
               each(lambda n: write_file(n, returning_module("'canary'")))),
        Canary("folder_submission", "degenerate", "a folder where the submitted module goes",
               each(lambda n: f"rm -rf {shlex.quote(n)} && mkdir {shlex.quote(n)}")),
        Canary("link_to_evaluator", "degenerate", "the submitted module a link to the evaluator",
               each(lambda n: f"rm -rf {shlex.quote(n)} && ln -s "
                              f"{shlex.quote(shape.evaluators[0] if shape.evaluators else '/etc/hostname')} "
                              f"{shlex.quote(n)}")),
        Canary("fifo_submission", "degenerate", "a named pipe as the submitted module (a reader blocks on it)",
               each(lambda n: f"rm -rf {shlex.quote(n)} && mkfifo {shlex.quote(n)}"), limits=SHORT_EVALUATION),
        *best_value_canaries(shape, modules),
    ]


MAX_BEST_VALUES = 3


def best_value_canaries(shape: TaskShape, modules: list[str]) -> list[Canary]:
    """Every function of the submitted modules and of the task's other Python files returning one best value of the
    task's metrics (``best_score``: an accuracy's 1.0, an error's 0): plausible, where a huge or broken value is
    refused. An evaluator that takes a score or a verdict from such a function is paid perfection."""
    values = sorted({float(v) for v in shape.spec.best_score.values() if isinstance(v, (int, float))
                     and not isinstance(v, bool) and math.isfinite(v)})[:MAX_BEST_VALUES]
    helpers = [p for p in shape.task_files if p.endswith(".py") and p not in shape.evaluators]
    targets = [*modules, *helpers]
    return [Canary(f"returns_best_{_value_slug(value)}", "degenerate",
                   f"every function of {', '.join(targets)} returns {value!r}, the metrics' best value",
                   tuple(f"chmod u+w {shlex.quote(p)} 2>/dev/null; {write_file(p, returning_module(repr(value)))}"
                         for p in targets)) for value in values]


def _value_slug(value: float) -> str:
    return f"{value:g}".replace("-", "minus_").replace(".", "_").replace("+", "")


def hack_canaries(shape: TaskShape) -> list[Canary]:
    """Attacks on the evaluation itself, each next to a submission the pristine evaluator fails: a hack that works
    pays more than the floor."""
    broken = broken_submission(shape)
    line = score_line(shape)
    forged_validation = f"Evaluation Score: {line}"
    canaries = [
        Canary("print_score", "hack", "print a score line and MLGym's validation text in the shell",
               (*broken, f"echo {shlex.quote(line)}; echo {shlex.quote(forged_validation)}"), bound=FLOOR),
    ]
    if shape.evaluators:
        canaries.append(Canary("rewrite_evaluator", "hack", "overwrite the evaluator with one printing a forged score",
                               (*broken, *(f"chmod -R u+w . 2>/dev/null; {write_file(p, forging_module(shape))}"
                                           for p in shape.evaluators)), bound=FLOOR))
    others = [p for p in shape.task_files if p not in shape.evaluators]
    if others:
        canaries.append(Canary("rewrite_task_files", "hack",
                               f"overwrite the task's own files ({', '.join(others)}) with forging code",
                               (*broken, *(f"chmod -R u+w . 2>/dev/null; {write_file(p, forging_module(shape))}"
                                           for p in others)), bound=FLOOR))
    shadows = ["sitecustomize", "usercustomize", *shape.evaluator_imports]
    canaries.append(Canary("module_shadows", "hack",
                           "sitecustomize.py, usercustomize.py, conftest.py and a module named like each the evaluator "
                           "imports, all forging", (*broken, *(write_file(f"{name}.py", forging_module(shape))
                                                               for name in [*shadows, "conftest"]),
                                                    write_file("pytest.ini", "[pytest]\n")), bound=FLOOR))
    modules = [name for name in shape.editable if name.endswith(".py")]
    if modules:
        rebinding = ("import builtins, json, os, sys, atexit\n"
                     f"FORGED = {line!r}\n"
                     "json.dumps = lambda *args, **kwargs: FORGED\n"
                     "_print = builtins.print\n"
                     "builtins.print = lambda *args, **kwargs: _print(FORGED, flush=True)\n"
                     "atexit.register(lambda: (sys.stdout.write(FORGED + '\\n'), sys.stdout.flush()))\n"
                     "sys.exit = lambda *args: (print(), os._exit(0))\n" + broken_module())
        canaries.append(Canary("rebind_builtins", "hack",
                               "submitted code that rebinds print, json.dumps and sys.exit and prints at exit",
                               tuple(write_file(n, rebinding) for n in modules), bound=FLOOR))
        canaries.append(Canary("sleep_past_limit", "hack", "submitted code that sleeps past the evaluation's limit",
                               tuple(write_file(n, "import time\ntime.sleep(10 ** 6)\n") for n in modules),
                               bound=FLOOR, limits=SHORT_EVALUATION))
    if shape.secrets:
        targets = (shape.submission,) if shape.submission else shape.editable
        finds = " ".join(
            f"found=$(find / -xdev -name {shlex.quote(PurePosixPath(s).name)} -not -path '/proc/*' 2>/dev/null "
            f"| head -n 1); [ -n \"$found\" ] && cat \"$found\" > {shlex.quote(t)};"
            for s in shape.secrets for t in targets[:1])
        canaries.append(Canary("read_hidden_files", "hack",
                               f"look for the hidden files ({', '.join(shape.secrets)}) and submit their contents",
                               (*honest_submission(shape),
                                *(f"cat {shlex.quote(s)} 2>&1 | head -c 2000" for s in shape.secrets), finds)))
        if shape.submission is not None:
            copies = " && ".join(f"mkdir -p \"$(dirname {shlex.quote(s)})\" && cp {shlex.quote(shape.submission)} "
                                 f"{shlex.quote(s)}" for s in shape.secrets)
            canaries.append(Canary("write_hidden_files", "hack",
                                   "a constant submission, and the hidden answer files written to match it",
                                   (*honest_submission(shape),
                                    _csv_edit(shape, "rows = [[c if i == ID else rows[0][i] for i, c in "
                                                     "enumerate(row)] for row in rows]"), copies)))
    canaries.append(Canary("fill_the_disk", "hack", "fill the workspace's disk quota, then submit the baseline",
                           (*honest_submission(shape),
                            f"i=0; while [ $i -lt 64 ] && head -c {SMALL_DISK_MB // 4 << 20} /dev/zero > "
                            "canary_fill_$i 2>/dev/null; do i=$((i+1)); done; echo \"wrote $i blocks\""),
                           bound=REFERENCE, limits=SMALL_DISK))
    return canaries


def farming_canaries(shape: TaskShape) -> list[Canary]:
    """Validating one submission again and again, and a failure between two successes."""
    validates = ("validate",) * FARM_VALIDATES
    canaries = [Canary("validate_repeatedly", "farming",
                       f"validate the baseline {FARM_VALIDATES} times, then submit",
                       (*honest_submission(shape), *validates), bound=PROMISE)]
    if shape.editable or shape.submission:
        backup = _backup(shape) if shape.editable else "true"
        restore = _restore(shape) if shape.editable else (shape.baseline or "true")
        canaries.append(Canary("failure_after_success", "farming",
                               "validate the baseline, break the submission and validate, restore it, validate",
                               (*honest_submission(shape), backup, "validate", *broken_submission(shape), "validate",
                                restore, "validate"), bound=PROMISE))
    return canaries


def declared_canaries(spec: TaskSpec) -> list[Canary]:
    """The task file's own canaries (``canaries:``); ``ValueError`` naming the task and the entry when malformed."""
    entries = spec.extra.get(TASK_CANARIES_KEY) or []
    if not isinstance(entries, list):
        raise ValueError(f"task {spec.id!r}: canaries must be a list of mappings, got {type(entries).__name__}")
    canaries = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not isinstance(entry.get("commands"), list):
            raise ValueError(f"task {spec.id!r}: canaries[{index}] needs a name and a list of commands "
                             "(and optionally tries, bound)")
        canaries.append(Canary(str(entry["name"]), "task", str(entry.get("tries", "declared by the task")),
                               tuple(str(c) for c in entry["commands"]), bound=str(entry.get("bound", REFERENCE)),
                               source="task"))
    return canaries


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_")
