"""A task's declared submission schema, and the check of a submission against it before its evaluator runs.

MLGym's evaluators trust the file they score: titanic's checks only its columns and its row count, so 418 rows that
all name one passenger score accuracy 1.0. A task that declares ``submission:`` (see docs/tasks.md) gets its
submission checked first: the columns, a valid value in every cell, ids unique and equal to the ids of a reference
file (the answers, read from the evaluator's pristine copy), the row count, the size. A submission that breaks a rule
is not evaluated (``SubmissionRejected``, the agent's failure); a malformed schema is refused when the task is loaded
(``SubmissionSchemaError``). This module is pure: the local backend reads the files (``submission_check.py``).
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, NoReturn

from .errors import InvalidTaskError

FORMATS = ("csv",)
COLUMN_TYPES = ("text", "number", "integer")
DEFAULT_MAX_BYTES = 16 << 20
NUMBER_LIMIT = 1e100
"""The default bound of a number column (either sign): an evaluator's squares and sums of such numbers stay finite."""
MISSING = frozenset({
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA",
    "NULL", "NaN", "None", "n/a", "nan", "null",
})
"""Cells that pandas' ``read_csv`` reads as a missing value (its default ``na_values``): never a valid value."""
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
KEYS = ("file", "format", "columns", "id_column", "rows_from", "ordered", "rows", "max_bytes")


class SubmissionSchemaError(InvalidTaskError):
    """A task's ``submission:`` schema that is malformed; the message names the task, the key and the fix."""


