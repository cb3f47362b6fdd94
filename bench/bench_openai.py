"""What the openai policy adds per turn over the bare ``openai`` client call, against an endpoint that answers at once.

The endpoint is a stub in a child process (``--serve``) that answers every chat completion instantly, so the time
measured is the client's and ours: the bare ``client.chat.completions.create`` and ``OpenAIPolicy(messages)`` are
timed alternately on the same conversation (alternating makes a burst of load on the machine hit both alike), at two
conversation lengths. The figure that matters is ours minus bare per turn, in CPU time (target: under 5 ms); times
depend on the machine, so nothing is asserted.

    python bench/bench_openai.py [--turns 100]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TARGET_MS = 5.0
ANSWER = "DISCUSSION\nI list the files first.\n```\nls -a\n```"
COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": ANSWER}}],
    "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020},
}).encode()


class Instant(BaseHTTPRequestHandler):
    """Answers every POST with the same chat completion, keeping the connection open."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: Nagle would hold the body ~40 ms

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(COMPLETION)))
        self.end_headers()
        self.wfile.write(COMPLETION)


def serve(port: int) -> None:
    """Run the stub endpoint on 127.0.0.1:``port`` until killed."""
    ThreadingHTTPServer(("127.0.0.1", port), Instant).serve_forever()


def start_stub() -> tuple[subprocess.Popen, str]:
    """The stub endpoint in a child process, and its base URL once it accepts connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the stub endpoint did not start")


def conversation(messages: int) -> list[dict[str, str]]:
    """About ``messages`` messages shaped like an MLGym episode's: a long system prompt, the task, then turns."""
    chat = [{"role": "system", "content": "You are an autonomous agent in a shell. " * 150},
            {"role": "user", "content": "Improve the strategy in strategy.py. " * 40}]
    while len(chat) < messages:
        chat += [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "file.py  data.csv\n" * 20}]
    return chat


def timed(call, *args, **kwargs) -> tuple[float, float]:
    """(CPU ms of this process, wall ms) of one call. CPU time is the headline: the endpoint runs in another
    process, so it counts only the client's work and not the time spent waiting for a core on a shared machine."""
    cpu, wall = time.process_time(), time.perf_counter()
    call(*args, **kwargs)
    return (time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3


def compare(url: str, messages: int, turns: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(CPU ms, wall ms) per turn of the bare client call and of the policy, ``turns`` each, alternately."""
    import openai

    from mlgym_registry.policies.openai import OpenAIPolicy

    chat = conversation(messages)
    client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=30)
    policy = OpenAIPolicy("bench", base_url=url, timeout=30)
    assert policy(chat) == ANSWER
    for _ in range(5):  # connections opened, caches warm
        client.chat.completions.create(model="bench", messages=chat)
        policy(chat)
    bare, ours = [], []
    for _ in range(turns):
        bare.append(timed(client.chat.completions.create, model="bench", messages=chat))
        ours.append(timed(policy, chat))
    client.close()
    policy.close()
    return bare, ours


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100, help="turns timed per conversation length and side")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return {}

    started = time.monotonic()
    process, url = start_stub()
    overheads: dict[str, float] = {}
    try:
        for messages in (20, 200):
            bare, ours = compare(url, messages, args.turns)
            (bare_cpu, bare_wall), (ours_cpu, ours_wall) = (
                tuple(statistics.median(column) for column in zip(*side, strict=True)) for side in (bare, ours))
            overhead = ours_cpu - bare_cpu
            overheads[f"overhead_ms_{messages}"] = overhead
            met = "met" if overhead < TARGET_MS else "NOT met"
            print(f"~{messages} messages, medians of {args.turns} turns: bare client {bare_cpu:.2f} ms CPU "
                  f"({bare_wall:.2f} ms wall), openai policy {ours_cpu:.2f} ms CPU ({ours_wall:.2f} ms wall)")
            print(f"  overhead per turn: {overhead:+.2f} ms CPU ({ours_wall - bare_wall:+.2f} ms wall), ratio "
                  f"policy/bare {ours_cpu / bare_cpu:.3f} (target < {TARGET_MS:g} ms: {met})")
    finally:
        process.kill()
        process.wait()
    print(f"done in {time.monotonic() - started:.1f} s")
    return overheads


if __name__ == "__main__":
    main()
