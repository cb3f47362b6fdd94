"""How close the multiprocessing pool comes, at N = cores, to what its own split of the CPU allows on this machine.

An ``AsyncEnvPool(backend="multiprocessing")`` is a pipeline: the trainer, one process, spends T ms of CPU on every
turn of every env, one after another (receiving and decoding the output, the policy's answer, encoding the input);
each env's worker spends W ms stepping it. On C cores, N = C envs put C + 1 busy processes on C cores, so turns/s at
N = C over one env stays below C by an amount that grows with T's share of the turn, whatever the env does.

The bench measures T and W on the real pool at N = 1 (CPU time of the trainer, its queue threads included, and of
the worker with its children, over timed turns), then builds a stand-in of the same shape: TorchRL's queue layout (one
input queue per worker, one result queue shared by all), whose trainer and workers do nothing but burn T and W ms of
CPU a turn. It then times, in alternating blocks with every pool alive (so a change of the machine's load lands on
every width alike), N = 1 and N = C of:

- the real pool (docs/scaling.md's recipe, the trivial policy of ``bench_env_drivers.py``);
- the stand-in with the measured T and W;
- the stand-in with half the trainer's T (what halving the trainer's share would give);
- the stand-in with T = 0: C independent loops, what this machine gives C busy processes at all.

It prints each one's turns/s and its ratio (median over paired blocks), and the real pool's ratio over the stand-in's:
how much of the ceiling its split of the CPU leaves the pool reaches. A ratio is only comparable within one run.

    python bench/bench_pool_ceiling.py [--task prisonersDilemma] [--blocks 60] [--rounds 10] [--width C]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other bench scripts, when loaded from a file path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_env_drivers import ProcessPoolStepper  # noqa: E402
from bench_evaluation import load as load_averages  # noqa: E402
from bench_parallel import warm_up  # noqa: E402
from bench_serve import cpu_seconds  # noqa: E402

from mlgym_registry.machine import usable_cores  # noqa: E402

RESTART_EVERY = 5
"""Blocks between two resets of the real pools' envs (so every width plays episodes of the same length)."""


def burn(milliseconds: float) -> None:
    """Spend ``milliseconds`` of this thread's CPU time."""
    end = time.thread_time() + milliseconds / 1000
    while time.thread_time() < end:
        pass


def stand_in_worker(index: int, inbox: Any, results: Any, worker_ms: float) -> None:
    """A stand-in env's worker: for every request, burn ``worker_ms`` and answer with its index."""
    while inbox.get() is not None:
        burn(worker_ms)
        results.put(index)


class StandIn:
    """A pipeline of the pool's shape whose trainer burns ``trainer_ms`` per turn and each worker ``worker_ms``; it is
    stepped as ``bench_env_drivers.PoolStepper`` steps a pool (whatever is back is answered and sent again)."""

    def __init__(self, width: int, trainer_ms: float, worker_ms: float):
        context = multiprocessing.get_context("fork")  # the workers run nothing but this module's loop
        self.width, self.trainer_ms = width, trainer_ms
        self.results = context.Queue(maxsize=width)
        self.inboxes = [context.Queue(maxsize=1) for _ in range(width)]
        self.workers = [context.Process(target=stand_in_worker, args=(index, inbox, self.results, worker_ms),
                                        daemon=True) for index, inbox in enumerate(self.inboxes)]
        for worker in self.workers:
            worker.start()
        for inbox in self.inboxes:
            inbox.put(True)

    def round(self) -> None:
        """``width`` turns received, each answered at once."""
        for _ in range(self.width):
            index = self.results.get()
            burn(self.trainer_ms)
            self.inboxes[index].put(True)

    def restart(self) -> None:
        """Nothing to reset."""

    def close(self) -> None:
        for _ in range(self.width):
            self.results.get()
        for inbox in self.inboxes:
            inbox.put(None)
        for worker in self.workers:
            worker.join(timeout=10)


