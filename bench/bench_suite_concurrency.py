"""A suite played with ``bench --num-envs N``: wall time for N = 1, 2, 4, and how many runs and requests were in
flight, with this checkout's code and, given ``--before SRC``, with an older checkout's (``git worktree add``).

The same suite (``--runs`` runs of each of ``--tasks``, ``--seed 0``) is played as a command for each N and each
code, alternately, ``--rounds`` times; the best wall time of the rounds is kept (other work on the machine only
slows a sample down). Printed per N: the wall time of each code, before over now, and now's speed-up over N = 1.
Whether every play gave the same scores is printed too (run k is seeded ``seed + k`` whatever N).

Two policies:

- ``scripted`` (default): no model. The runs are the evaluations' CPU work, so on a machine with few cores N
  workers gain at most what its free cores allow.
- ``--serve``: ``transformers serve`` over the tiny model (``tests/model_server.TinyServer``), reached through
  a counting proxy in this process, which gives the mean number of chat requests in flight while the suite played
  and the most at once: what ``--num-envs`` is meant to keep at N.

Nothing is asserted: times depend on the machine.

    python bench/bench_suite_concurrency.py [--before /tmp/basetree/src] [--serve] [--tasks prisonersDilemma,blotto]
        [--runs 6] [--max-steps 4] [--envs 1 2 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

NOW = "now"
BEFORE = "before"


class Gauge:
    """Requests in flight over time: the most at once and the time-weighted mean between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current = self.most = 0
        self.area = 0.0
        self.since = self.began = time.monotonic()

    def start(self) -> None:
        """Count from now on, from zero."""
        with self.lock:
            self.most, self.area = self.current, 0.0
            self.since = self.began = time.monotonic()

    def change(self, delta: int) -> None:
        """One request more (+1) or fewer (-1) in flight."""
        with self.lock:
            now = time.monotonic()
            self.area += self.current * (now - self.since)
            self.since, self.current = now, self.current + delta
            self.most = max(self.most, self.current)

    def mean(self) -> float:
        """The mean number in flight since ``start``."""
        self.change(0)
        return self.area / max(self.since - self.began, 1e-9)


def counting_proxy(upstream: str, gauge: Gauge) -> ThreadingHTTPServer:
    """An HTTP proxy on 127.0.0.1 to ``upstream`` (``http://host:port``) that counts requests in flight; serving in a
    thread."""

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            request = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                             headers={"Content-Type": self.headers.get("Content-Type", "")})
            gauge.change(+1)
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    status, payload, kind = response.status, response.read(), response.headers.get("Content-Type")
            except urllib.error.HTTPError as error:
                status, payload, kind = error.code, error.read(), error.headers.get("Content-Type")
            finally:
                gauge.change(-1)
            self.send_response(status)
            self.send_header("Content-Type", kind or "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def play(code: str, before: str | None, num_envs: int, args: argparse.Namespace,
         policy: list[str]) -> tuple[float, dict]:
    """Wall time of the suite as a command with ``code`` (``BEFORE``: ``before`` first on ``PYTHONPATH``), and each
    run's scores by folder name."""
    env = dict(os.environ)
    if code == BEFORE:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [before, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "suite"
        command = [sys.executable, "-m", "mlgym_registry.cli", "bench", *args.tasks.split(","), "--runs",
                   str(args.runs), "--max-steps", str(args.max_steps), "--seed", "0", "--num-envs", str(num_envs),
                   "--out", str(out), "--quiet", *policy]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{code} --num-envs {num_envs} exited {done.returncode}:\n{done.stderr[-2000:]}")
        scores = {run.name: json.loads((run / "results.json").read_text()).get("agent")
                  for run in sorted(out.glob("*__run_*"))}
    return elapsed, scores


def main(argv: list[str] | None = None) -> dict[tuple[str, int], float]:
    """Run the bench and print its ratios; the best wall time by (code, N)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None, help="an older checkout's src folder, e.g. /tmp/basetree/src")
    parser.add_argument("--serve", action="store_true", help="the tiny model through transformers serve")
    parser.add_argument("--tasks", default="prisonersDilemma,blotto")
    parser.add_argument("--runs", type=int, default=6, help="runs per task (default 6: 12 runs over two tasks)")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    codes = [BEFORE, NOW] if args.before else [NOW]
    policy: list[str] = []
    server = proxy = None
    gauge = Gauge()
    if args.serve:
        from model_server import TinyServer

        server = TinyServer(Path(tempfile.mkdtemp(prefix="bench-serve-"))).wait()
        proxy = counting_proxy(server.url.removesuffix("/v1"), gauge)
        policy = ["--policy", f"openai:{server.model}", "--base-url", f"http://127.0.0.1:{proxy.server_port}/v1",
                  "--max-tokens", "8", "--temperature", "0", "--model-name", "tiny"]
        print(f"transformers serve ready after {server.ready_after:.1f} s")
    print(f"{args.runs} runs of each of {args.tasks} ({args.max_steps} steps at most), policy "
          f"{'tiny model served' if args.serve else 'scripted'}; load {os.getloadavg()[0]:.1f}")
    walls: dict[tuple[str, int], list[float]] = {}
    flight: dict[tuple[str, int], tuple[float, int]] = {}
    scores: list[dict] = []
    try:
        for round_ in range(args.rounds):
            for num_envs in args.envs:
                for code in codes:
                    gauge.start()
                    elapsed, played = play(code, args.before, num_envs, args, policy)
                    walls.setdefault((code, num_envs), []).append(elapsed)
                    if args.serve:
                        flight[(code, num_envs)] = (gauge.mean(), gauge.most)
                    scores.append(played)
                    print(f"  round {round_ + 1}: {code:<6} --num-envs {num_envs}: {elapsed:6.1f} s"
                          + (f", requests in flight: mean {gauge.mean():.2f}, most {gauge.most}" if args.serve else "")
                          + f" (load {os.getloadavg()[0]:.1f})")
    finally:
        if proxy is not None:
            proxy.shutdown()
        if server is not None:
            server.stop()
    best = {key: min(samples) for key, samples in walls.items()}
    for num_envs in args.envs:
        line = f"--num-envs {num_envs}: now {best[(NOW, num_envs)]:6.1f} s"
        line += f" ({best[(NOW, args.envs[0])] / best[(NOW, num_envs)]:.2f}x over --num-envs {args.envs[0]})"
        if args.before:
            line += f"; before {best[(BEFORE, num_envs)]:6.1f} s"
            line += f" ({best[(BEFORE, args.envs[0])] / best[(BEFORE, num_envs)]:.2f}x over --num-envs {args.envs[0]})"
            line += f"; before / now {best[(BEFORE, num_envs)] / best[(NOW, num_envs)]:.2f}"
        for code in codes if args.serve else ():
            mean, most = flight[(code, num_envs)]
            line += f"; {code}: requests in flight mean {mean:.2f}, most {most}"
        print(line)
    print(f"same scores in every play: {all(played == scores[0] for played in scores)}")
    return best


if __name__ == "__main__":
    main()
