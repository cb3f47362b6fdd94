"""The opposing colonel (column player) you are scored against. The evaluator reads this file; changing it is not
allowed.

Every round it ignores the history, draws a random weight from 0 to 120 for each of the 6 battlefields, shares its
120 soldiers in proportion to those weights (rounding down) and sends the soldiers left over by the rounding to one
battlefield picked at random.
"""

import random

SOLDIERS = 120
BATTLEFIELDS = 6

RNG = random.Random()
"""The opponent's own random source, kept apart from the one your strategy uses (the evaluator seeds it)."""


def target_column_strategy(history):
    """The opponent's allocation for the next round: a list of 6 non-negative integers adding up to 120."""
    draw = RNG.random  # uniform integers via random() * n: the same odds as randint, several times faster
    total = 0
    while total == 0:
        weights = [int(draw() * (SOLDIERS + 1)) for _ in range(BATTLEFIELDS)]
        total = sum(weights)
    allocation = [weight * SOLDIERS // total for weight in weights]
    allocation[int(draw() * BATTLEFIELDS)] += SOLDIERS - sum(allocation)
    return allocation
