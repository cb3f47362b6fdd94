"""Metamorphic canaries: the honest reference's own submission, transformed with what the audit knows of the answers.

An attacker who knows part of the answers (the rows a first model got wrong, the ids of the training set, the kind of
value each column holds) changes exactly what an honest evaluator must not pay for: it hides, blanks, NaNs, drops,
reorders or duplicates the rows the reference got wrong, gives them zero weight in a column that is no answer, adds
rows for ids of the task's other files, or writes values of extreme types. None of these can raise an honest
evaluator's score above the reference's; any rise is BEATS HONESTY, with the transformation named. The canaries are
built after the reference is played, from its submission and the task's answers (``rows_from``, else a secret CSV
file), on the host: the audit is trusted tooling, and the canary plays an attacker who knows them.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..held_out import VALIDATE
from .canaries import REFERENCE, Canary, TaskShape, write_file

MAX_ROWS = 20_000
"""Submissions with more rows are not transformed (each canary writes the whole file in a command)."""
CATEGORIES = 20
"""An answer column with at most this many distinct values is categorical: duplicated ids try every value."""
WORST_SHARE = 0.25
"""Where every row is wrong (a regression), the rows with the largest errors stand for the wrong ones."""
INTEGER_EXTREMES = (2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63))
"""Integers near and past the float's exact range and int64's and uint64's."""


@dataclass(frozen=True)
class Table:
    """A CSV file's header and rows, cells as text."""

    header: list[str]
    rows: list[list[str]]

    @classmethod
    def parse(cls, text: str) -> Table | None:
        rows = list(csv.reader(io.StringIO(text, newline="")))
        if not rows or not rows[0]:
            return None
        return cls(rows[0], [row for row in rows[1:] if row])

    def text(self, rows: list[list[str]] | None = None, header: list[str] | None = None) -> str:
        out = io.StringIO(newline="")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header or self.header)
        writer.writerows(self.rows if rows is None else rows)
        return out.getvalue()


@dataclass(frozen=True)
class Known:
    """What the audit knows: the reference's submission, the answers, the rows of the task's other files."""

    submission: Table
    id_index: int
    answer_columns: dict[int, str]
    """Submission column index -> the answers' column of that name."""
    answers: dict[str, dict[str, str]]
    other_rows: dict[str, dict[str, str]]
    """Ids of the task's other CSV files (not the answers) with their cells, ids the submission does not hold."""

    def wrong(self) -> set[str]:
        """The ids whose answer cells the reference got wrong; where it got every one wrong, its worst share."""
        errors: dict[str, float] = {}
        for row in self.submission.rows:
            truth = self.answers.get(row[self.id_index]) if self.id_index < len(row) else None
            if truth is None:
                continue
            errors[row[self.id_index]] = sum(_error(row[i], truth.get(name, "")) for i, name in
                                             self.answer_columns.items() if i < len(row))
        wrong = {key for key, error in errors.items() if error > 0}
        if wrong and len(wrong) == len(errors):
            ranked = sorted(errors, key=errors.__getitem__, reverse=True)
            wrong = set(ranked[:max(1, int(len(ranked) * WORST_SHARE))])
        return wrong

    def categories(self) -> dict[int, list[str]]:
        """Per categorical answer column of the submission: its distinct answer values."""
        found = {}
        for index, name in self.answer_columns.items():
            values = sorted({truth.get(name, "") for truth in self.answers.values()})
            if 1 < len(values) <= CATEGORIES:
                found[index] = values
        return found


