"""Many envs on one machine, driven five ways: turns/s of N envs over one env, memory per env, time to the first turn.

The drivers, each over N = ``--widths`` envs of ``--task`` (default 1, 2, 4, 8, 16, 32), every figure from this run:

- ``loop``: one env after another in a plain loop (``step_and_maybe_reset``, as a collector steps an env);
- ``threads``: TorchRL ``AsyncEnvPool(backend="threading")``;
- ``processes``: TorchRL ``AsyncEnvPool(backend="multiprocessing", exchange="queue", envs_per_worker=ceil(N /
  cores))``, docs/scaling.md's recipe (``WithParentEnviron(EnvFactory)`` built inside ``warm_workers()``; one worker
  process per core at most);
- ``parallel``: TorchRL ``ParallelEnv`` with its defaults, built the same way, its first reset inside the block too
  (``ParallelEnv`` starts its workers there; after the block they would be spawned, about 300 MiB each);
- ``cli``: ``mlgym-registry run TASK --num-envs N --max-steps K`` as a command, one episode per env (its default
  workers: one process per core at most).

The policy is trivial, so that only the env side is measured: the same fenced command every turn
(``bench_training.RESPONSE``, ``echo hi``). The command gets it from a local OpenAI-compatible endpoint
(``tests/model_server.Endpoint``, in this process) through ``--policy openai:...``. With ``--policy-delay S``
every answer takes S seconds more, as a model's would: the loop waits S before each env's step, a pool waits S for
each batch of outputs it receives (one batched call answers them all), the command's envs each wait S for their own
answer (the endpoint answers requests concurrently).

Figures per driver and N:

- turns/s while playing, and its ratio to the driver's own figure at the smallest N. The in-process drivers play
  ``max(5, --min-rounds)`` timed rounds of N turns after an untimed first round and a warm-up round (no episode
  ends: ``max_steps`` is 10**6), so that every N's conversations reach the same length, in 5 blocks; they play
  these rounds again from a reset (untimed) until about ``--turns`` turns were timed, and the median of all the
  blocks is kept (their range is printed on the progress line); each child first builds, plays and closes one env
  untimed. The pools are stepped as ``LLMCollector`` steps an async pool: each env's output that is back gets its
  answer and is sent again at once (``--lockstep``: every round sends all N envs and waits for all N).
  The command plays N episodes of K = ``--cli-steps`` steps (each ends with the
  autosubmission's evaluation); its records are read every quarter second, and its rate is the steps recorded
  while every env was playing (from the first read at which each episode had a step to the first at which one had
  all of its steps: the envs start one after another, and the first to end leave the cores to the rest); where no
  such time was seen, (turns - 1) over the time from the first recorded step to the last ``.traj`` write. Its rate
  over its whole wall time is printed on its progress line. Lost steps (episodes recording fewer steps than the
  others, a ``"failed"`` results.json, a non-zero exit) are reported in its row.
- memory: the proportional set size (PSS, ``/proc/PID/smaps_rollup``) summed over the driver's process tree. In-process
  drivers: the tree of the process that drives them (its worker processes, sandboxes and shells included) after the
  timed rounds, less the same tree before the envs were built (imports and fork server already there), per env. A
  worker forked from the fork server shares the server's heap until its first full garbage collection, which touches
  every object and so copies the pages they lie on (28 MiB per env after 20 turns, 125 MiB after 50, when this was
  written): hence ``--min-rounds``, so that the figure is the one a long run reaches. The
  command: the median of its tree's PSS sampled every second from its first turn on (the peak would be the
  autosubmissions' evaluators, all at the end), and per env its growth from the smallest N >= 2 (one env plays in
  the command's own process; from two on, a fork server and a worker per env do): (PSS(N) - PSS(n)) / (N - n).
- first turn: seconds from the start of building the envs to the first round's observations (in-process), or from
  the command's start to its first recorded step (the command: interpreter start and imports included).

With ``--sweeps S``, every driver measures all its widths in turn, S times over (1, 2, ..., 32, 1, 2, ...), and each
width keeps its median: an in-process width pools the blocks of its sweeps and keeps the median block, the command
keeps the sweep of median rate (every sweep's rate is printed under the table). On a shared machine whose load drifts
over minutes, a single sweep can put a slow spell on one width alone and so bend its ratio; S = 3 makes that unlikely.

Each in-process driver runs in a child process of its own (all its widths in turn), the command in one per N; every
child runs in a session of its own, its process tree is watched while it runs, and whatever of it is left at the end
is killed. A cell that takes longer than ``--budget`` seconds is stopped and marked skipped, and so are the larger N of
that driver. A driver that fails (a pool that cannot be built, a command that loses steps) says so in its row.

Targets (issue: many envs on one machine), for the process-based drivers (``processes``, ``parallel``, ``cli``):
turns/s at N = cores >= 1.6x one env; at N = 16 x cores within 10% of the best; at most 50 MiB PSS per env (at the
largest N). For the command: its first turn within 10 s at N = 8 on 2 cores (an absolute time: printed, not judged),
and with a policy that takes time (``--policy-delay``) 2 envs >= 1.6x one env. The loop and threads rows are the
references. Nothing fails on a missed target: the table says met or NOT met.

    python bench/bench_env_drivers.py [--quick] [--widths 1,2,4,8,16,32] [--drivers loop,threads,processes,parallel,cli]
        [--task prisonersDilemma] [--turns 800] [--min-rounds 50] [--cli-steps 200] [--policy-delay 0] [--lockstep]
        [--sweeps 1] [--budget 300]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other bench scripts, when loaded from a file path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_evaluation import load as load_averages  # noqa: E402
from bench_parallel import load, warm_up  # noqa: E402
from bench_training import RESPONSE, pool_round, verdict  # noqa: E402

from mlgym_registry.machine import usable_cores  # noqa: E402

DRIVERS = {
    "loop": "one env after another in a loop",
    "threads": "AsyncEnvPool, threads",
    "processes": "AsyncEnvPool, processes (scaling.md)",
    "parallel": "TorchRL ParallelEnv",
    "cli": "mlgym-registry run --num-envs N",
}
"""The drivers, in the table's order, with their row labels."""
PROCESS_DRIVERS = ("processes", "parallel", "cli")
"""The drivers the issue's targets are for."""
QUICK = ["--widths", "1,2,4", "--turns", "8", "--min-rounds", "3", "--cli-steps", "3", "--budget", "150", "--sweeps",
         "1"]
