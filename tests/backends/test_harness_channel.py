"""The evaluator's channel to the agent's process (``harness.py``), through the public path: ``validate``.

A function called on a growing list (a game's history, called once per move as MLGym's evaluators do) crosses as what
changed since its previous call; the agent's function must still see exactly the evaluator's list every call, and a
hostile agent's process that writes garbage into the shared memory gets ``agent_error``, never a hang nor a score.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.specs import TaskSpec

EXACT_EVALUATE = textwrap.dedent(
    """\
    import json

    from strategy import row_strategy

    ok = total = 0


    def check(items):
        global ok, total
        total += 1
        ok += row_strategy(items) == repr(items)


    history = []
    for i in range(40):
        check(history)
        history.append((i % 2, i % 3))
    check(history)
    history[3] = (True, 1.0)  # equal to what was there, but another object of other types
    check(history)
    del history[5:]
    check(history)
    history.append((1, "x", None, 2.5, b"y", (1, (2,))))
    check(history)
    other = [(0, 1)]
    check(other)
    check(history)
    mutable = [(0, [1, 2])]  # not frozen: crosses whole
    check(mutable)
    mutable[0][1].append(3)
    check(mutable)
    mutable.append((1, [4]))
    check(mutable)
    check(history)
    history.clear()
    check(history)
    big = [(i, -i, 2**70) for i in range(3000)]  # a message longer than nothing but an int
    check(big)
    big.append((1, 1, 1))
    check(big)
    print(json.dumps({"Score": ok / total, "calls": total}))
    """
)
EXACT_STRATEGY = textwrap.dedent(
    """\
    def row_strategy(history):
        seen = repr(history)
        for item in history:  # corrupt whatever can be corrupted: a cache of the list must not see it
            for part in item if isinstance(item, tuple) else ():
                if isinstance(part, list):
                    part.append("junk")
        history.append("junk")
        history.reverse()
        return seen
    """
)

PATHS_EVALUATE = textwrap.dedent(
    """\
    import json

    from strategy import row_strategy

    PAYOFF = ((3, 0), (5, 1))
    delta = general = 0
    for game in range(300):
        history = []
        for round_ in range(10):
            mine = row_strategy(history)  # one list argument of frozen items: the delta path
            again = row_strategy(list(history), general=True)  # a keyword: the general path
            theirs = (game * 7 + round_ * 3) % 2
            delta += PAYOFF[mine][theirs]
            general += PAYOFF[again][theirs]
            history.append((mine, theirs))
    print(json.dumps({"Score": delta / 3000, "general": general / 3000}))
    """
)
PATHS_STRATEGY = textwrap.dedent(
    """\
    def row_strategy(history, general=False):
        if not history:
            return 0
        return (sum(theirs for _, theirs in history) + len(history)) % 2
    """
)

HOSTILE_STRATEGY = textwrap.dedent(
    """\
    import mmap
    import os
    import struct
    import sys
    import time

    MODE = {mode!r}
    FD = int(sys.argv[sys.argv.index("--memory-fd") + 1])
    MEMORY = mmap.mmap(FD, os.fstat(FD).st_size)
    ANSWER = 4096 + (os.fstat(FD).st_size - 4096) // 2


    def answer(payload, length=None, more=0):
        struct.pack_into("<IB", MEMORY, ANSWER, len(payload) if length is None else length, more)
        MEMORY[ANSWER + 5:ANSWER + 5 + len(payload)] = payload
        MEMORY[128] = (MEMORY[128] + 1) & 255  # the answer's sequence byte, as if the harness had answered
        time.sleep(60)


    def row_strategy(history):
        if MODE == "oversized":
            answer(b"", length=0xFFFFFFFF)
        elif MODE == "broken_chunk":
            answer(b"I", length=1, more=1)
        elif MODE == "unknown_tag":
            answer(b"X\\x01\\x02")
        elif MODE == "short_int":
            answer(b"I\\x01")
        elif MODE == "nested":
            answer(b"J" + b"[" * 200000 + b"]" * 200000)
        elif MODE == "shrink":
            try:
                os.ftruncate(FD, 0)  # would make the evaluator's next read of the memory a fatal SIGBUS
            except OSError:
                return 0
            return 1
        return 0
    """
)
HOSTILE_EVALUATE = textwrap.dedent(
    """\
    import json

    from strategy import row_strategy

    history = []
    for _ in range(5):
        move = row_strategy(history)
        if move not in (0, 1):
            raise ValueError(move)
        history.append((move, 0))
    print(json.dumps({"Score": 3.0 - move}))
    """
)


def game_spec(folder: Path, evaluate: str, strategy: str) -> TaskSpec:
    """A python task whose evaluator and starter strategy are these."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(evaluate)
    (folder / "strategy.py").write_text(strategy)
    return TaskSpec(
        id="channelGame", name="Channel game", description="Write row_strategy.",
        task_entrypoint="PythonSubmissionTasks", training_timeout=120, starter_code=["strategy.py", "evaluate.py"],
        baseline_scores=[{"Score": 1.0}],
        evaluation_paths=["evaluate.py"], evaluation_read_only=True, max_steps=10, root=str(folder),
    )