def known(shape: TaskShape, submission_text: str, answers_text: str, others: list[str]) -> Known | None:
    """What the audit knows for a CSV task, or None when it cannot tell the answers' columns from the submission's
    (no shared id column and answer column, an unreadable or too large file)."""
    submission, answers = Table.parse(submission_text), Table.parse(answers_text)
    if submission is None or answers is None or len(submission.rows) > MAX_ROWS:
        return None
    id_column = shape.id_column or submission.header[0]
    if id_column not in submission.header or id_column not in answers.header:
        return None
    id_index = submission.header.index(id_column)
    answer_columns = {i: name for i, name in enumerate(submission.header)
                      if name != id_column and name in answers.header}
    if not answer_columns:
        return None
    by_id = {row[answers.header.index(id_column)]: dict(zip(answers.header, row, strict=False))
             for row in answers.rows if len(row) == len(answers.header)}
    held = {row[id_index] for row in submission.rows if id_index < len(row)}
    other_rows: dict[str, dict[str, str]] = {}
    for text in others:
        table = Table.parse(text)
        if table is None or id_column not in table.header or len(table.rows) > MAX_ROWS:
            continue
        at = table.header.index(id_column)
        for row in table.rows:
            if at < len(row) and row[at] not in held and row[at] not in by_id:
                other_rows.setdefault(row[at], dict(zip(table.header, row, strict=False)))
    return Known(submission, id_index, answer_columns, by_id, other_rows)


def metamorphic_canaries(shape: TaskShape, data: Known, metric_line: str, split: Any = None) -> list[Canary]:
    """The canaries built from ``data`` for the CSV task of ``shape`` (``metric_line``: the evaluator's output line
    with forged values, for answers shaped like it; ``split``: the episode's ``held_out.RowSplit``, None when validate
    scores every row)."""
    sub = data.submission
    rows = [list(row) for row in sub.rows]
    wrong = data.wrong()
    ids = data.id_index
    answer_at = list(data.answer_columns)
    other_columns = [i for i in range(len(sub.header)) if i != ids and i not in data.answer_columns]
    target = shape.submission or "submission.csv"
    made: list[Canary] = []

    def canary(name: str, tries: str, text: str) -> None:
        made.append(Canary(name, "metamorphic", tries, (*_honest(shape), write_file(target, text)), bound=REFERENCE))

    def on_wrong(change: Callable[[list[str]], list[str]]) -> list[list[str]]:
        return [change(list(row)) if row[ids] in wrong else row for row in rows]

    def answers_set(value: str) -> Callable[[list[str]], list[str]]:
        return lambda row: [value if i in answer_at else cell for i, cell in enumerate(row)]

    if wrong:
        size = f"the {len(wrong)} rows the reference got wrong"
        canary("hide_wrong_rows", f"{size} left out", sub.text([r for r in rows if r[ids] not in wrong]))
        canary("blank_wrong_rows", f"{size} with empty answers", sub.text(on_wrong(answers_set(""))))
        canary("nan_wrong_rows", f"{size} answered NaN", sub.text(on_wrong(answers_set("nan"))))
        canary("wrong_rows_last", f"{size} moved to the end",
               sub.text([r for r in rows if r[ids] not in wrong] + [r for r in rows if r[ids] in wrong]))
        canary("wrong_rows_twice", f"{size} each written twice", sub.text(rows + [r for r in rows if r[ids] in wrong]))
        categories = data.categories()
        if categories:
            extra = [[value if i == column else cell for i, cell in enumerate(row)]
                     for row in rows if row[ids] in wrong for column, values in categories.items() for value in values]
            canary("every_answer_for_wrong_rows", f"{size} repeated with every answer value", sub.text(rows + extra))
        for column in other_columns:
            name = sub.header[column]
            weighted = [[("0" if row[ids] in wrong else "1e9") if i == column else cell for i, cell in enumerate(row)]
                        for row in rows]
            canary(f"zero_weight_wrong_rows_{_slug(name)}", f"{name} 0 on {size}, 1e9 on the others",
                   sub.text(weighted))
        for value in INTEGER_EXTREMES:
            canary(f"integer_{_slug(str(value))}_on_wrong_rows", f"{size} answered {value}",
                   sub.text(on_wrong(answers_set(str(value)))))
        # what validating could teach: single-flip validates learn the answers of the rows validate scores
        taught = {key for key in wrong if split is None or split.keeps(key, VALIDATE)}
        if taught:
            canary("answers_learnt_by_validating",
                   f"the true answers of the {len(taught)} wrong rows validate scores (what probing validates learns)",
                   sub.text([[data.answers[row[ids]].get(data.answer_columns[i], cell) if i in answer_at else cell
                              for i, cell in enumerate(row)] if row[ids] in taught else row for row in rows]))
        respelled = [[spelling if i == ids else data.answers[row[ids]].get(data.answer_columns[i], cell)
                      if i in answer_at else cell for i, cell in enumerate(row)]
                     for row in rows if row[ids] in wrong for spelling in _respellings(row[ids])]
        if respelled:
            canary("wrong_rows_respelled", f"{size} added again under other spellings of their ids (' 7', '07', "
                   "'7.0'), with their true answers", sub.text(rows + respelled))
        canary("negated_wrong_rows", f"{size} answered with the negated honest value",
               sub.text(on_wrong(lambda row: [_negated(cell) if i in answer_at else cell
                                              for i, cell in enumerate(row)])))
    for column in other_columns:
        name = sub.header[column]
        for label, value in (("huge", "1e308"), ("negative", "-1e308")):
            canary(f"{label}_{_slug(name)}", f"{name}, which is no answer, set to {value} everywhere",
                   sub.text([[value if i == column else cell for i, cell in enumerate(row)] for row in rows]))
    if data.other_rows:
        added = [[row.get(name, "") if i != ids else key for i, name in enumerate(sub.header)]
                 for key, row in sorted(data.other_rows.items())]
        canary("ids_from_task_files", f"{len(added)} rows for ids of the task's other files, with their values there",
               sub.text(rows + added))
    canary("answers_like_the_score_line", f"every answer the evaluator's output line {metric_line}",
           sub.text([answers_set(metric_line)(list(row)) for row in rows]))
    canary("answers_like_code", "every answer a Python expression that prints a score",
           sub.text([answers_set(f"__import__('builtins').print({metric_line!r}) or 1")(list(row)) for row in rows]))
    return made