"""``--quick``: a smoke run of every driver (seconds per cell, not figures to quote)."""
CELL = "CELL "
"""The prefix of a child's line that holds a measured cell, as JSON."""
MIB = 2**20
GROWTH_TARGET = 1.6
"""Turns/s at N = cores over one env."""
PLATEAU_TARGET = 0.9
"""Turns/s at N = 16 x cores over the best N."""
MEMORY_TARGET_MIB = 50.0
FIRST_TURN_TARGET_S = 10.0
"""The command's first turn at N = 8 (an absolute time: printed, never judged)."""


@dataclass
class Cell:
    """What one driver measured at one N; ``note`` says why it has no figures, or what went wrong."""

    driver: str
    width: int
    turns: int = 0
    seconds: float = 0.0
    first_turn: float | None = None
    pss_mib: float | None = None
    note: str = ""
    command_seconds: float | None = None
    blocks: list[tuple[int, float]] | None = None
    window: str | None = None
    sweep_rates: list[float] | None = None

    @property
    def block_rates(self) -> list[float]:
        """Turns/s of each timed block (in-process cells)."""
        return [round(turns / spent, 1) for turns, spent in self.blocks or []]

    @property
    def rate(self) -> float | None:
        """Turns per second while playing, or None without figures."""
        return self.turns / self.seconds if self.turns and self.seconds > 0 else None


def tree_pss(processes: list[psutil.Process]) -> int:
    """The proportional set size of ``processes`` together, in bytes (those gone or unreadable count nothing)."""
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def own_tree() -> list[psutil.Process]:
    """This process and all its descendants."""
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


