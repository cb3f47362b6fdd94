"""Our own additions to the task files of an MLGym checkout, per MLGym task id, applied when ``mlgym_source`` loads one.

MLGym's task files declare no evaluator-only files: its container copies each local dataset folder whole into the
agent's workspace, answers included. The facts below come from reading each task's dataset config (where its data
folder lands: ``data/`` of the workspace) and its ``evaluate.py`` (which file of that folder it reads the answers
from). The local backend takes these files out of the agent's view and shows them to the evaluator only.

Tasks whose answers live outside the workspace (the Hugging Face datasets of the image and language tasks, whose
test labels the evaluator loads by name) or whose evaluator reads no answers (3-SAT solves its instances; the games
play an opponent) have no entry here.
"""

from __future__ import annotations

SECRET_FILES: dict[str, tuple[str, ...]] = {
    # evaluate.py reads /home/agent/workspace/data/ground_truth.csv (datasets/titanic.yaml puts data/titanic/data
    # at data/)
    "titanicSurvival": ("data/ground_truth.csv",),
    # evaluate.py reads /home/agent/workspace/data/answer.csv, which _helpers/_generate_split.py writes beside
    # train/validation/test.csv (datasets/kaggleHousePrice.yaml puts that folder at data/)
    "regressionKaggleHousePrice": ("data/answer.csv",),
    "regressionKaggleHousePriceL1": ("data/answer.csv",),
}
"""Workspace-relative files each task's evaluator reads that hold the answers: the agent must never see them."""

BASELINE_METRICS: dict[str, dict[str, float]] = {
    # the task file records only rmse; its L1 variant, which runs the same baseline.py and evaluate.py on the same
    # split, records this rmse (30340.111853413255) together with r2, the metric MLGym ranks the task by
    "regressionKaggleHousePrice": {"r2": 0.8799891474739243},
}
"""Baseline values MLGym publishes for a task's ranking metric where the task file's ``baseline_scores`` omit it."""


def overlay_secret_files(task_id: str) -> list[str]:
    """The evaluator-only files we add to MLGym's task ``task_id`` (``mlgym/`` prefix allowed); [] when none."""
    return list(SECRET_FILES.get(task_id.removeprefix("mlgym/"), ()))


def overlay_baseline(task_id: str, baseline_scores: list[dict[str, float]]) -> list[dict[str, float]]:
    """``baseline_scores`` with the first dict completed by the metrics we know and it lacks (a copy)."""
    known = BASELINE_METRICS.get(task_id.removeprefix("mlgym/"))
    if not known or not baseline_scores:
        return [dict(scores) for scores in baseline_scores]
    first = {**known, **baseline_scores[0]}
    return [first] + [dict(scores) for scores in baseline_scores[1:]]
