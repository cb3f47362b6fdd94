"""Score `row_strategy` (strategy.py) against the column player in target.py at the iterated Battle of the Sexes, as
MLGym's evaluate.py does: 10,000 games of 10 rounds, the row player's mean payoff per round, printed as
{"Score": x}. Our own program (see lockstep_games.py): the games advance round by round together."""

import lockstep_games
from strategy import row_strategy
from target import target_column_strategy

# (row payoff, column payoff) by row move, then column move: the row player prefers both on 0, the column both on 1
PAYOFFS = (((2, 1), (0, 0)), ((0, 0), (1, 2)))

if __name__ == "__main__":
    lockstep_games.evaluate(row_strategy, target_column_strategy, lockstep_games.matrix_payoff(PAYOFFS))
