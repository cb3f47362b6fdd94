"""What the verifiers face adds per step over the env in process, measured side by side in one run.

- in process: a trivial step (``echo hi``) on ``registry.make``'s env through the Gymnasium face, timed around
  ``env.step``;
- through the face: verifiers' own evaluation loop plays rollouts of the same step against a scripted
  OpenAI-compatible endpoint in this process (``tests/model_server.Endpoint``, answering at once); a step's time is
  verifiers' own measure of the env's part of a turn (``timing.env``: from the model's reply to the next prompt,
  which holds the face's hop to its episode thread and the message conversions);
- alternated: each round times ``--steps`` steps in process, then one rollout of as many through the face.

The ratio of the medians is the figure that matters; absolute times depend on the machine and its load. The whole
turn through the face (the env's part plus the model call to the endpoint) is printed beside it.

    python bench/bench_verifiers.py [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import verifiers as vf  # noqa: E402
from model_server import MODEL, Endpoint, completion  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from mlgym_registry.faces.gymnasium import MLGymRegistryEnv  # noqa: E402
from mlgym_registry.faces.verifiers import ENV_ID  # noqa: E402

TASK = "prisonersDilemma"
RESPONSE = "I print a greeting.\n```\necho hi\n```\n"
SKIP = "Done.\n```\nskip\n```\n"
MAX_STEPS = 10**6


def script(steps: int):
    """The endpoint's answer for each turn: ``steps`` greetings, then ``skip`` (the episode ends, nothing evaluated)."""
    def reply(request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(message["role"] == "assistant" for message in request["messages"])
        return completion(RESPONSE if turn < steps else SKIP)
    return reply


def in_process_ms(steps: int) -> list[float]:
    """Wall ms of ``steps`` trivial steps on a fresh episode of the env in this process (as each rollout has)."""
    times = []
    with MLGymRegistryEnv(TASK, max_steps=MAX_STEPS) as env:
        env.reset(seed=0)
        for _ in range(steps):
            start = time.perf_counter()
            env.step(RESPONSE)
            times.append((time.perf_counter() - start) * 1e3)
    return times


def face_ms(env: Any, url: str, steps: int) -> tuple[list[float], list[float]]:
    """One rollout of ``steps`` trivial steps through the face: verifiers' env time per step and whole turn, in ms."""
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=url, api_key="bench", max_retries=0))
    results = asyncio.run(env.evaluate(client=client, model=MODEL, num_examples=1, rollouts_per_example=1,
                                       on_start=lambda *_: None, on_progress=lambda *_: None))
    (output,) = results["outputs"]
    assert output["info"]["mlgym"]["exit_status"] == "skipped", output.get("error")
    timing = output["timing"]
    env_spans = [span["duration"] * 1e3 for span in timing["env"]["spans"]][:steps]
    model_spans = [span["duration"] * 1e3 for span in timing["model"]["spans"]][1:steps + 1]
    return env_spans, [e + m for e, m in zip(env_spans, model_spans, strict=True)]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per round and side")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternating the two sides")
    args = parser.parse_args(argv)
    started = time.monotonic()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    face = vf.load_environment(ENV_ID, task=TASK, max_steps=MAX_STEPS)
    for number, handler in handlers.items():  # verifiers' Environment installs its own; keep the caller's
        signal.signal(number, handler)
    here, through, turns = [], [], []
    with Endpoint(script(args.steps)) as endpoint:
        face_ms(face, endpoint.url, args.steps)  # warm: the first rollout builds the dataset
        in_process_ms(args.steps)
        for _ in range(args.rounds):
            here += in_process_ms(args.steps)
            env_part, whole = face_ms(face, endpoint.url, args.steps)
            through += env_part
            turns += whole
    here_ms, face_step_ms, turn_ms = (statistics.median(v) for v in (here, through, turns))
    ratios = {"face_over_in_process_step": face_step_ms / here_ms}
    print(f"cores: {os.cpu_count()}; load: {os.getloadavg()[0]:.2f}")
    print(f"trivial step, medians of {len(here)}: through the verifiers face {face_step_ms:.1f} ms, in process "
          f"{here_ms:.1f} ms: ratio {ratios['face_over_in_process_step']:.2f}")
    print(f"whole turn through the face (the env's part and the call to an endpoint answering at once): "
          f"{turn_ms:.1f} ms")
    print(f"done in {time.monotonic() - started:.1f} s")
    return ratios


if __name__ == "__main__":
    main()
