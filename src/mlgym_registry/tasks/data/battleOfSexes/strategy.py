"""Your player for the repeated Battle of the Sexes. Edit `row_strategy`; keep its name and signature."""

import random


def row_strategy(history):
    """Choose your next move, 0 or 1 (you prefer 0, your partner prefers 1; you only score when you match).

    `history` lists the rounds played so far in this game, oldest first, as `(your_move, partner_move)` tuples.
    It is empty on the first round.
    """
    if not history:
        return 0
    my_last, partner_last = history[-1]
    draw = random.random()
    if draw < 0.1:
        return 0
    if draw < 0.2:
        return 1
    # mostly follow whatever the partner did last round
    return partner_last if draw < 0.9 else my_last
