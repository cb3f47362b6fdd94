"""Score `row_strategy` (strategy.py) against the opposing colonel in target.py at repeated Colonel Blotto, as MLGym's
evaluate.py does: 10,000 games of 10 rounds, a round worth 1 to the colonel who wins more battlefields, -1 to the
other, 0 on a tie; the row player's mean payoff per round, printed as {"Score": x}. Our own program (see
lockstep_games.py): the games advance round by round together."""

import lockstep_games
from strategy import row_strategy
from target import target_column_strategy

SOLDIERS = 120


def checked(allocation) -> None:
    """MLGym's rule for an allocation: non-negative ints (bool included) summing to at most SOLDIERS; its length is
    not checked (battlefields pair up as zip pairs them)."""
    if not all(isinstance(count, int) and count >= 0 for count in allocation):
        raise ValueError(f"All allocations must be non-negative integers, got {allocation!r}")
    if sum(allocation) > SOLDIERS:
        raise ValueError(f"Total number of soldiers must not exceed {SOLDIERS}, got {allocation!r}")


def payoff(mine, theirs) -> int:
    """1 when `mine` wins more battlefields than `theirs`, -1 when fewer, 0 on a tie."""
    checked(mine)
    checked(theirs)
    margin = sum((a > b) - (a < b) for a, b in zip(mine, theirs, strict=False))
    return (margin > 0) - (margin < 0)


if __name__ == "__main__":
    lockstep_games.evaluate(row_strategy, target_column_strategy, payoff)
