"""Validate and submit are scored on disjoint rows: ``validate`` cannot read the answers the final score is taken on.

MLGym scores ``validate`` on the same hidden rows as ``submit``, at full precision, so validate is an oracle: on
titanic, 25 validates that each flip one prediction learn 7 test labels (accuracy 0.806 -> 0.823 with the same
model), and with a continuous metric one validate gives a row's residual away. Here, for a task whose metric is a
mean over rows (a submission schema naming an ``id_column`` and the answers' ``rows_from`` file), the answers' ids
are split in two by a draw from the task and the episode's evaluation seed, which the agent never sees: validate is
scored on one part, submit (and the autosubmission) on the other, so what validates teach about their rows pays
nothing at submission. The split stays the same for every evaluation of an episode.

A task opts out with ``held_out_validation: false`` among its extras; ``validation_rows="all"`` (a backend option,
the user's) scores both on every row, as MLGym does, to reproduce its published numbers.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .submissions import submission_schema

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
    the answers ``answers`` (workspace paths), split by ``key`` (secret: it holds the evaluation seed). ``parse``
    reads an id as the schema does, so that two spellings of one id (``7``, ``007``) fall on the same side."""

    id_column: str
    answers: str
    submission: str
    key: str
    parse: Callable[[str], Any] = str.strip
    share: float = VALIDATE_SHARE

    def keeps(self, row_id: str, part: str) -> bool:
        """Whether the row ``row_id`` is scored by an evaluation of ``part`` (``validate`` or ``submit``)."""
        try:
            value = self.parse(row_id)
        except ValueError:
            value = row_id.strip()
        canonical = repr(int(value) if isinstance(value, float) and value.is_integer() else value)
        digest = hashlib.sha256(f"{self.key}\0{canonical}".encode()).digest()
        in_validate = int.from_bytes(digest[:8], "big") < self.share * 2**64
        return in_validate if part == VALIDATE else not in_validate

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


def row_split(spec: Any, evaluation_seed: int, validation_rows: str = "held_out") -> RowSplit | None:
    """The split of ``spec``'s answers for an episode of ``evaluation_seed``; None when the task's metric is not
    known to be a mean over rows (no schema with ``id_column`` and ``rows_from``), it opts out, or the user asked
    for every row (``validation_rows="all"``)."""
    if validation_rows not in VALIDATION_ROWS:
        raise ValueError(f"validation_rows={validation_rows!r}; use one of {', '.join(VALIDATION_ROWS)} ('all' "
                         "scores validate on the rows submit is scored on, as MLGym does)")
    extra = getattr(spec, "extra", None) or {}
    if validation_rows == "all" or extra.get(OPT_OUT) is False:
        return None
    schema = submission_schema(spec)
    if schema is None or schema.id_column is None or schema.rows_from is None:
        return None
    task = hashlib.sha256(spec.to_json().encode()).hexdigest()
    return RowSplit(schema.id_column, schema.rows_from, schema.file, f"{task}:{int(evaluation_seed)}",
                    schema.column(schema.id_column).parse)
