"""MLGym's iterated games as our overlay gives them: our evaluation program instead of MLGym's evaluate.py, which
plays the games of an evaluation in lockstep (one crossing to the agent's process a round, not one a move) and scores
them as MLGym's does, with the same distribution of scores.

MLGym's own files are not ours to copy: the games here are played with our own tasks' partners and strategies
(``tasks/data/<game>``, same history format), against a reference written here that plays the games one after the
other in MLGym's order. With ``MLGYM_ROOT`` at a checkout, MLGym's own ``evaluate.py`` is the reference too.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fresh_registry, write

import mlgym_registry.tasks
from mlgym_registry.tasks.mlgym_overlay import GAME_FILES, GAME_TASKS, GAMES_DATA

OUR_DATA = Path(mlgym_registry.tasks.__file__).parent / "data"
"""Our own tasks' files: each game's target.py (the partner) and strategy.py (a stochastic example player)."""


def load(path: Path, name: str):
    """The module at ``path``, imported under ``name`` (our games' files share their names)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_game(game: str):
    """``(lockstep_games, row strategy, partner module, payoff)`` of ``game``: our task's strategy and partner, the
    overlay's scoring (its evaluate.py imports them by their names in the workspace)."""
    lockstep = load(GAMES_DATA / "lockstep_games.py", "lockstep_games")
    strategy = load(OUR_DATA / game / "strategy.py", f"our_{game}_strategy")
    partner = load(OUR_DATA / game / "target.py", f"our_{game}_target")
    names = {"lockstep_games": lockstep, "strategy": strategy, "target": partner}
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update(names)
    try:
        scoring = load(GAMES_DATA / game / "evaluate.py", f"overlay_{game}_evaluate")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    payoff = scoring.payoff if hasattr(scoring, "payoff") else lockstep.matrix_payoff(scoring.PAYOFFS)
    return lockstep, strategy.row_strategy, partner, payoff


def one_after_the_other(row, column, games: int, rounds: int = 10) -> list[list[tuple]]:
    """The histories of ``games`` games played as MLGym's evaluate.py plays them: each game whole before the next,
    the row player asked first each round, both on the history so far."""
    histories = []
    for _ in range(games):
        history: list[tuple] = []
        for _ in range(rounds):
            mine = row(history)
            theirs = column(history)
            history.append((mine, theirs))
        histories.append(history)
    return histories


def test_the_games_get_our_lockstep_evaluator_and_keep_their_partner_pristine(tmp_path, monkeypatch):
    checkout = tmp_path / "MLGym"
    for game in GAME_TASKS:
        write(checkout / f"configs/tasks/{game}.yaml",
              f"id: {game}\ntask_entrypoint: PythonSubmissionTasks\nstarter_code: [data/{game}/target.py, "
              f"data/{game}/evaluate.py, data/{game}/strategy.py]\nevaluation_paths: [evaluate.py]\n"
              "description: edit row_strategy in strategy.py\n")
    monkeypatch.setenv("MLGYM_ROOT", str(checkout))
    registry = fresh_registry()
    for game in GAME_TASKS:
        spec = registry.spec(f"mlgym/{game}")
        ours = [GAMES_DATA / game / "evaluate.py", *(GAMES_DATA / name for name in GAME_FILES)]
        assert all(path.is_file() for path in ours)
        assert spec.starter_code == [f"data/{game}/target.py", str(ours[0]), f"data/{game}/strategy.py",
                                     *map(str, ours[1:])]
        assert spec.protected_files == ["target.py", *GAME_FILES]
        assert spec.submission_files == ["strategy.py"]


class CountingStrategy:
    """A row player that offers ``map_later``, as the harness's proxy of the agent's function does: it counts the
    batches it is asked for and records each call's history length."""

    def __init__(self):
        self.batches = 0
        self.lengths: list[int] = []

    def map_later(self, calls):
        self.batches += 1
        calls = list(calls)
        self.lengths += [len(history) for (history,) in calls]
        return lambda: [len(history) % 2 for (history,) in calls]


def test_lockstep_asks_the_row_player_once_a_round_for_every_game():
    lockstep = load(GAMES_DATA / "lockstep_games.py", "lockstep_games")
    row = CountingStrategy()
    seen = []

    def column(history):
        seen.append(len(history))
        return 1

    histories = lockstep.play(row, column, games=50, rounds=10)

    assert row.batches == 10  # one crossing a round, not one a move (500)
    assert row.lengths == seen == [r for r in range(10) for _ in range(50)]
    assert all(h == [(r % 2, 1) for r in range(10)] for h in histories)


def test_a_plain_function_gets_each_games_own_history_as_mlgym_passes_it():
    lockstep = load(GAMES_DATA / "lockstep_games.py", "lockstep_games")
    received = []

    def row(history):
        received.append(history)
        return 0

    histories = lockstep.play(row, lambda history: 0, games=3, rounds=2)

    assert [id(h) for h in received] == [id(h) for h in histories] * 2


@pytest.mark.parametrize("game", GAME_TASKS)
def test_lockstep_scores_have_the_distribution_of_games_played_one_after_the_other(game):
    """Over many seeds, the mean and spread of the scores of games played in lockstep and one after the other agree
    (means within four standard errors of their difference, variances within a factor of three)."""
    lockstep, row, partner, payoff = load_game(game)
    seeds, games = 30, 400
    scores: dict[str, list[float]] = {"lockstep": [], "sequential": []}
    for seed in range(seeds):
        for how in scores:
            random.seed(f"{how}-{seed}")
            partner.RNG.seed(f"partner-{how}-{seed}")
            if how == "lockstep":
                histories = lockstep.play(row, partner.target_column_strategy, games)
            else:
                histories = one_after_the_other(row, partner.target_column_strategy, games)
            scores[how].append(lockstep.mean_score(histories, payoff))
    a, b = scores["lockstep"], scores["sequential"]
    error = (statistics.variance(a) / seeds + statistics.variance(b) / seeds) ** 0.5
    assert abs(statistics.mean(a) - statistics.mean(b)) <= 4 * error, (statistics.mean(a), statistics.mean(b), error)
    assert 1 / 3 <= statistics.variance(a) / statistics.variance(b) <= 3


def mlgym_mean_score(histories: list[list[tuple]], payoff) -> float:
    """MLGym's scoring, one ``np.mean`` a game: the reference ``lockstep_games.mean_score`` must equal bit for bit."""
    import numpy as np

    per_game = [np.mean(np.asarray([payoff(mine, theirs) for mine, theirs in history], dtype=np.float32))
                for history in histories]
    return float(np.mean(np.asarray(per_game, dtype=np.float32)))


@pytest.mark.parametrize("game", GAME_TASKS)
def test_scores_are_mlgyms_float32_numbers_exactly(game):
    """Every game's mean at once (rows of one array) gives the float32 numbers one ``np.mean`` a game gives: over
    seeds, numbers of games (odd ones included, which change how numpy pairs up its sums) and rounds, and for games
    of different lengths."""
    lockstep, row, partner, payoff = load_game(game)
    for seed, games, rounds in [(0, 10_000, 10), (1, 999, 10), (2, 1, 10), (3, 37, 1), (4, 129, 7), (5, 5, 33)]:
        random.seed(seed)
        partner.RNG.seed(seed)
        histories = lockstep.play(row, partner.target_column_strategy, games, rounds)
        assert lockstep.mean_score(histories, payoff) == mlgym_mean_score(histories, payoff), (seed, games, rounds)
    ragged = [history[:length] for history, length in zip(histories, [33, 1, 20, 33, 2], strict=True)]
    assert lockstep.mean_score(ragged, payoff) == mlgym_mean_score(ragged, payoff)


@pytest.mark.parametrize(("game", "bad", "error"), [
    ("prisonersDilemma", 2, ValueError), ("prisonersDilemma", 1.0, TypeError), ("battleOfSexes", 2, ValueError),
    ("blotto", [121, 0, 0, 0, 0, 0], ValueError), ("blotto", [60.0, 60, 0, 0, 0, 0], ValueError),
    ("blotto", [-1, 0, 0, 0, 0, 0], ValueError),
])
def test_a_move_mlgyms_scoring_refuses_fails_the_evaluation(game, bad, error):
    lockstep, _, partner, payoff = load_game(game)
    partner.RNG.seed(0)
    histories = lockstep.play(lambda history: bad, partner.target_column_strategy, games=5, rounds=3)
    with pytest.raises(error):
        lockstep.mean_score(histories, payoff)


def test_blotto_takes_what_mlgym_takes():
    """MLGym checks only that an allocation's counts are non-negative ints summing to at most 120; battlefields pair
    up as zip pairs them, so a shorter allocation leaves the rest to the opponent."""
    *_, payoff = load_game("blotto")
    assert payoff([120], [0, 0, 0, 0, 0, 120]) == 1  # one battlefield won, none lost
    assert payoff((True, 0, 0, 0, 0, 0), [0] * 6) == 1
    assert payoff([20] * 6, [20] * 6) == 0
    assert payoff([0, 0, 0, 40, 40, 40], [21, 21, 21, 19, 19, 19]) == 0


MLGYM_ROOT = os.environ.get("MLGYM_ROOT", "")


def mlgym_game_folder(game: str, into: Path) -> Path:
    """MLGym's files of ``game`` (its own evaluate.py as ``mlgym_evaluate.py``) beside ours, in a plain folder."""
    folder = into / game
    folder.mkdir()
    source = Path(MLGYM_ROOT) / "data" / game
    for name in ("strategy.py", "target.py"):
        shutil.copy(source / name, folder / name)
    shutil.copy(source / "evaluate.py", folder / "mlgym_evaluate.py")
    shutil.copy(GAMES_DATA / game / "evaluate.py", folder / "evaluate.py")
    for name in GAME_FILES:
        shutil.copy(GAMES_DATA / name, folder / name)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(not (Path(MLGYM_ROOT) / "data" / "blotto" / "evaluate.py").is_file(),
                    reason="needs MLGYM_ROOT at a checkout of facebookresearch/MLGym (its games' evaluate.py)")
@pytest.mark.parametrize("game", GAME_TASKS)
def test_our_evaluate_scores_mlgyms_example_strategy_as_mlgyms_own_evaluate_does(game, tmp_path):
    """MLGym's evaluate.py and ours, each run 8 times in a plain process on MLGym's files (example strategy and
    partner, unseeded as MLGym runs them): the means of their scores within four standard errors."""
    folder = mlgym_game_folder(game, tmp_path)
    scores: dict[str, list[float]] = {"mlgym_evaluate.py": [], "evaluate.py": []}
    for _ in range(8):
        for script, found in scores.items():
            done = subprocess.run([sys.executable, script], cwd=folder, capture_output=True, text=True, check=True,
                                  timeout=300)
            found.append(float(done.stdout.strip().split('"Score": ')[1].rstrip("}")))
    a, b = scores.values()
    error = (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
    assert abs(statistics.mean(a) - statistics.mean(b)) <= 4 * error, scores


def our_game_as_mlgyms(tmp_path: Path, monkeypatch, game: str, strategy: str | None = None):
    """``mlgym/<game>`` of an MLGym-shaped checkout that holds our own task's partner and strategy (``strategy``:
    another strategy.py) and an evaluate.py the overlay replaces."""
    checkout = tmp_path / "MLGym"
    write(checkout / f"configs/tasks/{game}.yaml",
          f"id: {game}\ntask_entrypoint: PythonSubmissionTasks\nstarter_code: [data/{game}/target.py, "
          f"data/{game}/evaluate.py, data/{game}/strategy.py]\nevaluation_paths: [evaluate.py]\n"
          "description: edit row_strategy in strategy.py\n")
    write(checkout / f"data/{game}/evaluate.py", "raise SystemExit('the overlay runs its own evaluate.py')\n")
    write(checkout / f"data/{game}/target.py", (OUR_DATA / game / "target.py").read_text())
    write(checkout / f"data/{game}/strategy.py", strategy or (OUR_DATA / game / "strategy.py").read_text())
    monkeypatch.setenv("MLGYM_ROOT", str(checkout))
    return fresh_registry().spec(f"mlgym/{game}")


def validate_scores(spec, seeds: range) -> list[float]:
    """The score of one validate through the local backend (sandboxed) per evaluation seed."""
    from mlgym_registry.backends.local import LocalBackend

    scores = []
    with LocalBackend(spec.replace(max_steps=10**6), seed=0) as backend:
        for seed in seeds:
            backend.reset(options={"evaluation_seed": seed})
            backend.install_tools()
            _, _, _, info = backend.step("validate")
            assert info["evaluation_status"] == "ok", info
            scores.append(info["score"][-1]["Score"])
    return scores


ONE_AFTER_THE_OTHER_FAILS = """\
LONGEST = [0]


def row_strategy(history):
    # a game's history grows by one a round: it gets shorter only when a new game starts after a whole one was played
    if len(history) < LONGEST[0]:
        raise RuntimeError("the games were played one after the other")
    LONGEST[0] = len(history)
    return 0
"""


def test_the_sandboxed_evaluation_asks_the_agents_process_round_by_round(tmp_path, monkeypatch):
    spec = our_game_as_mlgyms(tmp_path, monkeypatch, "prisonersDilemma", ONE_AFTER_THE_OTHER_FAILS)
    assert validate_scores(spec, range(1))[0] < 3  # cooperating always: paid 3 or 0 a round


@pytest.mark.slow
def test_sandboxed_scores_have_the_distribution_of_games_played_one_after_the_other(tmp_path, monkeypatch):
    """Validates through the sandbox (the agent's strategy in its own process, asked once a round for every game)
    against our strategy and partner playing 10,000 games one after the other in this process, as MLGym's evaluate.py
    plays them: means within four standard errors."""
    game = "prisonersDilemma"
    spec = our_game_as_mlgyms(tmp_path, monkeypatch, game)
    ours = validate_scores(spec, range(6))
    lockstep, row, partner, payoff = load_game(game)
    reference = []
    for seed in range(6):
        random.seed(seed)
        partner.RNG.seed(f"partner-{seed}")
        reference.append(lockstep.mean_score(one_after_the_other(row, partner.target_column_strategy, 10_000), payoff))
    error = (statistics.variance(ours) / len(ours) + statistics.variance(reference) / len(reference)) ** 0.5
    assert abs(statistics.mean(ours) - statistics.mean(reference)) <= 4 * error, (ours, reference)