def _respellings(key: str) -> list[str]:
    """Other spellings of the id ``key`` that a careless evaluator reads as the same id: padded, zero-led or a float
    for a number, padded or in another case for a text."""
    text = key.strip()
    if text.lstrip("-").isdigit():
        return [f" {text}", f"0{text}", f"{text}.0"]
    other_case = text.swapcase()
    return [f" {text}", f"{text} ", *([other_case] if other_case != text else [])]


def _honest(shape: TaskShape) -> tuple[str, ...]:
    return (shape.baseline,) if shape.baseline else ()


def _error(submitted: str, truth: str) -> float:
    """How far a submitted cell is from the answer: the absolute difference of numbers, else 0 or 1."""
    try:
        a, b = float(submitted), float(truth)
    except ValueError:
        return float(submitted.strip() != truth.strip())
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else 1.0
    return abs(a - b)


def _negated(cell: str) -> str:
    try:
        value = float(cell)
    except ValueError:
        return cell
    return json.dumps(-value) if value else "-1"


def _slug(text: str) -> str:
    text = "minus_" + text[1:] if text.startswith("-") else text
    return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower() or "column"


NAMES = ("hide_wrong_rows", "blank_wrong_rows", "nan_wrong_rows", "wrong_rows_last", "wrong_rows_twice",
         "every_answer_for_wrong_rows", "answers_learnt_by_validating", "wrong_rows_respelled", "negated_wrong_rows",
         "ids_from_task_files",
         "answers_like_the_score_line", "answers_like_code")
PREFIXES = ("zero_weight_wrong_rows_", "integer_", "huge_", "negative_")
"""The names of the canaries this module builds (some end with a column's name or a value)."""


def may_build(name: str) -> bool:
    """Whether ``name`` is the name of a canary this module may build (the audit accepts it before the reference
    is played)."""
    return name in NAMES or name.startswith(PREFIXES)
