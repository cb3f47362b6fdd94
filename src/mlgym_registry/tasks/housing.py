"""Synthetic house-price data for the ``houseRegression`` task, generated with numpy on first use.

The data is a pure function of ``SEED`` and ``VERSION``: every machine generates the same files, so nothing is
committed. ``prepare(spec)`` writes them once into ``cache_dir()/houseRegression-v<VERSION>/data`` (atomically, so
parallel workers can race safely) and points the spec's ``datasets`` and ``sample_submission`` at them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..specs import TaskSpec
from .suite import cache_dir

SEED = 20240613
VERSION = 1
SPLITS = {"train": 1200, "validation": 300, "test": 500}
NEIGHBOURHOODS = {  # name: (share of houses, effect on log price)
    "Riverside": (0.14, 0.18),
    "Oakwood": (0.18, 0.05),
    "Hillcrest": (0.10, 0.30),
    "Downtown": (0.12, 0.12),
    "Meadows": (0.20, 0.00),
    "OldMill": (0.10, -0.12),
    "Lakeview": (0.06, 0.38),
    "Railside": (0.10, -0.22),
}
COLUMNS = (
    "Id", "Neighbourhood", "LotArea", "LivingArea", "Bedrooms", "Bathrooms", "YearBuilt", "Quality", "GarageCars",
    "HasPool", "DistanceKm",
)
TARGET = "Price"
DESCRIPTION = """\
Synthetic house sales, one row per house. The files are data/train.csv and data/validation.csv (with the Price
column) and data/test.csv (without it).

Id: unique identifier of the house (the key of the submission).
Neighbourhood: one of Riverside, Oakwood, Hillcrest, Downtown, Meadows, OldMill, Lakeview, Railside.
LotArea: plot size in square feet; empty when unknown.
LivingArea: heated living space in square feet.
Bedrooms: number of bedrooms.
Bathrooms: number of bathrooms (a half bathroom counts 0.5).
YearBuilt: year of construction.
Quality: overall quality of materials and finish, from 1 (very poor) to 10 (excellent).
GarageCars: garage capacity in cars (0 = no garage).
HasPool: 1 when the house has a pool, else 0.
DistanceKm: distance to the town centre in kilometres.
Price: sale price in dollars (the target)."""


def generate(seed: int = SEED) -> dict[str, list[dict[str, Any]]]:
    """The rows of every split (``train``, ``validation``, ``test``), prices included, as plain dicts."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = sum(SPLITS.values())
    names = list(NEIGHBOURHOODS)
    shares = np.array([NEIGHBOURHOODS[k][0] for k in names])
    hood = rng.choice(len(names), size=n, p=shares / shares.sum())
    hood_effect = np.array([NEIGHBOURHOODS[k][1] for k in names])[hood]

    year = np.round(1900 + 123 * rng.beta(2.2, 1.4, size=n)).astype(int)
    quality = np.clip(np.round(5 + 8 * hood_effect + (year - 1960) / 30 + rng.normal(0, 1.3, n)), 1, 10).astype(int)
    living = np.round(np.exp(rng.normal(np.log(1500) + 0.5 * hood_effect, 0.32))).astype(int)
    lot = np.round(living * np.exp(rng.normal(1.6, 0.45, n))).astype(int)
    bedrooms = np.clip(np.round(living / 550 + rng.normal(0, 0.7, n)), 1, 7).astype(int)
    bathrooms = np.clip(np.round(2 * (0.5 + 0.45 * bedrooms + rng.normal(0, 0.4, n))) / 2, 1, 4.5)
    garage = np.clip(np.round(0.4 + living / 1100 + rng.normal(0, 0.7, n)), 0, 4).astype(int)
    pool = (rng.random(n) < 0.03 + 0.12 * (hood_effect > 0.25)).astype(int)
    distance = np.round(rng.gamma(2.0, 3.0, n) * (1 - 0.5 * (names.index("Downtown") == hood)), 2)

    # a log-linear price with a few bends an ordinary least-squares fit on raw prices misses
    age = 2024 - year
    log_price = (
        12.0
        + hood_effect
        + 0.62 * np.log(living / 1500)
        + 0.09 * np.log(lot / 7500)
        + 0.075 * (quality - 5)
        + 0.025 * (quality - 5) * np.log(living / 1500) * 4
        + 0.035 * bathrooms
        + 0.045 * garage
        + 0.10 * pool
        - 0.0045 * np.minimum(age, 90)
        + 0.20 * (year < 1925)
        - 0.035 * distance
        + rng.normal(0, 0.11, n)
    )
    price = np.round(np.exp(log_price), -2).astype(int)
    lot_known = rng.random(n) >= 0.05

    ids = rng.permutation(np.arange(1, n + 1)) + 1000
    rows = [
        {
            "Id": int(ids[i]),
            "Neighbourhood": names[hood[i]],
            "LotArea": int(lot[i]) if lot_known[i] else "",
            "LivingArea": int(living[i]),
            "Bedrooms": int(bedrooms[i]),
            "Bathrooms": float(bathrooms[i]),
            "YearBuilt": int(year[i]),
            "Quality": int(quality[i]),
            "GarageCars": int(garage[i]),
            "HasPool": int(pool[i]),
            "DistanceKm": float(distance[i]),
            TARGET: int(price[i]),
        }
        for i in range(n)
    ]
    splits, start = {}, 0
    for split, size in SPLITS.items():
        splits[split] = rows[start : start + size]
        start += size
    return splits


def write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...] | list[str]) -> None:
    """Write ``rows`` (only ``columns``, in order) as a CSV file with a header line."""
    lines = [",".join(columns)] + [",".join(str(row[c]) for c in columns) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def write_dataset(folder: Path, seed: int = SEED) -> None:
    """Write train/validation/test/answer/sample_submission CSV files into ``folder``."""
    splits = generate(seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "train.csv", splits["train"], COLUMNS + (TARGET,))
    write_csv(folder / "validation.csv", splits["validation"], COLUMNS + (TARGET,))
    write_csv(folder / "test.csv", splits["test"], COLUMNS)
    write_csv(folder / "answer.csv", splits["test"], ("Id", TARGET))
    typical = sorted(row[TARGET] for row in splits["train"])[len(splits["train"]) // 2]
    sample = [{"Id": row["Id"], TARGET: typical} for row in splits["test"]]
    write_csv(folder / "sample_submission.csv", sample, ("Id", TARGET))


def data_dir() -> Path:
    """The generated dataset folder, created on the first call."""
    final = cache_dir() / f"houseRegression-v{VERSION}" / "data"
    if (final / "answer.csv").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".data-", dir=final.parent))
    try:
        write_dataset(scratch)
        try:
            os.rename(scratch, final)
        except OSError:
            if not (final / "answer.csv").is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def prepare(spec: TaskSpec) -> TaskSpec:
    """Make sure the data exists and point ``spec`` at it (the ``prepare`` step of ``houseRegression.yaml``)."""
    folder = data_dir()
    dataset = {
        "name": "houseRegression",
        "description": DESCRIPTION,
        "data_path": str(folder),
        "is_local": True,
        "train_split": {"name": "train", "file_regex": "./data/train*"},
        "valid_split": {"name": "valid", "file_regex": "./data/validation*"},
        "test_split": {"name": "test", "file_regex": "./data/test*"},
    }
    return spec.replace(datasets=[dataset], sample_submission=str(folder / "sample_submission.csv"))
