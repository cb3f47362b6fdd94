"""MLGym's published tables beside the runs a report reads, and how the report's numbers compare with them.

An MLGym checkout holds its runs (``trajectories/mlgym_bench_v0``) and the tables its ``get_ranks.py`` computed from
them (``results/tables/{best_scores,last_scores,aup_scores}_<name>.csv``, one set per ``<name>``: ``test_results``,
``aggregate_results``). When a folder given to ``report`` lies in such a checkout, each set of tables is compared cell
by cell with the report's (to the tables' 3 decimals), and the report says which cells differ and why they may.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..records.regular_files import read_regular_text
from .metrics import Leaderboard, Score

TABLES_DIR = Path("results", "tables")
"""Where an MLGym checkout keeps its published tables."""
LEVELS_UP = 3
"""How many folders above a reported folder are searched for ``results/tables`` (``<root>/trajectories/<set>``)."""
TOLERANCE = 5e-4
"""Half a unit of the tables' last decimal: a cell matches when the unrounded number is this close."""
SHOWN = 12
"""At most this many differing cells are named in a note."""
SCORE_TABLES = ("best_scores", "last_scores")
AUP_TABLE = "aup_scores"
DOCS = "\"Reproducing MLGym's tables\" in docs/evaluation.md"


@dataclass(frozen=True)
class PublishedTables:
    """One set of MLGym's published tables: ``<folder>/{best_scores,last_scores,aup_scores}_<name>.csv``."""

    folder: Path
    name: str
    tables: dict[str, list[list[str]]]
    """Table kind (``best_scores``, ``last_scores``, ``aup_scores``) -> its CSV rows, header first."""

    @property
    def pattern(self) -> str:
        """The tables' paths, as one glob."""
        return str(self.folder / f"*_{self.name}.csv")


@dataclass(frozen=True)
class CellDiff:
    """A published cell the report does not reproduce."""

    table: str
    row: str
    column: str
    published: str
    ours: Score


@dataclass
class Comparison:
    """How many cells of each published table were compared, and those that differ."""

    published: PublishedTables
    compared: dict[str, int] = field(default_factory=dict)
    differing: list[CellDiff] = field(default_factory=list)
    aup_skipped: str | None = None
    """Why the AUP table was not compared (other models or tasks than the published ones), None when it was."""

    def matched(self, table: str) -> int:
        """Cells of ``table`` that match."""
        return self.compared.get(table, 0) - sum(1 for d in self.differing if d.table == table)


def find_published(folders: Iterable[str | Path], levels_up: int = LEVELS_UP) -> list[PublishedTables]:
    """Every set of published tables in ``results/tables`` of the given folders or of their parents (up to
    ``levels_up`` levels), each once."""
    found: dict[tuple[Path, str], PublishedTables] = {}
    for folder in folders:
        here = Path(folder).resolve()
        for candidate in [here, *here.parents][: levels_up + 1]:
            tables = candidate / TABLES_DIR
            for path in sorted(tables.glob(f"{SCORE_TABLES[0]}_*.csv")) if tables.is_dir() else ():
                name = path.stem[len(SCORE_TABLES[0]) + 1 :]
                if (tables, name) not in found:
                    published = read_published(tables, name)
                    if published is not None:
                        found[(tables, name)] = published
    return list(found.values())


def read_published(folder: Path, name: str) -> PublishedTables | None:
    """The set ``<folder>/*_<name>.csv``; None when a table is missing, unreadable or not shaped like MLGym's."""
    tables = {}
    for kind in (*SCORE_TABLES, AUP_TABLE):
        try:
            text = read_regular_text(folder / f"{kind}_{name}.csv", within=folder)  # never a FIFO or device
            rows = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
        except (OSError, UnicodeDecodeError, csv.Error):
            return None
        first = "Model" if kind == AUP_TABLE else "Task"
        if not rows or rows[0][0] != first or any(len(row) != len(rows[0]) for row in rows):
            return None
        tables[kind] = rows
    return PublishedTables(folder, name, tables)


def _matches(cell: str, value: Score) -> bool:
    if cell.strip() == "" or cell.strip().lower() == "nan":
        return value is None
    try:
        published = float(cell)
    except ValueError:
        return False
    # inclusive: MLGym rounds halves (0.8855) either way, numpy's for the models' cells and Python's for the baseline
    return value is not None and abs(value - published) <= TOLERANCE + 1e-9 * max(1.0, abs(value))


