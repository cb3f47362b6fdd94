"""``validate`` cannot read the answers the final score is taken on: for a task whose metric is a mean over rows,
validate and submit score disjoint rows of the answers, drawn from the task and the episode's evaluation seed.

Judged from the host, which knows the answers: a submission that is exact everywhere but on one row shows that row's
error in exactly one of validate and submit."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.held_out import SUBMIT, VALIDATE, row_split
from mlgym_registry.specs import TaskSpec

from .helpers import open_backend, write_file

pytestmark = pytest.mark.security

ERROR = 1000.0


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    return registry.spec("houseRegression")


@pytest.fixture(scope="module")
def answers(spec) -> dict[int, float]:
    path = Path(spec.datasets[0]["data_path"]) / "answer.csv"
    with path.open(newline="") as handle:
        return {int(row["Id"]): float(row["Price"]) for row in csv.DictReader(handle)}


def submission(answers: dict[int, float], wrong: set[int]) -> str:
    return "Id,Price\n" + "".join(f"{i},{p + ERROR if i in wrong else p}\n" for i, p in answers.items())


def evaluate(env, action: str) -> dict:
    _, _, _, info = env.step(action)
    assert info["evaluation_status"] == "ok", info
    return info["score"][-1]


def test_each_rows_error_shows_in_validate_or_submit_never_both(spec, answers):
    env = open_backend(spec)
    try:
        split = env.row_split()
        assert split is not None
        in_validate = [i for i in answers if split.keeps(str(i), VALIDATE)]
        in_submit = [i for i in answers if split.keeps(str(i), SUBMIT)]
        assert sorted(in_validate + in_submit) == sorted(answers) and not set(in_validate) & set(in_submit)
        assert len(in_validate) == round(len(answers) / 2)
        # wrong on two rows validate scores and one row submit scores
        write_file(env, "submission.csv", submission(answers, {in_validate[0], in_validate[1], in_submit[0]}))
        validated = evaluate(env, "validate")
        assert validated["rmse"] == pytest.approx(math.sqrt(2 * ERROR**2 / len(in_validate)))
        submitted = evaluate(env, "submit")
        assert submitted["rmse"] == pytest.approx(math.sqrt(ERROR**2 / len(in_submit)))
    finally:
        env.close()


def test_every_row_scores_both_when_the_user_asks_for_mlgyms_behaviour(spec, answers):
    env = open_backend(spec, validation_rows="all")
    try:
        some = set(list(answers)[:3])
        write_file(env, "submission.csv", submission(answers, some))
        assert evaluate(env, "validate")["rmse"] == pytest.approx(math.sqrt(3 * ERROR**2 / len(answers)))
    finally:
        env.close()


def test_the_split_follows_the_evaluation_seed_and_the_ids_not_their_spelling(spec, answers):
    ids = [str(i) for i in answers]
    first, again, other = row_split(spec, 11), row_split(spec, 11), row_split(spec, 12)
    sides = [first.keeps(i, VALIDATE) for i in ids]
    assert sides == [again.keeps(i, VALIDATE) for i in ids]
    assert sides != [other.keeps(i, VALIDATE) for i in ids]
    assert all(first.keeps(f"00{i}", VALIDATE) == first.keeps(f" {i}", VALIDATE) == side
               for i, side in zip(ids, sides, strict=True))
    rows = b"Price,Id\n1.5,007\n2.5,7\n3.5,8\n"
    kept = first.filtered(rows, VALIDATE).decode().splitlines()
    assert kept[0] == "Price,Id" and len(kept) - 1 == 2 * first.keeps("7", VALIDATE) + first.keeps("8", VALIDATE)


def test_tasks_without_rows_to_split_or_that_opt_out_score_every_row(spec):
    assert row_split(registry.spec("prisonersDilemma"), 0) is None
    assert row_split(spec.replace(extra={**spec.extra, "held_out_validation": False}), 0) is None
    assert row_split(spec, 0, "all") is None
    with pytest.raises(ValueError, match="validation_rows='some'"):
        row_split(spec, 0, "some")


def test_validate_probes_teach_nothing_submit_pays_for(spec, answers):
    """The oracle attack: flip one prediction per validate and keep what raised the score; at submission the rows
    it learnt are not scored, so the final score is the unprobed submission's on the submit rows."""
    env = open_backend(spec)
    try:
        split = env.row_split()
        guesses = {i: 200_000.0 for i in answers}
        base = "Id,Price\n" + "".join(f"{i},{p}\n" for i, p in guesses.items())
        write_file(env, "submission.csv", base)
        best = evaluate(env, "validate")["rmse"]
        probed = list(answers)[:12]
        for i in probed:  # an attacker that knows the answers in part, here exactly, probing row by row
            trial = {**guesses, i: answers[i]}
            write_file(env, "submission.csv", "Id,Price\n" + "".join(f"{k},{p}\n" for k, p in trial.items()))
            score = evaluate(env, "validate")["rmse"]
            if score < best:
                guesses, best = trial, score
        learnt = [i for i in probed if guesses[i] == answers[i]]
        assert learnt and all(split.keeps(str(i), VALIDATE) for i in learnt)
        write_file(env, "submission.csv", "Id,Price\n" + "".join(f"{i},{p}\n" for i, p in guesses.items()))
        submitted = evaluate(env, "submit")["rmse"]
        scored = [i for i in answers if split.keeps(str(i), SUBMIT)]
        unprobed = math.sqrt(sum((200_000.0 - answers[i]) ** 2 for i in scored) / len(scored))
        assert submitted == pytest.approx(unprobed)
    finally:
        env.close()
