"""Episodes on Ray against worker processes on this machine: throughput, scaling, start-up and memory.

Every figure is measured in this one run and printed as a ratio beside its target:

- **Ray over processes**: steps per second of 4 episodes on a local Ray runtime with 2 actors against
  ``--num-envs 2`` without Ray (TorchRL's multi-process collector), both net of start-up (the rate is taken from the
  first step to the last). Target: at least 0.8x. Start-up (runtime, actors, first step) is printed apart.
- **Scaling**: steps per second with 2 actors against 1 actor (each playing its episodes one after another), net of
  start-up. Target: at least 1.6x.
- **Driver memory**: the driver's resident memory, sampled through runs of 2 and of 16 concurrent remote episodes;
  its growth (peak during the run over the level before it) at 16 against at 2. Target: within 20% (1.2x). The
  resident memory of each actor process is printed too.

    python bench/bench_ray.py [--task prisonersDilemma] [--quick]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import dataclass, field

import psutil

from mlgym_registry.scale.ray_runtime import ray_session
from mlgym_registry.scale.runs import run_episodes


@dataclass
class Timing:
    """When each step of a run arrived."""

    started: float = field(default_factory=time.monotonic)
    steps: list[float] = field(default_factory=list)

    def on_step(self, finished: int, steps: int) -> None:
        if steps > len(self.steps):
            self.steps.append(time.monotonic())

    @property
    def startup(self) -> float:
        """Seconds from the call to the first step."""
        return self.steps[0] - self.started

    @property
    def rate(self) -> float:
        """Steps per second from the first step to the last."""
        return (len(self.steps) - 1) / (self.steps[-1] - self.steps[0])


def timed(task: str, engine: str, num_envs: int, per_env: int) -> tuple[Timing, int]:
    timing = Timing()
    results = run_episodes(task, "scripted", num_envs, engine=engine, seed=0, episodes_per_env=per_env,
                           on_step=timing.on_step)
    assert all(result.finished for result in results), [result.failure for result in results]
    return timing, len(results)


class MemorySampler:
    """Samples this process's resident memory, and the actors', in the background while a run goes."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.driver_peak = 0
        self.actor_rss: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> MemorySampler:
        self.before = psutil.Process().memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            self.driver_peak = max(self.driver_peak, me.memory_info().rss)
            actors = [p.memory_info().rss for p in psutil.process_iter(["cmdline"])
                      if (p.info["cmdline"] or [""])[0].startswith("ray::EpisodeWorker")]
            if len(actors) > len(self.actor_rss) or (actors and max(actors) > max(self.actor_rss)):
                self.actor_rss = actors
            time.sleep(self.interval)

    @property
    def growth(self) -> int:
        return self.driver_peak - self.before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="prisonersDilemma")
    parser.add_argument("--quick", action="store_true", help="fewer episodes (a smoke run, figures are rougher)")
    args = parser.parse_args()
    many = 4 if args.quick else 16
    print(f"Ray bench, task {args.task}, {os.cpu_count()} CPUs")

    per_env = 2 if args.quick else 3
    process, _ = timed(args.task, "process", 2, per_env)
    print(f"processes, 2 envs x {per_env} episodes: {process.rate:.2f} steps/s, start-up {process.startup:.1f} s")

    started = time.monotonic()
    with ray_session(num_cpus=os.cpu_count()):
        runtime = time.monotonic() - started
        print(f"local Ray runtime start-up: {runtime:.1f} s")
        ray2, _ = timed(args.task, "ray", 2, per_env)
        print(f"Ray, 2 actors x {per_env} episodes: {ray2.rate:.2f} steps/s, actors' start-up {ray2.startup:.1f} s")
        ray1, _ = timed(args.task, "ray", 1, per_env)
        print(f"Ray, 1 actor x {per_env} episodes: {ray1.rate:.2f} steps/s, start-up {ray1.startup:.1f} s")
        me = psutil.Process()
        cpu_before = sum(me.cpu_times()[:2])
        timing, _ = timed(args.task, "ray", many, 1)
        per_step = 1000 * (sum(me.cpu_times()[:2]) - cpu_before) / len(timing.steps)
        print(f"driver CPU with {many} concurrent remote episodes: {per_step:.1f} ms per step (actors' start-up and "
              f"Ray's own driver threads included)")
        samples = {}
        for count in (2, many):
            with MemorySampler() as sampler:
                timed(args.task, "ray", count, 1)
            samples[count] = sampler
            actors = sampler.actor_rss
            print(f"{count} concurrent remote episodes: driver grew {sampler.growth / 2**20:.1f} MiB "
                  f"(peak {sampler.driver_peak / 2**20:.0f} MiB); actor processes of "
                  f"{min(actors) / 2**20:.0f}-{max(actors) / 2**20:.0f} MiB resident")

    ratio = ray2.rate / process.rate
    scaling = ray2.rate / ray1.rate
    small, large = samples[2], samples[many]
    memory = large.driver_peak / small.driver_peak
    print(f"Ray over processes (steps/s, net of start-up): {ratio:.2f}x (target >= 0.8x)")
    print(f"scaling 1 -> 2 actors (steps/s, net of start-up): {scaling:.2f}x (target >= 1.6x)")
    print(f"driver peak memory, {many} over 2 concurrent episodes: {memory:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
