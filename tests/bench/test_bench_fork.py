"""``bench/bench_fork.py --quick`` runs and prints each ratio with its target (no timing is asserted here)."""

from __future__ import annotations

import math
import re

import pytest
from conftest import load_bench_script


@pytest.mark.slow
def test_fork_bench_quick_prints_fork_against_reset_and_the_published_figures(capsys):
    ratios = load_bench_script("bench_fork.py").main(["--quick"])
    out = capsys.readouterr().out
    assert set(ratios) == {"fork_200mb_vs_empty", "fork_vs_reset", "fork_per_child_vs_reset", "chain_fork_vs_reset",
                           "first_fork_vs_reset"}
    assert all(math.isfinite(value) and value > 0 for value in ratios.values())
    assert re.search(r"ratio fork 20 MB / fork empty: [\d.]+ \(target <= 1\.2: (met|NOT met)\)", out)
    assert re.search(r"ratio fork\(1\) / reset: [\d.]+ \(target <= 1\.0: (met|NOT met)\)", out)
    for name in ("DeltaBox checkpoint", "DeltaBox rollback", "AgentENV", "smolvm fork"):
        assert f"published, for scale: {name}" in out
