"""MLGym's recorded runs replayed in the background for the whole test session (see ``conftest.py``).

Replaying every recorded run takes minutes, mostly spent waiting on the tasks' evaluations. The replays start with
the session, in worker processes at the lowest CPU priority, so that they use what the other tests leave idle;
``test_replay.py`` then only collects the results.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pytest

from mlgym_registry.commands.replay import default_task, replay
from mlgym_registry.trajectories import load_traj

TEST_NAME = "test_every_recorded_mlgym_run_replays_and_is_reported"
"""The test that checks each replay."""

EVALUATION_CAP = 3
"""Seconds an evaluation may take in these replays: a game's evaluation takes about 1 s here, while a replayed
strategy that never ends costs the whole cap at every validate."""

LOWEST_PRIORITY = 19
"""``nice`` of the replay workers (and so of their evaluations): the rest of the suite always runs first."""

Replays = dict[Path, tuple[Path, "Future | None"]]
"""``{path: (out_folder, future)}``; a run that is not one of our tasks has no future (its test skips)."""


def expected_cost(path: Path) -> int:
    """A rough rank of how long replaying a recorded run takes: its evaluations (``validate`` and the final one)
    dominate, each up to the evaluation cap."""
    steps = load_traj(path).steps
    return 10 * (1 + sum((step.action or "").strip() == "validate" for step in steps)) + len(steps)


def replay_workers() -> int:
    """One replay per core: a replay mostly waits on its evaluations, each a pair of processes taking turns."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def start(paths: list[Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[ProcessPoolExecutor, Replays]:
    """Submit the replay of every run in ``paths`` (longest first) to a pool of low-priority workers."""
    pool = ProcessPoolExecutor(max_workers=min(replay_workers(), len(paths) or 1),
                               mp_context=multiprocessing.get_context("spawn"),
                               initializer=os.nice, initargs=(LOWEST_PRIORITY,))
    runs: Replays = {}
    for path in sorted(paths, key=expected_cost, reverse=True):
        out = tmp_path_factory.mktemp(f"replay-{path.parent.name}-{path.stem}")
        try:
            task, warnings = default_task(path, load_traj(path).environment)
        except SystemExit:
            runs[path] = (out, None)
            continue
        # replayed edits can land on other lines than in MLGym's starter files and make a strategy that never ends:
        # a short evaluation timeout keeps such a replay short
        future = pool.submit(replay, path, task, out, seed=0, warnings=warnings, training_timeout=EVALUATION_CAP)
        runs[path] = (out, future)
    return pool, runs
