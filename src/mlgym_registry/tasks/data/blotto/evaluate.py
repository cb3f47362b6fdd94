"""Score `row_strategy` (strategy.py) against the opposing colonel in target.py at repeated Colonel Blotto.

Plays many 10-round games. A round is worth 1 to the colonel who wins more battlefields, -1 to the other and 0 to
both on a tie. Prints one JSON line, `{"Score": x}`: your mean payoff per round over all games.
MLGYM_REGISTRY_EVAL_SEED (an integer) seeds the evaluation for a reproducible score; without it every run draws fresh
randomness. The backend derives it from the run's seed with a key the agent never sees, and only this process gets it.
"""

import json
import numbers
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).absolute().parent

SOLDIERS = 120
BATTLEFIELDS = 6
ROUNDS = 10
GAMES = 10_000


def checked(allocation, who):
    """`allocation` as a new list of ints, or a ValueError naming the player when it breaks the rules."""
    try:
        counts = tuple(allocation)
    except TypeError:
        raise ValueError(f"{who} returned {allocation!r}; an allocation is a list of {BATTLEFIELDS} integers") from None
    if len(counts) != BATTLEFIELDS:
        raise ValueError(f"{who} returned {len(counts)} numbers; an allocation has one per battlefield, {BATTLEFIELDS}")
    if not all((type(c) is int or isinstance(c, numbers.Integral)) and c >= 0 for c in counts):
        raise ValueError(f"{who} returned {allocation!r}; soldier counts must be non-negative integers")
    if sum(counts) > SOLDIERS:
        raise ValueError(f"{who} sent {sum(counts)} soldiers; at most {SOLDIERS} are available")
    return [int(c) for c in counts]


def payoff(mine, theirs):
    """1 when `mine` wins more battlefields than `theirs`, -1 when it wins fewer, 0 on a tie."""
    margin = 0  # battlefields won minus battlefields lost
    for a, b in zip(mine, theirs, strict=True):
        if a > b:
            margin += 1
        elif a < b:
            margin -= 1
    return (margin > 0) - (margin < 0)


def moves_later(strategy, histories):
    """A function that returns `strategy(history)` for every history. When the evaluation runs sandboxed,
    `row_strategy` lives in another process and offers `map_later`: that process computes the moves while this one
    goes on, and the function collects them."""
    later = getattr(strategy, "map_later", None)
    if callable(later):
        return later([(history,) for history in histories])
    return lambda: [strategy(list(history)) for history in histories]


def play(row, column, games):
    """`games` games played side by side, round by round; returns the row player's mean payoff per round."""
    histories = [[] for _ in range(games)]
    total = 0
    for _ in range(ROUNDS):
        pending = moves_later(row, histories)
        column_moves = [checked(move, "target_column_strategy") for move in moves_later(column, histories)()]
        row_moves = [checked(move, "row_strategy") for move in pending()]
        for history, mine, theirs in zip(histories, row_moves, column_moves, strict=True):
            history.append((mine, theirs))
            total += payoff(mine, theirs)
    return total / (ROUNDS * games)


def read_seed():
    """The integer in MLGYM_REGISTRY_EVAL_SEED, or None when it is unset."""
    value = os.environ.get("MLGYM_REGISTRY_EVAL_SEED", "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"MLGYM_REGISTRY_EVAL_SEED must be an integer, got {value!r}") from None


def main():
    seed = read_seed()
    if seed is not None:
        random.seed(seed)  # before the imports, so that randomness at import time is reproducible too
    sys.path.insert(0, str(HERE))
    import target
    from strategy import row_strategy

    if seed is not None:
        if "numpy" in sys.modules:  # seeded only when a strategy imported it: importing it here would add ~0.1 s
            sys.modules["numpy"].random.seed(seed % 2**32)
        if isinstance(getattr(target, "RNG", None), random.Random):
            target.RNG.seed(f"opponent-{seed}")
    print(json.dumps({"Score": play(row_strategy, target.target_column_strategy, GAMES)}))


if __name__ == "__main__":
    main()
