"""Your player for the iterated Prisoner's Dilemma. Edit `row_strategy`; keep its name and signature."""

import random


def row_strategy(history):
    """Choose your next move: 0 to cooperate, 1 to defect.

    `history` lists the rounds played so far in this game, oldest first, as `(your_move, partner_move)` tuples.
    It is empty on the first round.
    """
    if not history:
        return random.choice((0, 1))
    my_last, partner_last = history[-1]
    draw = random.random()
    if partner_last == 1:
        # the partner defected last round: mostly defect back
        if draw < 0.75:
            return 1
        return my_last if draw < 0.9 else 0
    # the partner cooperated last round: mostly cooperate
    if draw < 0.6:
        return 0
    return my_last if draw < 0.9 else 1
