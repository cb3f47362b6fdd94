"""MLGym's recorded runs replayed in the background for the whole test session (see ``conftest.py``).

Replaying a recorded run costs seconds to a minute of CPU, mostly in the tasks' evaluations, and the suite's machine
has no idle CPU to hide it in: the session replays only the fewest runs that hold every class of step the records hold
(``covering_runs``; all of them with ``MLGYM_REPLAY_ALL=1``). The replays start with the session, in worker processes
at the lowest CPU priority, and ``test_replay.py`` then only collects the results.

With pytest-xdist (``make test``) the session is several worker processes: the controller, which runs no test,
starts the replays as soon as a worker has collected the tests (``conftest.py``), and every replay's outcome is saved
as a file in the folder the workers share, so that the test checking it reads it in whichever worker it runs. No
worker then has the replays among its child processes, where tests that check what processes they leave behind would
see them. (Should the controller not start them, the first worker to need them does: an exclusive file says who.)
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
from concurrent.futures import Future, ProcessPoolExecutor
from functools import cache, partial
from pathlib import Path

import pytest

from mlgym_registry.backends.local.procs import alive
from mlgym_registry.commands.replay import default_task, replay
from mlgym_registry.records.observation_kinds import recorded_kind
from mlgym_registry.records.trajectories import Trajectory, load_traj

TEST_NAME = "test_each_replayed_mlgym_run_replays_and_is_reported"
"""The test that checks each replay."""

REPLAY_ALL_VARIABLE = "MLGYM_REPLAY_ALL"
"""Set to 1 to replay every recorded run, not only the fewest that cover every class of step (``replayed``)."""

CHECKS = (TEST_NAME, "test_the_replays_give_the_recorded_kind_of_observation_on_nearly_every_step")
"""The tests that read the replays' outcomes, and so wait for them: the one per replay, then the one over them all."""

EVALUATION_CAP = 3
"""Seconds an evaluation may take in these replays: a game's evaluation takes about 1 s here, while a replayed
strategy that never ends costs the whole cap at every validate."""

LOWEST_PRIORITY = 19
"""``nice`` of the replay workers (and so of their evaluations): the rest of the suite always runs first."""

WAIT_LIMIT = 40 * 60
"""Seconds a test waits for a replay's outcome before failing (a replay takes seconds to a few minutes)."""

OUTCOME = "outcome.pickle"
"""The file, in a replay's folder, holding what ``replay`` returned or raised (written when it ends)."""


class Outcome:
    """A replay's result as its outcome file holds it, read in any process of the session (a future's ``result``)."""

    def __init__(self, folder: Path, owner: Path):
        self.file = folder / OUTCOME
        self.owner = owner

    def result(self, timeout: float = WAIT_LIMIT):
        deadline = time.monotonic() + timeout
        while not self.file.is_file():
            if not owner_alive(self.owner):
                pytest.fail(f"the process replaying the recorded runs ended without saving {self.file}")
            if time.monotonic() > deadline:
                pytest.fail(f"no replay outcome in {self.file} after {timeout:.0f} s")
            time.sleep(0.5)
        kind, value = pickle.loads(self.file.read_bytes())
        if kind == "raised":
            raise value
        if kind == "cancelled":
            pytest.fail("the replay was cancelled: the session stopped before it ran")
        return value


Replays = dict[Path, tuple[Path, "Outcome | None"]]
"""``{path: (out_folder, outcome)}``; a run that is not one of our tasks has no outcome (its test skips)."""


def param_id(path: Path) -> str:
    """The id of the test checking the replay of ``path`` (as ``test_replay.py`` parametrizes it)."""
    return f"{path.parent.name}/{path.stem}"


def selected(ids: list[str], recorded: list[Path]) -> list[Path]:
    """The recorded runs whose replay test is among the collected test ``ids``."""
    wanted = {test_id.rpartition("[")[2].rstrip("]") for test_id in ids if f"::{TEST_NAME}[" in test_id}
    return [path for path in recorded if param_id(path) in wanted]


@cache
def recorded(path: Path) -> Trajectory:
    """The recorded run at ``path``, read once per process."""
    return load_traj(path)


def expected_cost(path: Path) -> int:
    """A rough rank of how long replaying a recorded run takes: its evaluations (``validate`` and the final one)
    dominate, each up to the evaluation cap."""
    steps = recorded(path).steps
    return 10 * (1 + sum((step.action or "").strip() == "validate" for step in steps)) + len(steps)


StepClass = tuple[str, str, str]
"""``(task folder, the action's command word, the kind of observation MLGym recorded)``."""


