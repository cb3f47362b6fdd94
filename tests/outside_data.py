"""Data some tests read from outside the repository: where it is looked for, and the skip that says how to provide it.

A plain clone has none of it, and the rest of the suite must not notice: a test that needs it is skipped with a
reason naming what to provide and where, never errored.

- **MLGym's recorded runs** (``<task>/<model>_run<k>.traj`` and their ``.results.json``, from MLGym's repository,
  folder ``trajectories/mlgym_bench_v0``; not ours to copy into this one): the folder ``$MLGYM_TRAJECTORIES`` names,
  else ``mlgym-trajectories`` in the ``shared`` folder beside the clone.
- **An MLGym checkout** (facebookresearch/MLGym): ``$MLGYM_ROOT``; the tests that need one say so themselves.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
"""The folder beside the clone where the developers' machines and CI lay data the repository cannot hold."""

TRAJECTORIES_VARIABLE = "MLGYM_TRAJECTORIES"
DEFAULT_TRAJECTORIES = SHARED / "mlgym-trajectories"


def recorded_runs_folder() -> Path:
    """Where MLGym's recorded runs are looked for: ``$MLGYM_TRAJECTORIES`` when set, else the sibling default."""
    named = os.environ.get(TRAJECTORIES_VARIABLE)
    return Path(named).expanduser() if named else DEFAULT_TRAJECTORIES


TRAJECTORIES = recorded_runs_folder()
RECORDED: list[Path] = sorted(TRAJECTORIES.glob("*/*.traj"))
"""Every recorded run found (none in a plain clone)."""


def missing_recorded_runs() -> str:
    """The skip reason of a test that needs the recorded runs, saying where they were looked for and how to get them."""
    where = (f"{TRAJECTORIES_VARIABLE}={TRAJECTORIES} holds" if os.environ.get(TRAJECTORIES_VARIABLE)
             else f"{TRAJECTORIES} (the default; {TRAJECTORIES_VARIABLE} is not set) holds")
    return (f"needs MLGym's recorded runs, and {where} no <task>/<run>.traj: copy the folders of MLGym's repository's "
            f"trajectories/mlgym_bench_v0 there, or set {TRAJECTORIES_VARIABLE} to a folder holding them")


needs_recorded_runs = pytest.mark.skipif(not RECORDED, reason=missing_recorded_runs())
"""Mark a test that reads the recorded runs (it is skipped, with the reason above, when there are none)."""


def recorded_run_params(paths: list[Path] | None = None) -> list:
    """``pytest.mark.parametrize`` values for a test run once per recorded run (of ``paths``, default all), with ids
    ``<task>/<run>``.

    With no recorded runs there is one value, skipped with the reason above (pytest's own empty-parameter skip would
    hand fixtures a placeholder instead of a path, and say nothing of where the runs go)."""
    if not RECORDED:
        return [pytest.param(None, id="no-recorded-runs", marks=pytest.mark.skip(reason=missing_recorded_runs()))]
    return [pytest.param(path, id=f"{path.parent.name}/{path.stem}") for path in (RECORDED if paths is None else paths)]
