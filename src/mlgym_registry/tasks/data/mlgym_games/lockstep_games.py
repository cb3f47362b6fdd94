"""Plays MLGym's iterated two-player games as MLGym's evaluate.py scores them, with every game of the evaluation
advancing in lockstep (our evaluation program of MLGym's prisonersDilemma, battleOfSexes and blotto).

MLGym's evaluate.py plays its games one after the other and calls the row player's ``row_strategy(history)`` once
per move: 100,000 calls. Here every game plays its first round, then every game its second, and so on: the row
player's moves of one round are asked for all games at once (``map_later``, which the local backend's harness gives
the agent's functions: one crossing to the agent's process a round), while the column player (the task's
``target.py``, pristine, in this process) moves in the same games. A strategy is a function of its game's history,
so each game sees what it would in MLGym's order, and the score has the same distribution; only the order in which
a strategy's calls come (game by game there, round by round here) differs.

The score is computed as MLGym's: each game's mean payoff per round in float32, then the float32 mean over games;
a move MLGym's scoring refuses fails the evaluation as it does there (``ValueError`` or ``TypeError``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

ROUNDS = 10
"""Rounds a game (MLGym's ``num_rounds``)."""
GAMES = 10_000
"""Games an evaluation (MLGym's ``num_simulations``)."""

Payoff = Callable[[object, object], float]
"""The row player's payoff of one round from the two moves; raises for a move the game refuses."""


def moves_later(strategy, histories: list[list]) -> Callable[[], list]:
    """A function that returns ``strategy(history)`` for every history, in order. A function of the agent's process
    (``map_later``) starts computing them there at once; a plain function is called when they are collected, with
    each game's history list itself, as MLGym calls it."""
    later = getattr(strategy, "map_later", None)
    if callable(later):
        return later([(history,) for history in histories])
    return lambda: [strategy(history) for history in histories]


def play(row, column, games: int = GAMES, rounds: int = ROUNDS) -> list[list[tuple]]:
    """The histories of ``games`` games of ``rounds`` rounds, each a list of ``(row move, column move)``, played in
    lockstep: each round, the row player's moves of every game are asked for first, the column player moves in
    every game meanwhile (on the history before this round, as in MLGym), then each game takes its round."""
    histories: list[list[tuple]] = [[] for _ in range(games)]
    for _ in range(rounds):
        pending = moves_later(row, histories)
        column_moves = [column(history) for history in histories]
        row_moves = pending()
        for history, mine, theirs in zip(histories, row_moves, column_moves, strict=True):
            history.append((mine, theirs))
    return histories


def mean_score(histories: list[list[tuple]], payoff: Payoff) -> float:
    """The row player's score as MLGym computes it: each game's mean payoff in float32, then their float32 mean.

    Games of one length are averaged as the rows of one array: a game's payoffs are small integers, whose float32
    sum is exact in any order, so each row's mean is the float32 number MLGym's ``np.mean`` of that game gives,
    without 10,000 calls of it."""
    payoffs = [[payoff(mine, theirs) for mine, theirs in history] for history in histories]
    if payoffs and payoffs[0] and all(len(game) == len(payoffs[0]) for game in payoffs):
        per_game = np.asarray(payoffs, dtype=np.float32).mean(axis=1)
    else:  # games of different lengths, or none: one game at a time, as MLGym
        per_game = np.asarray([np.mean(np.asarray(game, dtype=np.float32)) for game in payoffs], dtype=np.float32)
    return float(np.mean(per_game))


def matrix_payoff(matrix: tuple[tuple[tuple[int, int], ...], ...]) -> Payoff:
    """The row player's payoff in a 2x2 game whose ``matrix[row][column]`` is ``(row payoff, column payoff)``.
    A move that is not equal to 0 or 1 is a ``ValueError``; one that is but cannot index (1.0) a ``TypeError``."""

    def payoff(mine, theirs) -> float:
        if mine not in (0, 1) or theirs not in (0, 1):
            raise ValueError(f"Strategies must be either 0 or 1, got {mine!r} and {theirs!r}")
        return matrix[mine][theirs][0]

    return payoff


def evaluate(row, column, payoff: Payoff, games: int = GAMES, rounds: int = ROUNDS) -> None:
    """Play, score and print MLGym's metrics line, ``{"Score": ...}``."""
    print(json.dumps({"Score": mean_score(play(row, column, games, rounds), payoff)}))