class SubmissionRejected(ValueError):
    """A submission that breaks its task's schema; ``rule`` names the rule (``ids``, ``columns``, ...) and the
    message says what is wrong and how to fix it, for the agent to read."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class ColumnRule:
    """What every cell of one column must hold: ``text`` (any value), a ``number`` (finite, within ``min``/``max``,
    by default +/- ``NUMBER_LIMIT``) or an ``integer``; with ``values``, one of them. No cell may be missing."""

    name: str
    type: str = "text"
    values: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None

    def parse(self, cell: str) -> Any:
        """The value of ``cell`` (an int for integers, a float for numbers, the text for text); ``ValueError``
        saying what is wrong."""
        if cell in MISSING or cell.strip() in MISSING:
            raise ValueError(f"{self.name} is missing ({cell!r}); every row needs a value")
        if self.type == "text":
            value: Any = cell
        else:
            text = cell.strip()
            if _INTEGER.fullmatch(text):
                value = int(text)
            elif _NUMBER.fullmatch(text):
                value = float(text)
                if not math.isfinite(value):
                    raise ValueError(f"{self.name} {cell!r} is not a finite number")
                if self.type == "integer":
                    if not value.is_integer():
                        raise ValueError(f"{self.name} {cell!r} is not an integer")
                    value = int(value)
            else:
                raise ValueError(f"{self.name} {cell!r} is not a {'number' if self.type == 'number' else 'integer'}"
                                 " (plain decimal digits; nan and inf are not numbers here)")
        if self.values is not None:
            if value not in self.values:
                raise ValueError(f"{self.name} {cell!r} is not one of {', '.join(map(str, self.values))}")
            return value
        if self.type != "text":
            low = self.min if self.min is not None else -NUMBER_LIMIT
            high = self.max if self.max is not None else NUMBER_LIMIT
            if not low <= value <= high:
                raise ValueError(f"{self.name} {cell!r} is outside [{low:g}, {high:g}]")
        return value


@dataclass(frozen=True)
class SubmissionSchema:
    """A task's submission: the workspace file its evaluator reads (``file``), its ``format`` (``csv``), its
    ``columns`` (exactly these, each with its rule), the ``id_column`` (unique ids), ``rows_from`` (a workspace file
    of the task's own, e.g. its answers: the submission holds one row per row of it, with the same ids, in its order
    when ``ordered``), ``rows`` (an exact row count, for a task without such a file) and ``max_bytes``."""

    task: str
    columns: tuple[ColumnRule, ...]
    file: str = "submission.csv"
    format: str = "csv"
    id_column: str | None = None
    rows_from: str | None = None
    ordered: bool = False
    rows: int | None = None
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_dict(cls, task: str, data: Any) -> SubmissionSchema:
        """The schema a task file's ``submission:`` mapping declares; ``SubmissionSchemaError`` when malformed."""

        def fail(problem: str) -> SubmissionSchemaError:
            return SubmissionSchemaError(f"task {task!r}: submission: {problem} (see 'Declaring the submission' in "
                                         "docs/tasks.md)")

        if not isinstance(data, Mapping):
            raise fail(f"must be a mapping of {', '.join(KEYS)}, got {type(data).__name__}")
        for key in data:
            if key not in KEYS:
                close = difflib.get_close_matches(str(key), KEYS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; the keys are {', '.join(KEYS)}"
                raise fail(f"unknown key {key!r}{hint}")
        file = _relative(data.get("file", "submission.csv"), "file", fail)
        rows_from = _relative(data["rows_from"], "rows_from", fail) if data.get("rows_from") is not None else None
        if data.get("format", "csv") not in FORMATS:
            raise fail(f"format {data.get('format')!r} is not supported; use {', '.join(FORMATS)}")
        columns = _columns(data.get("columns"), fail)
        names = [c.name for c in columns]
        id_column = data.get("id_column")
        if id_column is not None and id_column not in names:
            raise fail(f"id_column {id_column!r} is none of the columns ({', '.join(names)}); add it to columns")
        ordered = data.get("ordered", False)
        if not isinstance(ordered, bool):
            raise fail(f"ordered must be true or false, got {ordered!r}")
        if ordered and (rows_from is None or id_column is None):
            raise fail("ordered needs rows_from and id_column: the order is that of rows_from's ids")
        if rows_from is not None and id_column is None:
            raise fail("rows_from needs an id_column, the column whose ids must equal those of rows_from")
        rows = data.get("rows")
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            raise fail(f"rows must be a positive integer, got {rows!r}")
        if rows is not None and rows_from is not None:
            raise fail("give rows or rows_from, not both: rows_from's row count is the submission's")
        max_bytes = data.get("max_bytes", DEFAULT_MAX_BYTES)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise fail(f"max_bytes must be a positive integer, got {max_bytes!r}")
        return cls(task=task, columns=columns, file=file, id_column=id_column, rows_from=rows_from,
                   ordered=ordered, rows=rows, max_bytes=max_bytes)

    def column(self, name: str) -> ColumnRule:
        """The rule of the column ``name``."""
        return next(c for c in self.columns if c.name == name)

    def check(self, data: bytes, reference: bytes | None = None) -> int:
        """Check a submission's bytes (``reference``: those of ``rows_from``); its row count, or
        ``SubmissionRejected`` naming the first rule it breaks. A malformed ``reference`` is the task's fault:
        ``SubmissionSchemaError``. The rows are read one at a time and no more of them than the task expects."""
        if len(data) > self.max_bytes:
            self._reject("size", f"{len(data)} bytes, more than the {self.max_bytes} allowed")
        wanted = self.reference_ids(reference) if self.rows_from is not None and reference is not None else None
        most = len(wanted) if wanted is not None else self.rows
        header, rows = self._rows(data)
        self._check_header(header)
        rules = [self.column(name) for name in header]
        id_index = header.index(self.id_column) if self.id_column is not None else None
        ids: list[Any] = []
        count = 0
        for line, row in rows:
            count += 1
            if most is not None and count > most:
                self._reject("rows", f"more than {most} rows; {self._rows_wanted(most)}")
            if len(row) != len(header):
                self._reject("rows", f"line {line} has {len(row)} fields, the header {len(header)}")
            for index, (rule, cell) in enumerate(zip(rules, row, strict=True)):
                try:
                    value = rule.parse(cell)
                except ValueError as exc:
                    self._reject("values", f"line {line}: {exc}")
                if index == id_index:
                    ids.append(value)
        if not count:
            self._reject("rows", "it has a header but no rows")
        if self.id_column is not None:
            self._check_unique(ids)
        if most is not None and count != most:
            self._reject("rows", f"{_count(count)}; {self._rows_wanted(most)}")
        if wanted is not None:
            self._check_same_ids(ids, wanted)
        return count

    def reference_ids(self, reference: bytes) -> list[Any]:
        """The ids of ``rows_from`` (the task's file), parsed as the id column's values; ``SubmissionSchemaError``
        when it is no CSV file with that column, unique non-missing ids and at least one row."""
        assert self.id_column is not None
        try:
            header, lines = self._rows(reference)
            rows = list(lines)
        except SubmissionRejected as exc:
            raise self._task_error(str(exc)) from None
        if self.id_column not in header:
            raise self._task_error(f"it has no column {self.id_column!r} (its header is {header})")
        index, rule = header.index(self.id_column), self.column(self.id_column)
        try:
            ids = [rule.parse(row[index]) for _line, row in rows]
        except (ValueError, IndexError) as exc:
            raise self._task_error(f"an id of it is invalid: {exc}") from None
        if not ids or len(set(ids)) != len(ids):
            raise self._task_error(f"its {len(ids)} ids are not unique and non-empty")
        return ids

    # -- internals -------------------------------------------------------------------------------------------------
    def _check_header(self, header: list[str]) -> None:
        expected = [c.name for c in self.columns]
        if sorted(header) == sorted(expected) and len(set(header)) == len(header):
            return
        missing = [n for n in expected if n not in header]
        extra = [n for n in header if n not in expected]
        doubled = sorted({n for n in header if header.count(n) > 1})
        parts = [f"missing {missing}"] * bool(missing) + [f"extra {extra}"] * bool(extra)
        parts += [f"repeated {doubled}"] * bool(doubled)
        hint = (" (an index column: write the file without it, e.g. pandas' to_csv(..., index=False))"
                if any(n == "" or n.startswith("Unnamed") for n in extra) else "")
        self._reject("columns", f"the header is {header}; it must name exactly the columns {expected} "
                     f"({', '.join(parts)}){hint}")

    def _rows_wanted(self, count: int) -> str:
        if self.rows_from is not None:
            return f"{self.rows_from} has {count}: one row per {self.id_column} of {self.rows_from}"
        return f"it must have exactly {count}"

    def _check_unique(self, ids: list[Any]) -> None:
        name, source = self.id_column, self.rows_from
        distinct = set(ids)
        if len(distinct) != len(ids):
            every = f"every {name} of {source} must appear once" if source else f"each {name} may appear once"
            doubled = [str(i) for i, count in Counter(ids).most_common(3) if count > 1]
            example = f" (repeated: {', '.join(doubled)})" if doubled else ""
            self._reject("ids", f"{_count(len(ids))} but {len(distinct)} distinct {name}{example}; {every}")

    def _check_same_ids(self, ids: list[Any], wanted: list[Any]) -> None:
        name, source = self.id_column, self.rows_from
        distinct, known = set(ids), set(wanted)
        if distinct != known:
            missing = [i for i in wanted if i not in distinct]
            unknown = [i for i in ids if i not in known]
            self._reject("ids", f"its {name}s are not those of {source}: {len(missing)} missing (e.g. "
                         f"{', '.join(map(str, missing[:3]))}), {len(unknown)} unknown (e.g. "
                         f"{', '.join(map(str, unknown[:3]))}); write one row per {name} of {source}")
        if self.ordered and ids != wanted:
            at = next(n for n, (a, b) in enumerate(zip(ids, wanted, strict=True)) if a != b)
            self._reject("order", f"row {at + 1} has {name} {ids[at]}, {source} has {wanted[at]} there; the rows "
                         f"must follow the order of {source} (the evaluator pairs rows by position)")

    def _rows(self, data: bytes) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
        """The header of CSV bytes, and their other non-blank rows (each with its line number), read lazily."""
        if not data.strip():
            self._reject("empty", "the file is empty; write a header line and one row per prediction")
        if b"\0" in data:
            self._reject("format", "it holds NUL bytes: it is no CSV text file")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            self._reject("format", f"it is not UTF-8 text ({exc.reason} at byte {exc.start})")
        reader = csv.reader(io.StringIO(text, newline=""))

        def rows() -> Iterator[tuple[int, list[str]]]:
            try:
                for row in reader:
                    if row:
                        yield reader.line_num, row
            except csv.Error as exc:
                self._reject("format", f"it is not valid CSV (line {reader.line_num}: {exc})")

        lines = rows()
        first = next(lines, None)
        if first is None:
            self._reject("empty", "the file holds no header line")
        return first[1], lines

    def rejection(self, rule: str, problem: str) -> SubmissionRejected:
        """The rejection of a submission that breaks ``rule``: its message says what is wrong (``problem``)."""
        return SubmissionRejected(rule, f"Invalid submission: {self.file} was not evaluated. {rule}: {problem}. "
                                        f"Fix {self.file} and validate again.")

    def _reject(self, rule: str, problem: str) -> NoReturn:
        raise self.rejection(rule, problem)

    def _task_error(self, problem: str) -> SubmissionSchemaError:
        return SubmissionSchemaError(f"task {self.task!r}: submission.rows_from {self.rows_from!r}: {problem}; "
                                     "the task's reference file must list every expected id once")


def submission_schema(spec: Any) -> SubmissionSchema | None:
    """The parsed ``submission`` schema of a task spec (None when it declares none)."""
    data = getattr(spec, "submission", None)
    if data is None:
        return None
    schema = SubmissionSchema.from_dict(str(spec.id), data)
    if getattr(spec, "task_entrypoint", None) == "CSVSubmissionTasks" and schema.file != "submission.csv":
        raise SubmissionSchemaError(
            f"task {spec.id!r}: submission: file {schema.file!r}, but a CSVSubmissionTasks evaluator is given "
            "submission.csv; set file: submission.csv (or leave it out) (see 'Declaring the submission' in "
            "docs/tasks.md)"
        )
    return schema


def _count(rows: int) -> str:
    return f"{rows} row" if rows == 1 else f"{rows} rows"


def _relative(value: Any, key: str, fail) -> str:
    path = PurePosixPath(str(value)) if isinstance(value, str) and value.strip() else None
    if path is None or path.is_absolute() or ".." in path.parts or str(path) in ("", "."):
        raise fail(f"{key} must be a path inside the workspace (relative, without '..'), got {value!r}")
    return str(path)


def _columns(data: Any, fail) -> tuple[ColumnRule, ...]:
    if not isinstance(data, Mapping) or not data:
        raise fail("columns must be a non-empty mapping of column name to its type (text, number or integer) or "
                   "to a mapping with type, values, min and max; e.g. {PassengerId: integer, Survived: {values: "
                   f"[0, 1]}}}}, got {data!r}")
    return tuple(_column(str(name), rule, fail) for name, rule in data.items())


def _column(name: str, rule: Any, fail) -> ColumnRule:
    if isinstance(rule, str):
        rule = {"type": rule}
    if not isinstance(rule, Mapping):
        raise fail(f"column {name!r}: give a type (text, number, integer) or a mapping, got {rule!r}")
    unknown = set(rule) - {"type", "values", "min", "max"}
    if unknown:
        raise fail(f"column {name!r}: unknown key(s) {sorted(unknown)}; a column takes type, values, min and max")
    values, numeric = rule.get("values"), False
    if values is not None:
        if not isinstance(values, list) or not values or any(isinstance(v, bool) or
                                                             not isinstance(v, (int, float, str)) for v in values):
            raise fail(f"column {name!r}: values must be a non-empty list of numbers or strings, got {values!r}")
        numeric = all(isinstance(v, (int, float)) for v in values)
        if not numeric and any(isinstance(v, (int, float)) for v in values):
            raise fail(f"column {name!r}: values mixes numbers and strings ({values!r}); use one kind")
    kind = rule.get("type", ("number" if numeric else "text") if values is not None else "text")
    if kind not in COLUMN_TYPES:
        raise fail(f"column {name!r}: type {kind!r} is not one of {', '.join(COLUMN_TYPES)}")
    if values is not None and (kind == "text") == numeric:
        raise fail(f"column {name!r}: values {values!r} do not fit its type {kind!r}")
    bounds = {}
    for key in ("min", "max"):
        bound = rule.get(key)
        if bound is not None:
            if kind == "text" or isinstance(bound, bool) or not isinstance(bound, (int, float)) \
                    or not math.isfinite(bound):
                raise fail(f"column {name!r}: {key} must be a finite number, on a number or integer column; "
                           f"got {bound!r}")
            bounds[key] = float(bound)
    if bounds.get("min", -math.inf) > bounds.get("max", math.inf):
        raise fail(f"column {name!r}: min {bounds['min']:g} is above max {bounds['max']:g}")
    return ColumnRule(name=name, type=kind, values=tuple(values) if values is not None else None, **bounds)


MODEL_CHECKPOINTS = "checkpoints"
"""The folder MLGym's model-submission tasks save their checkpoints in, part of such a task's default submission."""


def declared_submission(spec: Any) -> list[str]:
    """The workspace paths the evaluator of ``spec`` takes from the agent: its ``submission_files`` when it declares
    them, else its entrypoint's default. Everything else the evaluator sees is the task's own pristine files.

    The defaults: a CSV task's submission file (``submission.csv``, or its schema's ``file``); a Python task's
    starter files the agent is asked to change (of the starter files that are neither evaluation, protected nor
    secret files, those its description names, such as ``strategy.py``; all of them when it names none) and its
    schema's ``file`` when it declares one; a model task's same, its ``checkpoints`` folder and the configuration the
    evaluation is given (``Evaluator`` adds the last, which it finds at each evaluation). A helper module of the
    task's that the description does not name is then the task's own, whatever the agent writes in its copy.
    """
    declared = getattr(spec, "submission_files", None)
    if declared is not None:
        return [_declared_path(str(spec.id), path) for path in declared]
    entrypoint = getattr(spec, "task_entrypoint", "")
    schema = submission_schema(spec)
    if entrypoint == "CSVSubmissionTasks":
        return [schema.file if schema is not None else "submission.csv"]
    editable = editable_starter_files(spec)
    named = [name for name in editable if name in (getattr(spec, "description", "") or "")]
    declared = [*(named or editable), *([schema.file] if schema is not None else [])]
    if entrypoint == "ModelSubmissionTasks":
        declared.append(MODEL_CHECKPOINTS)
    return list(dict.fromkeys(declared))


def editable_starter_files(spec: Any) -> list[str]:
    """The workspace names of ``spec``'s starter files that the agent may change: not an evaluation, protected or
    secret file (starter files land at the workspace's top level under their own names)."""
    fixed = {_workspace_path(p) for p in (*spec.evaluation_paths, *spec.protected_files, *spec.secret_files)}
    names = [PurePosixPath(str(item)).name for item in spec.starter_code]
    return [name for name in dict.fromkeys(names) if name not in fixed]


def _workspace_path(path: str) -> str:
    """A workspace-relative path as the evaluator's view keys it (no ``./``, no trailing slash)."""
    return str(PurePosixPath(str(path))).removeprefix("./").rstrip("/") or "."


def _declared_path(task: str, path: str) -> str:
    """A ``submission_files`` entry as a workspace path; ``SubmissionSchemaError`` when it leaves the workspace."""
    pure = PurePosixPath(str(path))
    if pure.is_absolute() or ".." in pure.parts or _workspace_path(path) == ".":
        raise SubmissionSchemaError(
            f"task {task!r}: submission_files entry {str(path)!r} is not a path inside the workspace; name the "
            "files, folders or modules the evaluator reads from the agent relative to the workspace "
            "(e.g. submission.csv, strategy.py, checkpoints)")
    return _workspace_path(path)
