"""Output normalisation: MLGym's tqdm filter, decided in linear time (issue 8: a 100 KB line took 42 s)."""

from __future__ import annotations

import random
import time

import pytest

from mlgym_registry.backends.local.output import TQDM_LINE, is_tqdm_line, normalise

FIVE_MB = 5 * 1024 * 1024

# Lines printed by tqdm 4.70 (``tqdm.format_meter``) and by ``tqdm`` wrapped loops in training scripts.
TQDM_BARS = [
    " 45%|████▌     | 45/100 [00:01<00:01, 30.00it/s]",
    "Epoch 1:  45%|████▌     | 45/100 [00:01<00:01, 30.00it/s]",
    "Training:  45%|██████████████████                      | 45/100 [00:01<00:01, 30.00it/s, loss=0.123]",
    "Downloading:  30%|███       | 3.00/10.0 [00:12<00:28, 4.10s/B]",
    "eval: 100%|###################################| 100/100 [01:01<00:00,  1.64it/s]",
    "  0%|          | 0/50 [00:00<?, ?it/s]",
    "100%|██████████| 9.91M/9.91M [00:00<00:00, 43.2MB/s]",
    "Map (num_proc=4):  62%|██████▏   | 31000/50000 [00:03<00:01, 9876.54 examples/s]",
]

# Ordinary output with "%" or "|" that MLGym keeps, and a tqdm line without a total, which its pattern misses too.
KEPT = [
    "7it [00:02,  3.50it/s]",
    "accuracy: 45% | loss: 0.3 [epoch 2]",
    "| col1 | col2 |",
    "printf '%s|%s\\n' a b",
    "50%|half done",
    "x%|y|z[w]",
    "Score: 100%",
    "a | b [c]",
    "45%|bar| no brackets",
    "45%|bar| [unclosed",
    "45%|bar [00:01]",
]


def test_tqdm_bars_are_dropped():
    for line in TQDM_BARS:
        assert TQDM_LINE.search(line), line  # MLGym's own pattern drops them
        assert is_tqdm_line(line), line
    raw = "\n".join(["start", *TQDM_BARS, "end"]).encode()
    assert normalise(raw) == "start\nend"


def test_ordinary_lines_with_percent_or_bar_are_kept():
    for line in KEPT:
        assert not TQDM_LINE.search(line), line
        assert not is_tqdm_line(line), line
    assert normalise("\n".join(KEPT).encode()) == "\n".join(KEPT)


def test_tqdm_with_carriage_returns_in_one_line():
    # tqdm redraws with "\r": every segment is its own line, and all of them are bars
    raw = ("\r".join(TQDM_BARS[:3]) + "\r\ndone\r\n").encode()
    assert normalise(raw) == "done"


def test_same_decision_as_mlgym_pattern_on_random_lines():
    """``is_tqdm_line`` is exactly ``TQDM_LINE.search`` (checked on short lines, where the pattern is fast)."""
    rng = random.Random(8)
    # \u0663 is an Arabic-Indic digit (\d matches it), \u00b2 a superscript two (it does not)
    alphabet = "0%|[]: a9\u0663\u00b2"
    for _ in range(50_000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert is_tqdm_line(line) == bool(TQDM_LINE.search(line)), repr(line)
    for line in TQDM_BARS + KEPT:
        for cut in range(len(line) + 1):
            part = line[:cut]
            assert is_tqdm_line(part) == bool(TQDM_LINE.search(part)), repr(part)


def _timed(raw: bytes) -> tuple[str, float]:
    """``normalise(raw)`` and the CPU seconds it took (this thread's: a busy machine does not inflate them)."""
    started = time.thread_time()
    text = normalise(raw)
    return text, time.thread_time() - started


@pytest.mark.parametrize(
    "line",
    [
        "x" * FIVE_MB,
        "1%|[" * (FIVE_MB // 4),  # many bar starts, no "]" after any "["
        "1%|]" * (FIVE_MB // 4),
        ("desc: 9%|" + "|" * 3 + "[" * 3) * (FIVE_MB // 15),
        ": " * (FIVE_MB // 2),  # the optional "desc:" prefix of the pattern
    ],
    ids=["plain", "bars-and-brackets", "bars-and-closers", "prefix-bars-brackets", "colons"],
)
def test_five_megabyte_line_is_fast(line):
    text, seconds = _timed(line.encode())
    assert seconds < 2.0, f"normalising a {len(line)} character line took {seconds:.2f} s"
    assert text == line  # none of these is a complete bar


def test_five_megabyte_bar_line_is_dropped_fast():
    line = "Epoch 1: 45%|" + "█" * (FIVE_MB // 3) + "| 45/100 [00:01<00:01, 30.00it/s]"
    text, seconds = _timed(f"before\n{line}\nafter".encode())
    assert seconds < 2.0
    assert text == "before\nafter"


def test_normalise_keeps_its_other_rules():
    assert normalise(b"a\r\n\r\nb\n\nc\n") == "a\nb\nc"
    assert normalise(b"bad \xff byte") == "bad \\xff byte"
    assert normalise(b"") == ""
