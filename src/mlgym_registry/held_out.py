"""Validate and submit are scored on disjoint rows: ``validate`` cannot read the answers the final score is taken on.

MLGym scores ``validate`` on the same hidden rows as ``submit``, at full precision, so validate is an oracle: on
titanic, 25 validates that each flip one prediction learn 7 test labels (accuracy 0.806 -> 0.823 with the same
model), and with a continuous metric one validate gives a row's residual away. Here, for a task whose metric is a
mean over rows (a submission schema naming an ``id_column`` and the answers' ``rows_from`` file), the answers' ids
are ranked by a draw from the task's id and the episode's evaluation seed, which the agent never sees: validate is
scored on the first half of them, submit (and the autosubmission) on the rest, so what validates teach about their
rows pays nothing at submission. The split stays the same for every evaluation of an episode.

Both parts always hold a row (answers with a single row are scored whole by both): a part with no rows would make an
honest submission's evaluation fail (a mean over nothing), which the agent would be charged for. The draw reads
nothing of where the task is installed, so machines that share the installation key (``seeding``) split a seeded
episode's rows alike, and its scores reproduce.

A task opts out with ``held_out_validation: false`` among its extras; ``validation_rows="all"`` (a backend option,
the user's) scores both on every row, as MLGym does, to reproduce its published numbers.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from .submissions import SubmissionSchemaError, submission_schema

OPT_OUT = "held_out_validation"
"""The task extra that turns the split off for a task (``false``): its evaluator reads rows of its own besides the
answers and the submission, which a split would leave inconsistent."""
VALIDATION_ROWS = ("held_out", "all")
"""The values of the backend option ``validation_rows``: disjoint rows (the default), or every row for both."""
VALIDATE_SHARE = 0.5
"""The share of the answers' rows validate is scored on; submit gets the rest."""
VALIDATE, SUBMIT = "validate", "submit"


@dataclass(frozen=True)
class RowSplit:
    """Which answer rows each kind of evaluation scores: ``id_column`` of the submission file ``submission`` and of
    the answers ``answers`` (workspace paths). ``validate_ids`` and ``submit_ids`` (``ranked``): the answers' ids,
    as ``canonical`` spells them, that each part scores. An id the answers do not hold falls on a side by its own
    draw. ``key`` (secret: it holds the evaluation seed) makes the draws; ``parse`` reads an id as the schema does,
    so that two spellings of one id (``7``, ``007``) fall on the same side."""

    id_column: str
    answers: str
    submission: str
    key: str
    parse: Callable[[str], Any] = str.strip
    share: float = VALIDATE_SHARE
    validate_ids: frozenset[str] = frozenset()
    submit_ids: frozenset[str] = frozenset()

    def ranked(self, ids: Iterable[Any]) -> RowSplit:
        """This split with the answers' ids ``ids`` (parsed as ``parse`` parses them) shared out: ranked by their
        draws, ``share`` of them (at least one) to validate and the rest (at least one) to submit; a single id to
        both, as no split of one row leaves each part something to score."""
        order = sorted({_canonical(value) for value in ids}, key=self._draw)
        if len(order) < 2:
            return replace(self, validate_ids=frozenset(order), submit_ids=frozenset(order))
        count = min(max(round(len(order) * self.share), 1), len(order) - 1)
        return replace(self, validate_ids=frozenset(order[:count]), submit_ids=frozenset(order[count:]))

    def canonical(self, row_id: str) -> str:
        """``row_id`` as the split knows it: parsed as the schema parses it (kept as written when it does not
        parse), integral numbers as integers."""
        try:
            return _canonical(self.parse(row_id))
        except ValueError:
            return _canonical(row_id.strip())

    def keeps(self, row_id: str, part: str) -> bool:
        """Whether the row ``row_id`` is scored by an evaluation of ``part`` (``validate`` or ``submit``)."""
        canonical = self.canonical(row_id)
        if canonical in self.validate_ids or canonical in self.submit_ids:
            return canonical in (self.validate_ids if part == VALIDATE else self.submit_ids)
        in_validate = self._draw(canonical) < self.share * 2**64
        return in_validate if part == VALIDATE else not in_validate

    def _draw(self, canonical: str) -> int:
        return int.from_bytes(hashlib.sha256(f"{self.key}\0{canonical}".encode()).digest()[:8], "big")

    def filtered(self, data: bytes, part: str) -> bytes:
        """The CSV ``data`` (the answers or the submission, a header line first) with only ``part``'s rows, in their
        order; unchanged when it has no ``id_column`` (the evaluator then says what is wrong, as it would)."""
        text = data.decode("utf-8-sig")
        rows = list(csv.reader(io.StringIO(text, newline="")))
        if not rows or self.id_column not in rows[0]:
            return data
        column = rows[0].index(self.id_column)
        out = io.StringIO(newline="")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(rows[0])
        writer.writerows(row for row in rows[1:] if row and column < len(row) and self.keeps(row[column], part))
        return out.getvalue().encode()


def row_split(spec: Any, evaluation_seed: int, validation_rows: str = "held_out",
              answers: Callable[[], bytes] | None = None) -> RowSplit | None:
    """The split of ``spec``'s answers for an episode of ``evaluation_seed``, ranked over the ids of what
    ``answers`` reads (the content of the task's pristine ``rows_from`` file, or ``SubmissionSchemaError``; without
    it, or when it fails, which the submission check reports, each id falls on a side by its own draw); None when
    the task's metric is not known to be a mean over rows (no schema with ``id_column`` and ``rows_from``), it opts
    out, or the user asked for every row (``validation_rows="all"``)."""
    if validation_rows not in VALIDATION_ROWS:
        raise ValueError(f"validation_rows={validation_rows!r}; use one of {', '.join(VALIDATION_ROWS)} ('all' "
                         "scores validate on the rows submit is scored on, as MLGym does)")
    extra = getattr(spec, "extra", None) or {}
    if validation_rows == "all" or extra.get(OPT_OUT) is False:
        return None
    schema = submission_schema(spec)
    if schema is None or schema.id_column is None or schema.rows_from is None:
        return None
    split = RowSplit(schema.id_column, schema.rows_from, schema.file, f"{spec.id}:{int(evaluation_seed)}",
                     schema.column(schema.id_column).parse)
    if answers is None:
        return split
    try:
        return split.ranked(schema.reference_ids(answers()))
    except SubmissionSchemaError:
        return split


def _canonical(value: Any) -> str:
    return repr(int(value) if isinstance(value, float) and value.is_integer() else value)
