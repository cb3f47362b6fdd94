"""The metric MLGym ranks each of its own tasks by, and whether higher or lower is better.

These are facts from MLGym's published analysis (its per-task ``priority_metric`` and ``metric_direction``); MLGym's
task files do not carry them. A task whose metric dicts hold several keys (3-SAT's ``Time``/``Correct``/
``Incorrect``, the regressions' ``rmse``/``r2``, the RL tasks' ``Reward Mean``/``Reward Std``) or whose metric is a
loss needs them for a reward to point the right way. Variants of a task (``...L1``, ``...Reinforce``) report the
same metrics as the task they vary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankingMetric:
    """The metric to reward and its direction: ``"max"`` (higher is better) or ``"min"``."""

    name: str
    direction: str = "max"


_BY_TASK: dict[str, RankingMetric] = {
    "3SATTime": RankingMetric("Time", "min"),
    "battleOfSexes": RankingMetric("Score"),
    "blotto": RankingMetric("Score"),
    "prisonersDilemma": RankingMetric("Score"),
    "imageCaptioningCOCO": RankingMetric("BLEU Score"),
    "imageClassificationCifar10": RankingMetric("accuracy"),
    "imageClassificationCifar10L1": RankingMetric("accuracy"),
    "imageClassificationFMnist": RankingMetric("accuracy"),
    "languageModelingFineWeb": RankingMetric("val_loss", "min"),
    "naturalLanguageInferenceMNLI": RankingMetric("validation_accuracy"),
    "regressionHousePrice": RankingMetric("r2"),
    "regressionHousingPrice": RankingMetric("r2"),
    "regressionKaggleHousePrice": RankingMetric("r2"),
    "regressionKaggleHousePriceL1": RankingMetric("r2"),
    "rlBreakoutMinAtar": RankingMetric("Reward Mean"),
    "rlMetaMazeMisc": RankingMetric("Reward Mean"),
    "rlMountainCarContinuous": RankingMetric("Reward Mean"),
    "rlMountainCarContinuousReinforce": RankingMetric("Reward Mean"),
    "titanicSurvival": RankingMetric("accuracy"),  # what its evaluate.py prints (its baseline says "Accuracy")
}


def mlgym_ranking_metric(task_id: str) -> RankingMetric | None:
    """MLGym's ranking metric for one of its tasks, by MLGym's id (``mlgym/`` prefix allowed), else None."""
    return _BY_TASK.get(task_id.removeprefix("mlgym/"))
