"""Builds the two offline views of a Hugging Face hub dataset's local copy, in the ``datasets`` library's own cache
layout, so that ``datasets.load_dataset("<namespace>/<name>")`` opens them unchanged, offline:

- ``agent/``: every split, with the answer columns of the scored splits masked (``-1`` in an integer or
  ``ClassLabel`` column, as the hub's own unlabelled test splits hold, ``""`` in a text column, nulls otherwise);
- ``evaluator/``: every split as the copy holds it.

Each view holds ``<namespace>___<name>/<config>/0.0.0/<hash>/`` with ``dataset_info.json`` and one Arrow file per
split (``<name>-<split>.arrow``): what ``load_dataset`` writes when it downloads a dataset and finds again, offline,
through its ``cache`` builder. The copy is a ``DatasetDict`` as ``save_to_disk`` writes it.

This file runs as a script with the task's own interpreter (``python hub_view_builder.py REQUEST_JSON``), so the
views are written by the ``datasets`` version that reads them; it imports only the standard library, ``datasets``
and ``pyarrow``. The request: ``{"copy", "out", "repo_id", "hash", "hidden": {split: [column, ...]}}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

VIEWS = ("agent", "evaluator")
BATCH_ROWS = 1000


def masked(table: Any, columns: list[str]) -> Any:
    """``table`` with ``columns`` replaced by placeholders of the same Arrow type: -1, "" or nulls."""
    import pyarrow as pa

    for column in columns:
        index = table.schema.get_field_index(column)
        kind = table.schema.field(index).type
        rows = table.num_rows
        if pa.types.is_integer(kind):
            values = pa.array([-1] * rows, type=kind)
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            values = pa.array([""] * rows, type=kind)
        else:
            values = pa.nulls(rows, type=kind)
        table = table.set_column(index, table.schema.field(index), values)
    return table


def write_split(dataset: Any, path: str, hide: list[str]) -> tuple[int, int]:
    """Write ``dataset`` to the Arrow file ``path`` as the library's builders do, ``hide`` masked; (rows, bytes)."""
    from datasets.arrow_writer import ArrowWriter

    writer = ArrowWriter(path=path, features=dataset.features)
    try:
        for table in dataset.with_format("arrow").iter(batch_size=BATCH_ROWS):
            writer.write_table(masked(table, hide) if hide else table)
        rows, size = writer.finalize()
    finally:
        writer.close()
    return rows, size


def build(request: dict[str, Any]) -> dict[str, Any]:
    """Write both views of the request's copy under ``out``; returns what was made (per view, its folder)."""
    from datasets import DatasetDict, load_from_disk
    from datasets.naming import camelcase_to_snakecase
    from datasets.splits import SplitDict, SplitInfo

    copy = load_from_disk(request["copy"])
    if not isinstance(copy, DatasetDict):
        raise SystemExit(f"{request['copy']} holds one Dataset, not a DatasetDict of splits: save the whole "
                         "load_dataset(...) result with save_to_disk")
    hidden: dict[str, list[str]] = request["hidden"]
    for split, columns in hidden.items():
        if split not in copy:
            raise SystemExit(f"{request['copy']} has no split {split!r} (it has {', '.join(copy)})")
        missing = [c for c in columns if c not in copy[split].column_names]
        if missing:
            raise SystemExit(f"{request['copy']}: split {split!r} has no column {', '.join(missing)}")
    *namespace, name = request["repo_id"].split("/")
    name = camelcase_to_snakecase(name)
    first = next(iter(copy.values()))
    config = first.info.config_name or "default"
    made = {}
    for view in VIEWS:
        folder = os.path.join(request["out"], view, "___".join([*namespace, name]), config, "0.0.0", request["hash"])
        os.makedirs(folder)
        splits = SplitDict(dataset_name=name)
        for split, dataset in copy.items():
            path = os.path.join(folder, f"{name}-{split}.arrow")
            if view == "evaluator" and split not in hidden:  # the agent's file, unmasked: shared
                shown = os.path.join(made["agent"], f"{name}-{split}.arrow")
                try:
                    os.link(shown, path)
                except OSError:
                    import shutil

                    shutil.copyfile(shown, path)
                rows, size = dataset.num_rows, os.path.getsize(path)
            else:
                rows, size = write_split(dataset, path, hidden.get(split, []) if view == "agent" else [])
            splits.add(SplitInfo(name=split, num_bytes=size, num_examples=rows, dataset_name=name))
        info = first.info.copy()
        info.builder_name, info.dataset_name, info.config_name, info.version = "arrow", name, config, "0.0.0"
        info.splits = splits
        info.download_checksums = None
        info.write_to_directory(folder)
        made[view] = folder
    return made


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        print(json.dumps(build(json.load(handle))))