# -- in-process drivers (run in a child process of their own) -----------------------------------------------------
class Stepper:
    """N envs driven one way: ``round()`` plays one turn of every env; ``close()`` frees them."""

    def __init__(self, factory: Callable[[], Any], width: int, delay: float):
        self.width, self.delay = width, delay

    def wait(self) -> None:
        """The policy's delay. None at all without one: ``time.sleep(0)`` still gives the core away, which on a busy
        machine delays the driver by a scheduling slice at every call."""
        if self.delay > 0:
            time.sleep(self.delay)

    def round(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        """Reset every env: new episodes, from the first turn."""
        raise NotImplementedError


class LoopStepper(Stepper):
    """One env after another; the policy answers each env in turn."""

    def __init__(self, factory: Callable[[], Any], width: int, delay: float):
        super().__init__(factory, width, delay)
        self.envs: list[Any] = []
        try:
            for _ in range(width):
                self.envs.append(factory())
            self.states = [env.reset() for env in self.envs]
        except BaseException:
            self.close()
            raise

    def round(self) -> None:
        for index, env in enumerate(self.envs):
            self.wait()
            self.states[index].set(("text", "response"), [RESPONSE])
            _, self.states[index] = env.step_and_maybe_reset(self.states[index])

    def restart(self) -> None:
        self.states = [env.reset() for env in self.envs]

    def close(self) -> None:
        for env in self.envs:
            env.close()


class PoolStepper(Stepper):
    """A TorchRL ``AsyncEnvPool`` stepped through its async API as ``LLMCollector`` steps an async pool
    (``async_envs=True``): whatever outputs are back (``async_step_and_maybe_reset_recv()``, ``min_get=1``) get
    their answer (one policy call, after the delay) and are sent again at once, so an env never waits for the
    others. A round is N turns received. With ``lockstep`` (``--lockstep``), every round sends all N envs and waits
    for all N (``bench_training.pool_round``), as the table measured before."""

    backend = "threading"
    lockstep = False

    def __init__(self, factory: Callable[[], Any], width: int, delay: float):
        super().__init__(factory, width, delay)
        self.pool = self.build(factory, width)
        self.in_flight = 0
        try:
            self.state = self.pool.reset()
            if not self.lockstep:
                self.answer(self.state)
        except BaseException:
            self.close()
            raise

    def build(self, factory: Callable[[], Any], width: int) -> Any:
        from torchrl.envs import AsyncEnvPool

        return AsyncEnvPool([factory] * width, backend=self.backend)

    def answer(self, outputs: Any) -> None:
        """The policy's reply to ``outputs`` (each carries its ``env_index``), sent to their envs."""
        count = outputs.batch_size[0]
        outputs.set(("text", "response"), [[RESPONSE]] * count)
        self.pool.async_step_and_maybe_reset_send(outputs)
        self.in_flight += count

    def round(self) -> None:
        if self.lockstep:
            self.wait()
            self.state = pool_round(self.pool, self.state)
            return
        received = 0
        while received < self.width:
            _, following = self.pool.async_step_and_maybe_reset_recv()
            count = following.batch_size[0]
            received += count
            self.in_flight -= count
            self.wait()
            self.answer(following)

    def restart(self) -> None:
        self.wait_for_all()
        self.state = self.pool.reset()
        if not self.lockstep:
            self.answer(self.state)

    def wait_for_all(self) -> None:
        """Receive the steps still being played."""
        if self.in_flight:
            self.pool.async_step_and_maybe_reset_recv(min_get=self.in_flight)
            self.in_flight = 0

    def close(self) -> None:
        try:
            self.wait_for_all()  # so that no worker is closed mid-step
        finally:
            self.pool.close()


class ProcessPoolStepper(PoolStepper):
    """docs/scaling.md's recipe: warm workers, each env factory in ``WithParentEnviron``, the queue exchange."""

    def build(self, factory: Callable[[], Any], width: int) -> Any:
        from torchrl.envs import AsyncEnvPool

        from mlgym_registry.scale.workers import WithParentEnviron, warm_workers

        with warm_workers():
            return AsyncEnvPool([WithParentEnviron(factory)] * width, backend="multiprocessing", exchange="queue",
                                envs_per_worker=math.ceil(width / usable_cores()))


class ParallelStepper(Stepper):
    """TorchRL's ``ParallelEnv`` with its defaults, built as the process pool is, stepped as its collectors do."""

    def __init__(self, factory: Callable[[], Any], width: int, delay: float):
        from torchrl.envs import ParallelEnv

        from mlgym_registry.scale.workers import WithParentEnviron, warm_workers

        super().__init__(factory, width, delay)
        with warm_workers():
            self.env = ParallelEnv(width, [WithParentEnviron(factory)] * width)
            try:
                # ParallelEnv starts its workers at the first reset, not when built: outside the block they would be
                # spawned (TorchRL's default), each importing torch anew
                self.state = self.env.reset()
            except BaseException:
                self.env.close()
                raise

    def round(self) -> None:
        self.wait()
        self.state.set(("text", "response"), [[RESPONSE]] * self.width)
        _, self.state = self.env.step_and_maybe_reset(self.state)

    def restart(self) -> None:
        self.state = self.env.reset()

    def close(self) -> None:
        self.env.close()


STEPPERS: dict[str, type[Stepper]] = {"loop": LoopStepper, "threads": PoolStepper, "processes": ProcessPoolStepper,
                                      "parallel": ParallelStepper}


def rounds_for(min_rounds: int) -> int:
    """Timed rounds of an episode: the same at every N, so that every N's conversations reach the same length."""
    return max(BLOCKS, min_rounds)


def repeats_for(width: int, turns: int, rounds: int) -> int:
    """How many times N envs play their ``rounds`` rounds from a reset, for about ``turns`` timed turns in all."""
    return max(1, math.ceil(turns / (rounds * width)))


BLOCKS = 5
"""The rounds of each episode are timed in this many blocks, and the median block of the cell is kept: a burst of
other work on the machine slows a block down, never speeds one up, and the median is not pulled by one burst. (The
fastest block was kept before: that favoured the small widths, whose blocks are shorter and so likelier to fit
between two bursts.)"""


def timed_blocks(stepper: Stepper, rounds: int, repeats: int = 1) -> list[tuple[int, float]]:
    """Play ``rounds`` rounds in ``BLOCKS`` blocks, ``repeats`` times (the envs reset in between, untimed); every
    block's (turns, seconds)."""
    blocks = []
    for repeat in range(repeats):
        if repeat:
            stepper.restart()
        for block in range(BLOCKS):
            count = rounds // BLOCKS + (block < rounds % BLOCKS)
            started = time.perf_counter()
            for _ in range(count):
                stepper.round()
            blocks.append((count * stepper.width, time.perf_counter() - started))
    return blocks


def measure_cell(driver: str, task: str, width: int, turns: int, min_rounds: int, delay: float,
                 timed: bool = True) -> Cell:
    """Build N envs the driver's way, play its rounds, take the tree's PSS, close them (``timed=False``: build, play
    one round and close, to warm up)."""
    from mlgym_registry.interop.torchrl.env_factory import EnvFactory

    factory = EnvFactory.from_spec(task, max_steps=10**6)
    gc.collect()
    before = tree_pss(own_tree())
    started = time.perf_counter()
    stepper = STEPPERS[driver](factory, width, delay)
    try:
        stepper.round()
        first_turn = time.perf_counter() - started
        if not timed:
            return Cell(driver, width, first_turn=first_turn)
        stepper.round()  # warm-up
        rounds = rounds_for(min_rounds)
        blocks = timed_blocks(stepper, rounds, repeats_for(width, turns, rounds))
        pss = tree_pss(own_tree()) - before
    finally:
        stepper.close()
    played, seconds = median_block(blocks)
    return Cell(driver, width, played, seconds, first_turn, pss / MIB, blocks=blocks)


def median_block(blocks: list[tuple[int, float]]) -> tuple[int, float]:
    """The (turns, seconds) of the block whose rate is the median of ``blocks``'."""
    return sorted(blocks, key=lambda block: block[0] / block[1])[len(blocks) // 2]


def merged(sweeps: list[Cell]) -> Cell:
    """One driver's cells at one N from every sweep, as one: in-process cells pool their blocks and keep the median
    block; the command's cells keep the sweep of median rate. The memory and first turn are the sweeps' medians, and
    every sweep's note is kept (a sweep that lost steps says so in the row)."""
    measured = [cell for cell in sweeps if cell.rate is not None]
    notes = "; ".join(dict.fromkeys(cell.note for cell in sweeps if cell.note))
    if not measured:
        return Cell(sweeps[0].driver, sweeps[0].width, note=notes)
    rates = [round(cell.rate, 1) for cell in measured]
    if all(cell.blocks for cell in measured):
        blocks = [block for cell in measured for block in cell.blocks]
        turns, seconds = median_block(blocks)
        kept = Cell(measured[0].driver, measured[0].width, turns, seconds, blocks=blocks)
    else:
        kept = Cell(**asdict(sorted(measured, key=lambda cell: cell.rate)[len(measured) // 2]))
    firsts = [cell.first_turn for cell in measured if cell.first_turn is not None]
    memories = [cell.pss_mib for cell in measured if cell.pss_mib is not None]
    kept.first_turn = statistics.median(firsts) if firsts else None
    kept.pss_mib = statistics.median(memories) if memories else None
    kept.note, kept.sweep_rates = notes, rates if len(sweeps) > 1 else None
    return kept


def serve_cells(driver: str, args: argparse.Namespace) -> None:
    """The child's side: measure every width in turn, one ``CELL`` line each (a failure is a cell with a note)."""
    import tensordict

    tensordict.set_list_to_stack(True).set()
    PoolStepper.lockstep = args.lockstep
    if driver in ("processes", "parallel"):
        warm_up(["forkserver"])  # once, before the first baseline: the server is not the envs' memory
    # one env built, played and closed untimed: what this process imports and loads at its first env (the pool's
    # modules, the registry, the task) is not the envs' memory either
    with contextlib.suppress(Exception):  # a failure shows in the cells that follow, with its reason
        measure_cell(driver, args.task, 1, args.turns, args.min_rounds, args.policy_delay, timed=False)
    for width in swept(args):
        try:
            cell = measure_cell(driver, args.task, width, args.turns, args.min_rounds, args.policy_delay)
        except Exception as exc:  # noqa: BLE001 - reported in the driver's row, the next N still tried
            cell = Cell(driver, width, note=f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300])
        print(CELL + json.dumps(asdict(cell)), flush=True)


# -- supervising children --------------------------------------------------------------------------------------------
TIMEOUT = object()
"""What ``Child.next_line`` returns when its deadline passed first."""


class Child:
    """A command in a session of its own whose process tree is remembered while it runs, so none of it outlives it."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
                                        start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def tree(self) -> list[psutil.Process]:
        """The processes of the child's tree now (remembered for ``stop``)."""
        try:
            root = psutil.Process(self.process.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for process in processes:
            self.seen.setdefault(process.pid, process)
        return processes

    def next_line(self, deadline: float) -> str | None | object:
        """The child's next line of output, None at its end, or ``TIMEOUT`` once ``deadline`` (perf_counter) passed."""
        while True:
            self.tree()
            left = deadline - time.perf_counter()
            if left <= 0:
                return TIMEOUT
            try:
                return self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue

    def last_error(self) -> str:
        """The last line the child wrote on stderr."""
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        return lines[-1][:300] if lines else "no message"

    def stop(self, grace: float = 10.0) -> list[str]:
        """End the child (killing its session if it still runs), then kill what is left of its tree after ``grace``
        seconds; return those killed that way (``describe``)."""
        if self.process.poll() is None:
            with_suppressed(os.killpg, self.process.pid, signal.SIGKILL)
        self.process.wait()
        alive = [process for process in self.seen.values() if process.pid != self.process.pid and alive_now(process)]
        _, alive = psutil.wait_procs(alive, timeout=grace)
        killed = [describe(process) for process in alive]
        for process in alive:
            with_suppressed(process.kill)
        self.stderr.close()
        return killed


def alive_now(process: psutil.Process) -> bool:
    """Whether ``process`` (the same one: psutil checks its start time) still runs and is no zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(process: psutil.Process) -> str:
    """A process in a few words: its pid and the start of its command line."""
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:60] or process.name()}"
    except psutil.Error:
        return str(process.pid)


def left_behind(note: str, killed: list[str]) -> str:
    """``note`` with the processes that outlived their child, if any."""
    if not killed:
        return note
    return (note + "; " if note else "") + f"{len(killed)} processes left behind, killed: {', '.join(killed)}"


def with_suppressed(function: Callable[..., Any], *args: Any) -> None:
    """Call ``function``, ignoring a process that is already gone."""
    try:
        function(*args)
    except (ProcessLookupError, psutil.NoSuchProcess):
        pass


def skipped_after(driver: str, widths: list[int], reason: str) -> list[Cell]:
    """Cells for the widths not run because an earlier one of the same driver could not finish."""
    return [Cell(driver, width, note=reason) for width in widths]


def drive_in_process(driver: str, args: argparse.Namespace) -> list[Cell]:
    """Run an in-process driver's child over every width, each cell within its budget."""
    options = ["--cell-driver", driver, "--task", args.task, "--widths", ",".join(map(str, args.widths)),
               "--turns", str(args.turns), "--min-rounds", str(args.min_rounds),
               "--policy-delay", str(args.policy_delay), "--sweeps", str(args.sweeps),
               *(["--lockstep"] if args.lockstep else [])]
    # started with -c, not as a script: worker processes would import a script's modules again (as its __main__),
    # which is the script's memory, not the envs'
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"from bench_env_drivers import main; main({options!r})")
    child = Child([sys.executable, "-c", code])
    cells: list[Cell] = []
    pending = swept(args)
    deadline = time.perf_counter() + args.budget
    try:
        while pending:
            line = child.next_line(deadline)
            if line is TIMEOUT:
                cells.append(Cell(driver, pending[0], note=f"skipped: past its {args.budget:g} s budget"))
                cells += skipped_after(driver, pending[1:], f"skipped: N={pending[0]} was past its budget")
                break
            if line is None:
                child.process.wait()
                reason = f"failed: exit {child.process.returncode}: {child.last_error()}"
                cells += skipped_after(driver, pending, reason)
                break
            if line.startswith(CELL):
                cell = Cell(**json.loads(line[len(CELL):]))
                cells.append(cell)
                report_cell(cell)
                pending.pop(0)
                deadline = time.perf_counter() + args.budget
    finally:
        left = child.stop()
    cells[-1].note = left_behind(cells[-1].note, left)
    return by_width(cells)


def swept(args: argparse.Namespace) -> list[int]:
    """The widths in the order they are measured: every width in turn, ``--sweeps`` times."""
    return list(args.widths) * args.sweeps


def by_width(cells: list[Cell]) -> list[Cell]:
    """One cell per width (``merged`` over the sweeps), in the order of the widths."""
    widths = list(dict.fromkeys(cell.width for cell in cells))
    return [merged([cell for cell in cells if cell.width == width]) for width in widths]


# -- the command ---------------------------------------------------------------------------------------------------
STEP_LINE = '\n    {"action": '
"""How each step's line starts in a ``.traj`` the writer wrote (``records.trajectories.lined_json``: one step a line,
its keys in MLGym's order, ``action`` first)."""


def recorded_steps(out: Path) -> list[int]:
    """The steps each ``.traj`` under ``out`` holds so far (a file being rewritten counts 0). The bench reads them every
    quarter second while the command plays, on the same cores: a file in the writer's layout has its step lines
    counted, any other is parsed (at 32 envs, parsing took 7 ms of CPU a read, counting takes 2)."""
    counts = []
    for path in sorted(out.rglob("*.traj")):
        try:
            text = path.read_text()
            if text.startswith('{\n  "environment": ') and text.endswith("}\n"):
                counts.append(text.count(STEP_LINE, 0, text.find('\n  "history": ')))
            else:
                counts.append(len(json.loads(text).get("trajectory", [])))
        except (OSError, ValueError):
            counts.append(0)
    return counts


def lost_steps(out: Path, width: int, returncode: int, counts: list[int]) -> str:
    """What the records say was lost: missing episodes, episodes shorter than the others, failed results, the exit."""
    problems = []
    if len(counts) < width:
        problems.append(f"{width - len(counts)} of {width} episodes not recorded")
    if counts and min(counts) < max(counts):
        short = sum(1 for count in counts if count < max(counts))
        problems.append(f"lost steps: {short} episodes recorded {min(counts)}-{max(counts) - 1} of {max(counts)}")
    failed = []
    for path in out.rglob("results.json"):
        with_failure = json.loads(path.read_text()).get("failed")
        if with_failure:
            failed.append(str(with_failure).splitlines()[0][:120])
    if failed:
        problems.append(f"{len(failed)} failed: {failed[0]}")
    if returncode:
        problems.append(f"exit {returncode}")
    return "; ".join(problems)


def command_cell(width: int, args: argparse.Namespace, url: str) -> Cell:
    """Run ``mlgym-registry run --num-envs width`` within the budget: its records, PSS while playing and first turn."""
    from model_server import MODEL

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        command = [sys.executable, "-m", "mlgym_registry.cli", "run", args.task, "--policy", f"openai:{MODEL}",
                   "--base-url", url, "--max-steps", str(args.cli_steps), "--num-envs", str(width), "--seed", "0",
                   "--quiet", "--out", str(out)]
        wall, started = time.time(), time.perf_counter()
        child = Child(command, env={**os.environ, "OPENAI_API_KEY": "bench"})
        first_turn, samples, next_sample, progress, next_poll = None, [], 0.0, [], 0.0
        try:
            while child.process.poll() is None:
                now = time.perf_counter()
                if now - started > args.budget:
                    return Cell("cli", width, note=f"skipped: past its {args.budget:g} s budget")
                if first_turn is None:  # only this until then, so that the first turn is seen within ~50 ms
                    if any(recorded_steps(out)):
                        first_turn = now - started
                    time.sleep(0.05)
                    continue
                if now >= next_sample:
                    processes = child.tree()
                    samples.append(tree_pss(processes))
                    next_sample = now + pss_interval(len(samples))
                if now >= next_poll:
                    progress.append((now - started, recorded_steps(out)))
                    next_poll = now + POLL_SECONDS
                time.sleep(0.05)
            elapsed = time.perf_counter() - started
        finally:
            left = child.stop()
        counts = recorded_steps(out)
        note = lost_steps(out, width, child.process.returncode, counts)
        note = left_behind(note, left)
        last_write = max((path.stat().st_mtime for path in out.rglob("*.traj")), default=wall) - wall
        pss = statistics.median(samples) / MIB if samples else None
        steady = all_playing(progress, width, max(counts, default=0))
        if steady is not None:
            return Cell("cli", width, steady[0], steady[1], first_turn, pss, note, elapsed,
                        window=f"{steady[2]:.1f}-{steady[3]:.1f} s")
        turns = sum(counts)
        seconds = last_write - first_turn if first_turn is not None else 0.0
        return Cell("cli", width, max(turns - 1, 0), seconds, first_turn, pss, note, elapsed,
                    window="first step to last write (no time with every env playing was seen)")


POLL_SECONDS = 0.25
"""How often the command's records are read while it runs (to find the time when every env is playing)."""


def pss_interval(samples: int) -> float:
    """Seconds to the next sample of the command's memory (and list of its processes, remembered to be stopped) after
    ``samples`` of them: every second for the first 5, then every 3 s. The bench runs on the cores it measures, and at
    32 envs one sample reads the memory maps of about 100 processes (50 ms of CPU)."""
    return 1.0 if samples < 5 else 3.0


def all_playing(progress: list[tuple[float, list[int]]], width: int,
                steps: int) -> tuple[int, float, float, float] | None:
    """The command's turns while every env played: from the first poll at which each of the ``width`` episodes had
    recorded a step to the first at which one had recorded all ``steps`` (its episode over), as (turns, seconds,
    start, end); None when no two polls fall in such a time. The envs start one after another (each worker forks and
    builds its env), and the first ones to end leave the cores to the others: neither is the rate of N envs."""
    start = next(((when, sum(counts)) for when, counts in progress
                  if len(counts) >= width and min(counts) >= 1), None)
    end = next(((when, sum(counts)) for when, counts in progress if counts and max(counts) >= steps), None)
    if start is None or end is None or end[0] <= start[0] or end[1] <= start[1]:
        return None
    return end[1] - start[1], end[0] - start[0], start[0], end[0]


def drive_command(args: argparse.Namespace) -> list[Cell]:
    """The command at every width, against a local endpoint that answers the trivial reply (after the delay)."""
    from model_server import Endpoint, completion

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        time.sleep(args.policy_delay)
        return completion(RESPONSE)

    cells: list[Cell] = []
    widths = swept(args)
    with Endpoint(answer) as endpoint:
        for index, width in enumerate(widths):
            cell = command_cell(width, args, endpoint.url)
            cells.append(cell)
            report_cell(cell)
            if cell.note.startswith("skipped"):
                cells += skipped_after("cli", widths[index + 1:], f"skipped: N={width} was past its budget")
                break
    return by_width(cells)


# -- the table -------------------------------------------------------------------------------------------------------
def report_cell(cell: Cell) -> None:
    """One progress line per measured cell, with the load at that time."""
    if cell.rate is None:
        print(f"   {cell.driver:<10} N={cell.width:<3} {cell.note} ({load()})", flush=True)
        return
    extra = f", command {cell.command_seconds:.1f} s ({(cell.turns + 1) / cell.command_seconds:.1f} turns/s)" \
        if cell.command_seconds else ""
    note = f"; {cell.note}" if cell.note else ""
    first = f"{cell.first_turn:.1f} s" if cell.first_turn is not None else "not seen"
    kept = f"median of {len(cell.block_rates)} blocks ({min(cell.block_rates)}-{max(cell.block_rates)} turns/s), " \
        if cell.block_rates else f"while every env played ({cell.window}), " if cell.window else ""
    print(f"   {cell.driver:<10} N={cell.width:<3} {kept}{cell.turns} turns in {cell.seconds:.1f} s: {cell.rate:.1f} "
          f"turns/s, PSS {cell.pss_mib:.0f} MiB, first turn {first}{extra}{note} ({load()})", flush=True)


def per_env_mib(cells: dict[int, Cell], width: int) -> float | None:
    """PSS per env at ``width``: the growth over the envs' baseline (in-process), or for the command its growth over
    the command at the smallest N that has workers (N >= 2)."""
    cell = cells.get(width)
    if cell is None or cell.rate is None or cell.pss_mib is None:
        return None
    if cell.driver != "cli":
        return cell.pss_mib / width
    # one env plays in the command's own process; from 2 envs on, its tree also holds the fork server and workers
    with_workers = [other for other in cells.values() if other.width >= 2 and other.rate is not None]
    if not with_workers or width <= min(other.width for other in with_workers):
        return None
    smallest = min(with_workers, key=lambda other: other.width)
    return (cell.pss_mib - smallest.pss_mib) / (width - smallest.width)


def ratios(cells: dict[int, Cell]) -> dict[int, float]:
    """Turns/s at each width over the smallest width's (only widths that have figures)."""
    one = cells[min(cells)].rate
    if not one:
        return {}
    return {width: cell.rate / one for width, cell in cells.items() if cell.rate is not None}


def targets(driver: str, cells: dict[int, Cell], delay: float) -> str:
    """The driver's targets, each with its figure and verdict (n/a where this run has no figure for it)."""
    if driver not in PROCESS_DRIVERS:
        return "- (reference)"
    ratio = ratios(cells)
    at_cores, plateau = usable_cores(), 16 * usable_cores()
    parts = []
    if at_cores in ratio:
        parts.append(f"N={at_cores} >= {GROWTH_TARGET}x: {verdict(ratio[at_cores] >= GROWTH_TARGET)}")
    else:
        parts.append(f"N={at_cores} >= {GROWTH_TARGET}x: n/a")
    if plateau in ratio:
        within = ratio[plateau] >= PLATEAU_TARGET * max(ratio.values())
        parts.append(f"N={plateau} within 10% of best: {verdict(within)}")
    else:
        parts.append(f"N={plateau} within 10% of best: n/a")
    memory = {width: mib for width in cells if (mib := per_env_mib(cells, width)) is not None}
    judged = verdict(memory[max(memory)] <= MEMORY_TARGET_MIB) if memory else "n/a"
    parts.append(f"<= {MEMORY_TARGET_MIB:g} MiB/env at the largest N: {judged}")
    if driver == "cli":
        first = cells.get(8)
        seen = f"{first.first_turn:.1f} s" if first and first.first_turn is not None else "n/a"
        parts.append(f"first turn N=8 <= {FIRST_TURN_TARGET_S:g} s: {seen} (absolute, not judged)")
        if delay > 0:
            parts.append(f"N=2 >= {GROWTH_TARGET}x with the policy delay: "
                         f"{verdict(ratio[2] >= GROWTH_TARGET) if 2 in ratio else 'n/a'}")
    return "; ".join(parts)


def driver_row(driver: str, cells: dict[int, Cell], widths: list[int], delay: float) -> list[str]:
    """The table's row for one driver: its smallest width in turns/s, the others as ratios, then the summary."""
    ratio = ratios(cells)
    row = [DRIVERS[driver]]
    for width in widths:
        cell = cells.get(width)
        if cell is None or cell.rate is None:
            row.append("skipped" if cell is not None and cell.note.startswith("skipped") else "failed")
        elif width == min(widths):
            row.append(f"{cell.rate:.1f} t/s")
        else:
            row.append(f"{ratio[width]:.2f}x" if width in ratio else "-")
    best = max(ratio, key=ratio.get) if ratio else None
    row.append(f"{ratio[best]:.2f}x (N={best})" if best is not None else "-")
    memory = {width: mib for width in cells if (mib := per_env_mib(cells, width)) is not None}
    row.append(f"{memory[max(memory)]:.1f} (N={max(memory)})" if memory else "-")
    measured = [cell for cell in cells.values() if cell.first_turn is not None]
    top = max(measured, key=lambda cell: cell.width) if measured else None
    row.append(f"{top.first_turn:.1f} s (N={top.width})" if top else "-")
    row.append(targets(driver, cells, delay))
    return row


def print_table(results: dict[str, list[Cell]], widths: list[int], delay: float) -> None:
    """The drivers' table (turns/s at the smallest N, the other N over it) and the notes of failed or skipped cells."""
    header = ["driven by", *(f"{width} env{'s' if width > 1 else ''}" for width in widths), "best", "MiB/env (PSS)",
              "first turn", "target"]
    rows = [driver_row(driver, {cell.width: cell for cell in cells}, widths, delay)
            for driver, cells in results.items()]
    sizes = [max(len(line[column]) for line in [header, *rows]) for column in range(len(header) - 1)]
    for line in [header, [("-" * size) for size in sizes] + ["------"], *rows]:
        print("| " + " | ".join([*(text.ljust(size) for text, size in zip(line, sizes, strict=False)), line[-1]])
              + " |")
    for driver, cells in results.items():
        for cell in cells:
            if cell.sweep_rates:
                print(f"   sweeps, {driver} N={cell.width}: {', '.join(map(str, cell.sweep_rates))} turns/s")
            if cell.note:
                print(f"   note, {driver} N={cell.width}: {cell.note}")


# -- main ------------------------------------------------------------------------------------------------------------
def widths_list(text: str) -> list[int]:
    """``"1,2,4"`` as sorted distinct positive widths."""
    widths = sorted({int(part) for part in text.split(",") if part.strip()})
    if not widths or widths[0] < 1:
        raise argparse.ArgumentTypeError(f"--widths {text!r}: give positive integers, e.g. 1,2,4")
    return widths


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"a short smoke run: {' '.join(QUICK)}")
    parser.add_argument("--widths", type=widths_list, default=[1, 2, 4, 8, 16, 32], help="N, comma-separated")
    parser.add_argument("--drivers", default=",".join(DRIVERS), help="comma-separated, of: " + ", ".join(DRIVERS))
    parser.add_argument("--task", default="prisonersDilemma")
    parser.add_argument("--turns", type=int, default=800, help="turns timed per in-process cell, at least: the envs "
                        "play --min-rounds rounds from a reset as many times as it takes")
    parser.add_argument("--min-rounds", type=int, default=50, help="timed turns per env at least (in-process cells)")
    parser.add_argument("--cli-steps", type=int, default=200, help="--max-steps of each episode the command plays")
    parser.add_argument("--policy-delay", type=float, default=0.0, help="seconds each policy answer takes")
    parser.add_argument("--lockstep", action="store_true",
                        help="the pools play rounds in lockstep (send all N, wait for all N) instead of streaming")
    parser.add_argument("--sweeps", type=int, default=1, help="measure every width in turn this many times and keep "
                        "each width's median (on a shared machine whose load drifts, 3 keeps a slow spell from "
                        "landing on one width alone)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds a cell may take before it is skipped")
    parser.add_argument("--cell-driver", choices=list(STEPPERS), help=argparse.SUPPRESS)  # a driver's child
    args = parser.parse_args(argv)
    if args.quick:  # the quick settings, then whatever the command line says
        args = parser.parse_args([*QUICK, *argv])
    if args.sweeps < 1:
        parser.error(f"--sweeps {args.sweeps}: give 1 or more")
    unknown = set(args.drivers.split(",")) - set(DRIVERS)
    if unknown:
        parser.error(f"--drivers: unknown {', '.join(sorted(unknown))}; choose among {', '.join(DRIVERS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, list[Cell]]:
    """Measure every driver at every width; print the table; return the cells by driver."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    if args.cell_driver:
        serve_cells(args.cell_driver, args)
        return {}
    chosen = [driver for driver in DRIVERS if driver in args.drivers.split(",")]
    started = time.perf_counter()
    print(f"many envs driven five ways: {args.task}, {usable_cores()} cores, widths {args.widths}, in-process cells "
          f"{args.min_rounds}+ turns per env, the command {args.cli_steps} steps per episode, policy delay "
          f"{args.policy_delay:g} s, budget {args.budget:g} s a cell; load averages {load_averages()}", flush=True)
    results: dict[str, list[Cell]] = {}
    for driver in chosen:
        results[driver] = drive_command(args) if driver == "cli" else drive_in_process(driver, args)
    print(f"turns/s of each driver at N over its own at N={args.widths[0]} (one run; policy delay "
          f"{args.policy_delay:g} s); load averages now {load_averages()}")
    print_table(results, args.widths, args.policy_delay)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return results


if __name__ == "__main__":
    main()
