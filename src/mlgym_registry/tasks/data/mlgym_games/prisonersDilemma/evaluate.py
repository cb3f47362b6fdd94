"""Score `row_strategy` (strategy.py) against the partner in target.py at the iterated Prisoner's Dilemma, as MLGym's
evaluate.py does: 10,000 games of 10 rounds, the row player's mean payoff per round, printed as {"Score": x}.
Our own program (see lockstep_games.py): the games advance round by round together."""

import lockstep_games
from strategy import row_strategy
from target import target_column_strategy

# (row payoff, column payoff) by row move, then column move: 0 cooperates, 1 defects
PAYOFFS = (((3, 3), (0, 5)), ((5, 0), (1, 1)))

if __name__ == "__main__":
    lockstep_games.evaluate(row_strategy, target_column_strategy, lockstep_games.matrix_payoff(PAYOFFS))