def compare(board: Leaderboard, published: PublishedTables) -> Comparison:
    """Each published score cell whose row (task title) and column the report has, and the AUP table when the report
    ranks the same models over the same tasks, against the report's unrounded numbers."""
    result = Comparison(published)
    for kind, scores in zip(SCORE_TABLES, (board.best, board.last), strict=True):
        by_title = {task.title: scores[task.task] for task in board.tasks}
        header, *rows = published.tables[kind]
        for row in rows:
            for column, cell in zip(header[1:], row[1:], strict=True):
                if row[0] not in by_title or column not in by_title[row[0]]:
                    continue
                result.compared[kind] = result.compared.get(kind, 0) + 1
                if not _matches(cell, by_title[row[0]][column]):
                    result.differing.append(CellDiff(kind, row[0], column, cell, by_title[row[0]][column]))
    _compare_aup(board, published, result)
    return result


def _compare_aup(board: Leaderboard, published: PublishedTables, result: Comparison) -> None:
    header, *rows = published.tables[AUP_TABLE]
    titles = {row[0] for row in published.tables[SCORE_TABLES[0]][1:]}
    # AUP depends on every task and every model: with others than the table's, a difference says nothing
    if {row[0] for row in rows} != set(board.solvers) or titles != {task.title for task in board.tasks}:
        result.aup_skipped = "the report ranks other models or tasks than the table"
        return
    for row in rows:
        for index, (column, cell) in enumerate(zip(header[1:], row[1:], strict=True)):
            result.compared[AUP_TABLE] = result.compared.get(AUP_TABLE, 0) + 1
            ours = board.aup[row[0]][index] if index < 2 else None
            if not _matches(cell, ours):
                result.differing.append(CellDiff(AUP_TABLE, row[0], column, cell, ours))


def comparison_note(comparison: Comparison, left_out: Collection[tuple[str, str]] = ()) -> str:
    """One line: how many cells of each table match, which differ, and why they may.

    ``left_out``: the (model, task title) pairs with a score left out of the report for its run's problems.
    """
    counts = [f"{kind} {comparison.matched(kind)}/{comparison.compared[kind]}"
              for kind in (*SCORE_TABLES, AUP_TABLE) if comparison.compared.get(kind)]
    head = f"MLGym's published tables {comparison.published.pattern}, cells that match: {', '.join(counts)}"
    if comparison.aup_skipped:
        head += f" (AUP not compared: {comparison.aup_skipped})"
    cells = [d for d in comparison.differing if d.table != AUP_TABLE]
    if not comparison.differing:
        return head + "."
    named = "; ".join(_cell_text(d, left_out) for d in cells[:SHOWN])
    more = f" and {len(cells) - SHOWN} more" if len(cells) > SHOWN else ""
    why = (
        f"A cell differs when the runs here are not the ones the table was made from (MLGym re-recorded some runs "
        f"after making some tables) or when scores are left out here; AUP values depend on every row, so one "
        f"differing cell changes them all. See {DOCS}."
    )
    return f"{head}. Differing: {named}{more}. {why}" if cells else f"{head}. {why}"


def _cell_text(diff: CellDiff, left_out: Collection[tuple[str, str]]) -> str:
    ours = "none" if diff.ours is None else repr(round(diff.ours, 3))
    text = f"{diff.table.split('_')[0]} {diff.row} / {diff.column}: published {diff.published or 'none'}, here {ours}"
    if (diff.column, diff.row) in left_out:
        text += " (runs with problems are left out here; MLGym counts them: --include-failed)"
    return text


def published_notes(
    folders: Sequence[str | Path], board: Leaderboard, left_out: Collection[tuple[str, str]] = ()
) -> list[str]:
    """A ``comparison_note`` for each set of MLGym's published tables found near ``folders`` that shares cells with
    the report."""
    comparisons = [compare(board, published) for published in find_published(folders)]
    comparisons = [c for c in comparisons if any(c.compared.values())]
    reproduced = [c.published.pattern for c in comparisons if not c.differing and not c.aup_skipped]
    notes = []
    for comparison in comparisons:
        note = comparison_note(comparison, left_out)
        if comparison.differing and reproduced:
            note += f" These runs reproduce {' and '.join(reproduced)} cell for cell: this set came from other runs."
        notes.append(note)
    return notes