def validate(spec: TaskSpec) -> tuple[dict, float]:
    """``(info, seconds)`` of one ``validate`` on a fresh backend of ``spec``."""
    env = LocalBackend(spec, seed=0)
    try:
        env.reset()
        env.install_tools()
        start = time.monotonic()
        _, _, _, info = env.step("validate")
        return info, time.monotonic() - start
    finally:
        env.close()


def test_a_list_argument_is_exactly_the_evaluators_each_call_whatever_the_function_does_to_it(tmp_path):
    info, _ = validate(game_spec(tmp_path / "task", EXACT_EVALUATE, EXACT_STRATEGY))
    assert info["evaluation_status"] == "ok"
    assert info["score"] == [{"Score": 1.0, "calls": 53}]


def test_the_delta_path_and_the_general_path_give_the_same_score(tmp_path):
    info, _ = validate(game_spec(tmp_path / "task", PATHS_EVALUATE, PATHS_STRATEGY))
    assert info["evaluation_status"] == "ok"
    [score] = info["score"]
    assert score["Score"] == score["general"] and 0 < score["Score"]


@pytest.mark.parametrize("mode", ["oversized", "broken_chunk", "unknown_tag", "short_int", "nested"])
def test_a_malformed_answer_from_a_hostile_agent_process_is_agent_error_not_a_hang(tmp_path, mode):
    info, seconds = validate(game_spec(tmp_path / "task", HOSTILE_EVALUATE, HOSTILE_STRATEGY.format(mode=mode)))
    assert info["evaluation_status"] == "agent_error", info
    assert info["score"] == []
    assert seconds < 30  # the agent's process sleeps for 60 s after its forged answer


def test_the_shared_memory_cannot_be_shrunk_under_the_evaluator(tmp_path):
    info, _ = validate(game_spec(tmp_path / "task", HOSTILE_EVALUATE, HOSTILE_STRATEGY.format(mode="shrink")))
    assert info["evaluation_status"] == "ok"
    assert info["score"] == [{"Score": 3.0}]  # the seal refused the shrink: the strategy played 0


def test_the_answer_codec_round_trips_and_refuses_what_is_not_a_value():
    import importlib.util

    from mlgym_registry.backends.local.evaluation import HARNESS_DIR

    spec = importlib.util.spec_from_file_location("harness_under_test", HARNESS_DIR / "harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    for value in (0, -1, 2**63 - 1, 2**64, True, False, None, [], [1, 2, -3], [1, 2**70], (1, [2, (3,)]), 1.5,
                  "text", {"a": (1, 2)}, {(1, 2): 3}, [[1, 2], [3]]):
        assert harness.unpack_answer(harness.pack_value(value)) == value
        assert type(harness.unpack_answer(harness.pack_value(value))) is type(value)
    for bad in (b"", b"I", b"I" + b"\0" * 9, b"L\0\0", b"Z", b"N\0", b"J{", b"J" + b"[" * 100000):
        with pytest.raises(harness.AgentCodeError):
            harness.unpack_answer(bad)
    with pytest.raises(harness.AgentCodeError, match="boom"):
        harness.unpack_answer(harness.pack_error("ValueError: boom"))
    assert json.loads(harness.pack_value({"k": [1.5]})[1:]) == {"k": [1.5]}