def step_classes(path: Path) -> set[StepClass]:
    """The classes of the steps of the recorded run at ``path``: what it asks of the env (a command of the task's
    tools, or of the shell) and what kind of observation MLGym answered (``records.observation_kinds``)."""
    run = recorded(path)
    steps, status = run.steps, str(run.info.get("exit_status") or "")
    classes = set()
    for index, step in enumerate(steps):
        action = (step.action or "").strip()
        word = action.split()[0] if action else ""
        kind = recorded_kind(step.observation, step.action or "", final=index == len(steps) - 1, exit_status=status)
        classes.add((path.parent.name, word if word.isidentifier() else "", kind))
    return classes


def covering_runs(paths: list[Path]) -> list[Path]:
    """The fewest of ``paths``, picked greedily, whose steps hold every class of step that any of them holds
    (``step_classes``): each pick adds the most classes not yet held per unit of ``expected_cost``, the first of
    ``paths`` on a tie. Replaying these checks every class the records hold, at a fraction of replaying them all:
    13 of the 36 runs of the shared records, about 104 CPU-s where all 36 took 365 (2026-12-07, an idle 2-core
    machine); the runs left out are mostly those whose slow strategies run into the evaluation cap again and again."""
    held = {path: step_classes(path) for path in paths}
    cost = {path: expected_cost(path) for path in paths}
    missing = set().union(*held.values()) if held else set()
    chosen: list[Path] = []
    while missing:
        best = max((path for path in paths if path not in chosen),
                   key=lambda path: (len(held[path] & missing) / cost[path], -paths.index(path)))
        chosen.append(best)
        missing -= held[best]
    return chosen


def replayed(paths: list[Path]) -> list[Path]:
    """The recorded runs the session replays: ``covering_runs``, or all of ``paths`` where ``MLGYM_REPLAY_ALL=1``."""
    if os.environ.get(REPLAY_ALL_VARIABLE, "").strip() == "1":
        return list(paths)
    return sorted(covering_runs(paths))


def replay_workers() -> int:
    """One replay per core, as ``mlgym-registry replay`` runs them."""
    from mlgym_registry.commands.replay import default_jobs

    return default_jobs()


def owner_alive(owner: Path) -> bool:
    """Whether the process named in ``owner`` (the one replaying) still runs; True while it is writing the file."""
    try:
        pid = int(owner.read_text() or 0)
    except (OSError, ValueError):
        return True
    return not pid or alive(pid)


def take_on(owner: Path) -> bool:
    """Become the process that replays, unless another process of the session already is."""
    try:
        fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as file:
        file.write(str(os.getpid()))
    return True


def save(file: Path, future: Future) -> None:
    """Write what ``future`` ended with to ``file`` (a temporary file renamed, so that readers see all or nothing)."""
    if future.cancelled():
        outcome = ("cancelled", None)
    elif future.exception() is not None:
        outcome = ("raised", future.exception())
    else:
        outcome = ("returned", future.result())
    partial_file = file.with_suffix(".partial")
    partial_file.write_bytes(pickle.dumps(outcome))
    os.replace(partial_file, file)


def start(paths: list[Path], root: Path) -> tuple[ProcessPoolExecutor | None, Replays]:
    """The replays of every run in ``paths``, in folders under ``root`` (shared by the session's processes).

    The first process to get here submits them (longest first) to a pool of low-priority workers and returns the
    pool; the others return None and only read the outcomes."""
    root.mkdir(parents=True, exist_ok=True)
    owner = root / "owner"
    folders = {path: root / f"{index:03d}-{path.parent.name}-{path.stem}" for index, path in enumerate(sorted(paths))}
    runs: Replays = {path: (folder / "out", Outcome(folder, owner)) for path, folder in folders.items()}
    if not take_on(owner):
        return None, runs
    pool = ProcessPoolExecutor(max_workers=min(replay_workers(), len(paths) or 1),
                               mp_context=multiprocessing.get_context("spawn"),
                               initializer=os.nice, initargs=(LOWEST_PRIORITY,))
    for path in sorted(paths, key=expected_cost, reverse=True):
        folder = folders[path]
        out = folder / "out"
        out.mkdir(parents=True)
        try:
            task, warnings = default_task(path, recorded(path).environment)
        except SystemExit:
            runs[path] = (out, None)
            continue
        # replayed edits can land on other lines than in MLGym's starter files and make a strategy that never ends:
        # a short evaluation timeout keeps such a replay short
        future = pool.submit(replay, path, task, out, seed=0, warnings=warnings, training_timeout=EVALUATION_CAP)
        future.add_done_callback(partial(save, folder / OUTCOME))
    return pool, runs