def split_of(stepper: ProcessPoolStepper, rounds: int, blocks: int) -> tuple[float, float]:
    """The trainer's and the worker's CPU per turn (ms) of a one-env pool, over ``blocks`` timed blocks."""
    workers = [process.pid for process in stepper.pool.threads]

    def workers_cpu() -> float:
        return sum(cpu_seconds(pid) for pid in workers)  # each worker with its sandbox's processes

    trainer = worker = 0.0
    for block in range(blocks):
        if block % RESTART_EVERY == 0:
            stepper.restart()
        mine, theirs = time.process_time(), workers_cpu()
        for _ in range(rounds):
            stepper.round()
        trainer += time.process_time() - mine
        worker += workers_cpu() - theirs
    turns = rounds * blocks
    return trainer / turns * 1000, worker / turns * 1000


def block_rate(stepper: Any, rounds: int) -> float:
    """Turns/s of ``rounds`` rounds of ``stepper``."""
    started = time.perf_counter()
    for _ in range(rounds):
        stepper.round()
    return rounds * stepper.width / (time.perf_counter() - started)


def paired(pairs: dict[str, tuple[Any, Any]], rounds: int, blocks: int) -> dict[str, tuple[list[float], list[float]]]:
    """Turns/s of each pair's one-env and N-env stepper, block after block, every stepper in turn."""
    rates: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pairs}
    for block in range(blocks):
        for name, (one, many) in pairs.items():
            if block % RESTART_EVERY == 0:
                one.restart()
                many.restart()
            rates[name][0].append(block_rate(one, rounds))
            rates[name][1].append(block_rate(many, rounds))
    return rates


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="prisonersDilemma")
    parser.add_argument("--blocks", type=int, default=60, help="paired blocks timed per stepper")
    parser.add_argument("--rounds", type=int, default=10, help="turns per env in a block")
    parser.add_argument("--width", type=int, default=usable_cores(), help="N compared with one env (the cores)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure; print the table; return each stepper's ratio by name."""
    import tensordict

    from mlgym_registry.interop.torchrl.env_factory import EnvFactory

    args = parse(argv)
    tensordict.set_list_to_stack(True).set()
    warm_up(["forkserver"])
    factory = EnvFactory.from_spec(args.task, max_steps=10**6)
    print(f"the pool's ceiling: {args.task}, {usable_cores()} cores, N = 1 and {args.width}, {args.blocks} paired "
          f"blocks of {args.rounds} turns per env; load averages {load_averages()}", flush=True)
    opened: list[Any] = []
    try:
        real = (ProcessPoolStepper(factory, 1, 0.0), ProcessPoolStepper(factory, args.width, 0.0))
        opened.extend(real)
        trainer_ms, worker_ms = split_of(real[0], args.rounds, max(10, args.blocks // 3))
        print(f"the real pool at N=1: the trainer spends {trainer_ms:.2f} ms of CPU a turn, the worker {worker_ms:.2f} "
              f"ms (the trainer's share {trainer_ms / (trainer_ms + worker_ms):.0%})", flush=True)
        pairs: dict[str, tuple[Any, Any]] = {"the real pool": real}
        for name, trainer in (("a stand-in with the same split", trainer_ms),
                              ("the stand-in, the trainer's T halved", trainer_ms / 2),
                              ("the stand-in's workers alone (T = 0)", 0.0)):
            pair = (StandIn(1, trainer, worker_ms + trainer_ms - trainer),
                    StandIn(args.width, trainer, worker_ms + trainer_ms - trainer))
            opened.extend(pair)
            pairs[name] = pair
        rates = paired(pairs, args.rounds, args.blocks)
    finally:
        for stepper in opened:
            stepper.close()
    print(f"{'':40} {'N=1 t/s':>9} {f'N={args.width} t/s':>9} {'ratio':>6}   (medians of paired blocks; a stand-in's "
          "turn costs the real one's CPU in all)")
    ratios: dict[str, float] = {}
    for name, (ones, manys) in rates.items():
        ratios[name] = statistics.median(many / one for one, many in zip(ones, manys, strict=True))
        print(f"{name:40} {statistics.median(ones):9.1f} {statistics.median(manys):9.1f} {ratios[name]:5.2f}x")
    reached = ratios["the real pool"] / ratios["a stand-in with the same split"]
    print(f"the real pool reaches {reached:.0%} of the ratio its split of the CPU allows here; load averages now "
          f"{load_averages()}")
    return ratios


if __name__ == "__main__":
    main()
