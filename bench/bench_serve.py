"""What serving over OpenEnv costs, measured side by side in one run.

- overhead: median time of a trivial step (``echo hi``) through OpenEnv's ``GenericEnvClient`` and a
  ``mlgym-registry serve`` process, divided by the median time of the same step on ``registry.make``'s env in this
  process, alternated in the same run;
- sessions: S clients stepping at once on one server process, and on W server processes (``--workers``): the steps
  per second over one session's, and the servers' CPU time per step (all their processes: the server and its
  sandboxes), from which the steps per second one core sustains follow.

Ratios are the figures that matter; absolute times depend on the machine and its load.

    python bench/bench_serve.py [--steps 40] [--sessions 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import psutil
from openenv import GenericEnvClient

from mlgym_registry.faces.gymnasium import MLGymRegistryEnv

TASK = "prisonersDilemma"
RESPONSE = "I print a greeting.\n```\necho hi\n```\n"
MAX_STEPS = 10**6


def start_server(max_sessions: int) -> tuple[subprocess.Popen, str]:
    """A ``serve`` process on a free loopback port, and its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "mlgym_registry.cli", "serve", TASK, "--port", "0",
                             "--max-sessions", str(max_sessions), "--max-steps", str(MAX_STEPS)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        raise SystemExit(f"the server did not start: {line}")
    return proc, line.split(" at ")[-1].strip()


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and everything under it so far."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass
    return total


def timed_ms(function) -> float:
    start = time.perf_counter()
    function()
    return (time.perf_counter() - start) * 1e3


def overhead(url: str, steps: int) -> tuple[float, float]:
    """Median served and in-process step times (ms), alternated."""
    local = MLGymRegistryEnv(TASK, max_steps=MAX_STEPS)
    local.reset(seed=0)
    served, here = [], []
    with GenericEnvClient(base_url=url, message_timeout_s=600).sync() as remote:
        remote.reset(seed=0)
        for _ in range(steps):
            served.append(timed_ms(lambda: remote.step({"response": RESPONSE})))
            here.append(timed_ms(lambda: local.step(RESPONSE)))
    local.close()
    return statistics.median(served), statistics.median(here)


def throughput(urls: list[str], pids: list[int], sessions: int, steps: int) -> tuple[float, float]:
    """Steps per second of ``sessions`` clients spread over ``urls``, and the servers' CPU ms per step."""
    clients = [GenericEnvClient(base_url=urls[i % len(urls)], message_timeout_s=600).sync() for i in range(sessions)]
    for client in clients:
        client.connect()
        client.reset(seed=0)
    barrier = threading.Barrier(sessions + 1)

    def play(client) -> None:
        barrier.wait()
        for _ in range(steps):
            client.step({"response": RESPONSE})

    threads = [threading.Thread(target=play, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    for client in clients:
        client.close()
    return sessions * steps / elapsed, cpu * 1e3 / (sessions * steps)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per session and measurement")
    parser.add_argument("--sessions", type=int, default=4, help="sessions stepping at once")
    parser.add_argument("--workers", type=int, default=2, help="server processes for the last measurement")
    args = parser.parse_args(argv)
    servers = [start_server(args.sessions) for _ in range(max(1, args.workers))]
    try:
        urls, pids = [url for _, url in servers], [proc.pid for proc, _ in servers]
        served_ms, local_ms = overhead(urls[0], args.steps)
        one, one_cpu = throughput(urls[:1], pids[:1], 1, args.steps)
        many, many_cpu = throughput(urls[:1], pids[:1], args.sessions, args.steps)
        spread, spread_cpu = throughput(urls, pids, args.sessions, args.steps)
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=60)
    ratios = {"served_over_in_process_step": served_ms / local_ms, "sessions_over_one_steps_per_s": many / one,
              "workers_over_one_process_steps_per_s": spread / many}
    print(f"cores: {os.cpu_count()}; load: {os.getloadavg()[0]:.2f}")
    print(f"trivial step: served {served_ms:.1f} ms, in process {local_ms:.1f} ms: ratio "
          f"{ratios['served_over_in_process_step']:.2f}")
    print(f"1 session: {one:.1f} steps/s, {one_cpu:.1f} ms of server CPU per step")
    print(f"{args.sessions} sessions, 1 process: {many:.1f} steps/s ({ratios['sessions_over_one_steps_per_s']:.2f}x "
          f"one session), {many_cpu:.1f} ms CPU per step: {1e3 / many_cpu:.0f} steps/s per core")
    print(f"{args.sessions} sessions, {len(servers)} processes: {spread:.1f} steps/s "
          f"({ratios['workers_over_one_process_steps_per_s']:.2f}x one process), {spread_cpu:.1f} ms CPU per step")
    return ratios


if __name__ == "__main__":
    main()
