"""Your colonel for repeated Colonel Blotto. Edit `row_strategy`; keep its name and signature."""

import random

SOLDIERS = 120
BATTLEFIELDS = 6


def row_strategy(history):
    """Return how many soldiers to send to each battlefield: 6 non-negative integers adding up to at most 120.

    `history` lists the rounds played so far in this game, oldest first, as `(your_allocation, partner_allocation)`
    tuples. It is empty on the first round.
    """
    allocation = [0] * BATTLEFIELDS
    # reinforce a few battlefields at random ...
    for _ in range(random.randint(1, BATTLEFIELDS)):
        allocation[random.randrange(BATTLEFIELDS)] += random.randint(10, 30)
    # ... spread what is left over the untouched ones ...
    left = SOLDIERS - sum(allocation)
    if left > 0:
        for field in range(BATTLEFIELDS):
            if allocation[field] == 0:
                allocation[field] = random.randint(0, left)
                left -= allocation[field]
    # ... and rescale so that exactly SOLDIERS are used
    total = sum(allocation)
    scaled = [count * SOLDIERS // total for count in allocation]
    scaled[random.randrange(BATTLEFIELDS)] += SOLDIERS - sum(scaled)
    return scaled
