"""The partner (column player) you are scored against. The evaluator reads this file; changing it is not allowed.

The partner opens with 1, its favourite. After that it anchors on the move you opened the game with: it plays that
move with probability 0.8 and the other one with probability 0.2, every round.
"""

import random

RNG = random.Random()
"""The partner's own random source, kept apart from the one your strategy uses (the evaluator seeds it)."""


def target_column_strategy(history):
    """The partner's move for the next round (0 or 1); `history` holds `(your_move, partner_move)` tuples."""
    if not history:
        return 1
    your_opening = history[0][0]
    return your_opening if RNG.random() < 0.8 else 1 - your_opening
