"""Score `row_strategy` (strategy.py) against the partner in target.py at the iterated Prisoner's Dilemma.

Plays many 10-round games and prints one JSON line, `{"Score": x}`: your mean payoff per round over all games.
MLGYM_REGISTRY_EVAL_SEED (an integer) seeds the evaluation for a reproducible score; without it every run draws fresh
randomness. The backend derives it from the run's seed with a key the agent never sees, and only this process gets it.
"""

import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).absolute().parent

# PAYOFF[your_move][partner_move] is your payoff; 0 = cooperate, 1 = defect
PAYOFF = ((3, 0), (5, 1))
MOVES = (0, 1)
ROUND = tuple(tuple((mine, theirs) for theirs in MOVES) for mine in MOVES)
"""ROUND[mine][theirs] is the history entry of a round: one shared tuple per outcome, cheap to send"""
ROUNDS = 10
GAMES = 10_000


def checked(move, who):
    """`move` as an int, or a ValueError naming the player when it is not 0 or 1."""
    if isinstance(move, (str, bytes)) or move not in MOVES:
        raise ValueError(f"{who} returned {move!r}; a move must be 0 (cooperate) or 1 (defect)")
    return int(move)


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
            history.append(ROUND[mine][theirs])
            total += PAYOFF[mine][theirs]
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
            target.RNG.seed(f"partner-{seed}")
    print(json.dumps({"Score": play(row_strategy, target.target_column_strategy, GAMES)}))


if __name__ == "__main__":
    main()
