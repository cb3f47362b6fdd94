"""Learning happens: examples/grpo.py trains the tiny random model on the capitals task, and its mean return rises
well beyond what the same run with lr=0 (the control, same seed, same episodes up to the first update) shows.

The trained run is 20 GRPO updates of 4 one-turn episodes (about 50 s on 2 CPU cores). With lr=1e-2 the return climbs
from about 0.05 to about 0.3 by the last updates (docs/training.md has the longer curve); the control, two windows of
updates long (a model that does not change needs no more to show its spread), stays near 0.05.
"""

from __future__ import annotations

import statistics

import pytest
from test_grpo import load_example

pytestmark = pytest.mark.filterwarnings("ignore:The env passed to LLMCollector is missing:FutureWarning")

UPDATES = 20
WINDOW = 5
CONTROL_UPDATES = 2 * WINDOW
MARGIN = 0.1  # the control's window means spread by about 0.03; a learning run clears it by 0.2 or more


def returns(lr: float, updates: int = UPDATES) -> list[float]:
    """The mean return of every update of one run on capitals."""
    argv = ["--task", "capitals", "--lr", str(lr), "--updates", str(updates), "--max-new-tokens", "16",
            "--grpo-size", "4", "--seed", "0", "--device", "cpu"]
    history = load_example().main(argv)
    assert [stats["task"] for stats in history] == ["capitals"] * updates
    assert all(stats["episodes"] == 4 and stats["turns"] == 4 for stats in history)  # one reply, one score
    return [stats["mean_return"] for stats in history]


@pytest.mark.slow
def test_grpo_learns_capitals_against_an_lr_zero_control():
    trained, control = returns(1e-2), returns(0.0, CONTROL_UPDATES)
    first, last = statistics.mean(trained[:WINDOW]), statistics.mean(trained[-WINDOW:])
    control_last = statistics.mean(control[-WINDOW:])

    assert 0.0 <= min(trained + control) and max(trained + control) <= 1.0  # the task's scores are shares
    assert abs(control_last - statistics.mean(control[:WINDOW])) < MARGIN, control  # lr=0 does not move
    assert last > first + MARGIN, trained
    assert last > control_last + MARGIN, (trained, control)
