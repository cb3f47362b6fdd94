"""The evaluator's channel to the agent's process (``harness.py``), through the public path: ``validate``.

A function called on a growing list (a game's history, called once per move as MLGym's evaluators do) crosses as what
changed since its previous call; the agent's function must still see exactly the evaluator's list every call, and a
hostile agent's process that writes garbage into the shared memory gets ``agent_error``, never a hang nor a score.
An iterator the evaluator passes crosses as an iterator the agent's code consumes lazily from the evaluator's own, the
agent's own functions cross as themselves, and what cannot cross is refused in the evaluator, naming the call.
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
        time.sleep(600)


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
        elif MODE == "short_next":
            answer(b"n\\x01")  # a request for an item of the evaluator's iterators, cut short
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


@pytest.mark.parametrize("mode", ["oversized", "broken_chunk", "unknown_tag", "short_int", "nested", "short_next"])
def test_a_malformed_answer_from_a_hostile_agent_process_is_agent_error_not_a_hang(tmp_path, mode):
    info, seconds = validate(game_spec(tmp_path / "task", HOSTILE_EVALUATE, HOSTILE_STRATEGY.format(mode=mode)))
    assert info["evaluation_status"] == "agent_error", info
    assert info["score"] == []
    # a ceiling for a loaded machine, not a timing: the agent's process sleeps for 600 s after its forged answer, and
    # the evaluation's timeout (120 s) would end a hang as agent_error too
    assert seconds < 100


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


ITERATOR_EVALUATE = textwrap.dedent(
    """\
    import itertools
    import json

    from strategy import kinds, take, total

    out = {"sum": total(x * x for x in range(5)), "kinds": kinds(x for x in range(2))}
    it = iter(range(10))
    out["took"] = take(it, 3)
    out["rest"] = list(it)  # the evaluator's own iterator is where the agent's code left it
    log = []


    def logged():
        for i in range(100):
            log.append(i)
            yield i


    out["lazy"] = take(logged(), 2)
    out["produced"] = len(log)  # items are made as the agent's code asks for them, not before the call
    out["endless"] = take(itertools.count(), 4)
    out["mapped"] = total.map([(iter([1, 2]),), ((x for x in range(3)),)])
    print(json.dumps({"Score": 1.0, **out}))
    """
)
ITERATOR_STRATEGY = textwrap.dedent(
    """\
    def total(items):
        return sum(items)


    def take(items, count):
        return [next(items) for _ in range(count)]


    def kinds(items):
        return [type(items).__name__, iter(items) is items, isinstance(items, (list, tuple))]
    """
)


def test_an_iterator_crosses_as_an_iterator_the_agents_code_consumes_lazily_from_the_evaluators(tmp_path):
    info, _ = validate(game_spec(tmp_path / "task", ITERATOR_EVALUATE, ITERATOR_STRATEGY))
    assert info["evaluation_status"] == "ok", info
    [score] = info["score"]
    assert score["sum"] == 30 and score["kinds"] == ["EvaluatorIterator", True, False]
    assert score["took"] == [0, 1, 2] and score["rest"] == [3, 4, 5, 6, 7, 8, 9]
    assert score["lazy"] == [0, 1] and score["produced"] == 2
    assert score["endless"] == [0, 1, 2, 3]
    assert score["mapped"] == [3, 3]


RAISING_EVALUATE = textwrap.dedent(
    """\
    import json

    from strategy import apply, count_until_error, square, stash, total, use_stash


    def failing():
        yield 1
        yield 2
        raise ValueError("boom")


    out = {"handled": count_until_error(failing())}  # the agent's code catches the evaluator's ValueError
    try:
        total(failing())
        out["passed_through"] = "nothing raised"
    except ValueError as exc:  # not caught there: it reaches the evaluator as its own exception
        out["passed_through"] = f"ValueError: {exc}"
    out["nested"] = total(square(x) for x in range(4))  # the evaluator's iterator calls the agent's code
    out["agent_function"] = apply(square, 7)  # the agent's own function, given back to it
    stash(iter([1, 2]))
    out["stale"] = use_stash()
    print(json.dumps({"Score": 1.0, **out}))
    """
)
RAISING_STRATEGY = textwrap.dedent(
    """\
    def total(items):
        return sum(items)


    def count_until_error(items):
        seen = 0
        try:
            for _ in items:
                seen += 1
        except ValueError as exc:
            return [seen, str(exc)]
        return [seen, None]


    def square(x):
        return x * x


    def apply(function, value):
        return [function(value), function.__module__]


    KEPT = []


    def stash(items):
        KEPT.append(items)


    def use_stash():
        try:
            next(KEPT[0])
        except RuntimeError as exc:
            return str(exc)
        return "no error"
    """
)


def test_the_evaluators_iterator_raises_through_the_agents_code_and_may_call_it(tmp_path):
    info, _ = validate(game_spec(tmp_path / "task", RAISING_EVALUATE, RAISING_STRATEGY))
    assert info["evaluation_status"] == "ok", info
    [score] = info["score"]
    assert score["handled"] == [2, "boom"]
    assert score["passed_through"] == "ValueError: boom"
    assert score["nested"] == 14
    assert score["agent_function"] == [49, "strategy"]
    assert score["stale"].startswith("this iterator of the evaluator's was passed to a call that has ended")


REFUSED_EVALUATE = textwrap.dedent(
    """\
    import json
    import threading

    from strategy import apply, total


    class Local:
        pass


    messages = {}
    for label, call in [
        ("lambda", lambda: apply(lambda x: x, 1)),
        ("lock", lambda: apply(len, key=threading.Lock())),
        ("script_class", lambda: apply(Local(), 2)),
        ("item", lambda: total((lambda: 1) for _ in range(2))),
    ]:
        try:
            call()
            messages[label] = "nothing raised"
        except TypeError as exc:
            messages[label] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"Score": float(total([1, 2])), **messages}))  # the channel still works
    """
)
REFUSED_STRATEGY = textwrap.dedent(
    """\
    def apply(function, value=None, key=None):
        return 0


    def total(items):
        return sum(1 for _ in items)
    """
)


def test_what_cannot_cross_is_refused_in_the_evaluator_naming_the_call_and_the_argument(tmp_path):
    info, _ = validate(game_spec(tmp_path / "task", REFUSED_EVALUATE, REFUSED_STRATEGY))
    assert info["evaluation_status"] == "ok", info
    [score] = info["score"]
    assert score["Score"] == 2.0
    assert score["lambda"].startswith("UncarriableValue: strategy.apply: positional argument 1 (a function) cannot "
                                      "be sent to the agent's process")
    assert "evaluation script's own function '<lambda>.<locals>.<lambda>'" in score["lambda"]
    assert "Pass plain data" in score["lambda"]
    assert score["lock"].startswith("UncarriableValue: strategy.apply: keyword argument 'key' (a lock) cannot be sent")
    assert "cannot pickle '_thread.lock' object" in score["lock"]
    assert score["script_class"].startswith("UncarriableValue: strategy.apply: positional argument 1 (a Local)")
    assert "evaluation script's own class 'Local'" in score["script_class"]
    assert score["item"].startswith("UncarriableValue: item 1 of the generator passed to strategy.total: the item "
                                    "(a function) cannot be sent")
