"""Cold start of `mlgym-registry list` against a cold `gymnasium.pprint_registry()`, side by side in one run.

Prints the median wall time of each (fresh processes, interleaved) and their ratio. Target: ratio <= 1.0.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROUNDS = 15


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    script = Path(sys.executable).with_name("mlgym-registry")
    ours_cmd = [str(script), "list"] if script.exists() else [sys.executable, "-m", "mlgym_registry.cli", "list"]
    theirs_cmd = [sys.executable, "-c", "import gymnasium; gymnasium.pprint_registry()"]
    timed(ours_cmd), timed(theirs_cmd)  # warm the OS file cache for both, not the interpreters
    ours, theirs = [], []
    for _ in range(ROUNDS):
        ours.append(timed(ours_cmd))
        theirs.append(timed(theirs_cmd))
    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    print(f"mlgym-registry list         median {ours_median * 1000:7.1f} ms over {ROUNDS} cold starts")
    print(f"gymnasium.pprint_registry() median {theirs_median * 1000:7.1f} ms over {ROUNDS} cold starts")
    print(f"ratio (ours / gymnasium): {ours_median / theirs_median:.2f}  (target <= 1.0)")


if __name__ == "__main__":
    main()
