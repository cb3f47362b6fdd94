"""The partner (column player) you are scored against. The evaluator reads this file; changing it is not allowed.

Every round the partner picks one of the behaviours below at random and plays what it says. Each behaviour gets the
same `history` as you, as `(your_move, partner_move)` tuples (0 = cooperate, 1 = defect).
"""

import random

RNG = random.Random()
"""The partner's own random source, kept apart from the one your strategy uses (the evaluator seeds it)."""


def noisy(history):
    """Opens with a defection; then cooperates (1/3), defects (1/6), repeats itself (0.4) or inverts your last move."""
    if not history:
        return 1
    draw = RNG.random()
    if draw < 0.3333:
        return 0
    if draw < 0.5:
        return 1
    if draw < 0.9:
        return history[-1][1]
    return 1 - history[-1][0]


def copycat(history):
    """Cooperates first, then repeats your last move."""
    return history[-1][0] if history else 0


def saint(history):
    """Always cooperates."""
    return 0


def villain(history):
    """Always defects."""
    return 1


def coin(history):
    """A fair coin every round."""
    return RNG.choice((0, 1))


def grudger(history):
    """Cooperates until you defect once, then defects for the rest of the game."""
    return 1 if any(mine == 1 for mine, _ in history) else 0


def win_stay(history):
    """Cooperates first; then cooperates when both moves of the last round matched, defects otherwise."""
    if not history:
        return 0
    return 0 if history[-1][0] == history[-1][1] else 1


def patient_copycat(history):
    """Defects only after you defected in both of the last two rounds."""
    if len(history) >= 2 and history[-1][0] == 1 and history[-2][0] == 1:
        return 1
    return 0


def wary_copycat(history):
    """Defects first, then repeats your last move."""
    return history[-1][0] if history else 1


def coin_too(history):
    """A second fair coin: random play makes up two of the eleven behaviours."""
    return 0 if RNG.random() < 0.5 else 1


def lenient_copycat(history):
    """Cooperates first; repeats your last move, except that it forgives two defections in a row."""
    if not history:
        return 0
    if len(history) >= 2 and history[-1][0] == 1 and history[-2][0] == 1:
        return 0
    return history[-1][0]


BEHAVIOURS = (
    noisy, copycat, saint, villain, coin, grudger, win_stay, patient_copycat, wary_copycat, coin_too, lenient_copycat,
)


def target_column_strategy(history):
    """The partner's move for the next round (0 or 1), from a behaviour drawn at random for this round."""
    return RNG.choice(BEHAVIOURS)(history)
