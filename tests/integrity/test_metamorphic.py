"""Metamorphic canaries: the reference's own submission transformed with what the audit knows of the answers. Each
weak evaluator below pays a transformation that can never raise an honest evaluator's score, and the canary that
plays it is named in the verdict; the honest evaluator pays none of them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlgym_registry.errors import MLGymRegistryError
from mlgym_registry.integrity import audit
from mlgym_registry.integrity.auditor import BEATS_HONESTY, OK
from mlgym_registry.integrity.metamorphic import NAMES

sys.path.insert(0, str(Path(__file__).parent))
import weak_tasks  # noqa: E402 - the tasks of this folder

pytestmark = pytest.mark.slow


def verdicts(report) -> dict[str, str]:
    return {result.canary.name: result.verdict for result in report.results}


@pytest.mark.parametrize("evaluator, baseline, canary", [
    (weak_tasks.DROPS_NAN, weak_tasks.BASELINE, "nan_wrong_rows"),
    (weak_tasks.CONFIDENCE_WEIGHTED, weak_tasks.CONFIDENCE_BASELINE, "zero_weight_wrong_rows_confidence"),
    (weak_tasks.JOINS_ANY_MATCH, weak_tasks.BASELINE, "every_answer_for_wrong_rows"),
    (weak_tasks.SCORES_TRAINING_IDS, weak_tasks.BASELINE, "ids_from_task_files"),
    (weak_tasks.PARSES_ITS_REPORT, weak_tasks.BASELINE, "answers_like_the_score_line"),
    (weak_tasks.NORMALISES_IDS, weak_tasks.BASELINE, "wrong_rows_respelled"),
], ids=["nanmean", "confidence-weights", "join-any-match", "training-ids-scored", "score-parsed-from-report",
        "ids-read-as-numbers"])
def test_each_weak_evaluator_pays_the_transformation_that_names_its_hole(tmp_path, evaluator, baseline, canary):
    spec = weak_tasks.csv_task(tmp_path / "task", evaluator, "weakMetamorphic", baseline)
    report = audit(spec, canaries=[canary])
    assert verdicts(report) == {**weak_tasks.REFERENCES_OK, canary: BEATS_HONESTY}, report.table()


def test_the_honest_evaluator_pays_no_transformation(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honestMetamorphic",
                               submission=weak_tasks.HONEST_SCHEMA)
    report = audit(spec, canaries=[*NAMES, "integer_9223372036854775807_on_wrong_rows"])
    played = verdicts(report)
    assert {"hide_wrong_rows", "nan_wrong_rows", "every_answer_for_wrong_rows", "ids_from_task_files",
            "wrong_rows_respelled", "answers_like_code", "integer_9223372036854775807_on_wrong_rows",
            "answers_learnt_by_validating"} \
        <= set(played)
    assert report.ok, report.table()


def test_a_canary_name_that_no_set_can_build_is_refused(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honestNames")
    with pytest.raises(MLGymRegistryError, match="no canary 'hide_wrong_row'"):
        audit(spec, canaries=["hide_wrong_row"])


def test_what_validating_could_teach_pays_nothing_at_submission_unless_validate_scores_the_same_rows():
    """houseRegression's validate scores other rows than submit: the true answers of the rows validate scores, which
    single-flip validates could learn, raise nothing. Scored on every row, as MLGym does, validate is an oracle, and
    the same canary beats honesty."""
    held_out = audit("houseRegression", canaries=["answers_learnt_by_validating"])
    assert verdicts(held_out)["answers_learnt_by_validating"] == OK, held_out.table()
    every_row = audit("houseRegression", canaries=["answers_learnt_by_validating"], validation_rows="all")
    assert verdicts(every_row)["answers_learnt_by_validating"] == BEATS_HONESTY, every_row.table()


def test_an_evaluator_that_scores_validate_on_the_final_rows_is_an_oracle(tmp_path):
    """Without a declared submission, validate scores every row, as MLGym's does: what validates could teach is then
    paid at submission, and the audit says so."""
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "oracleLabels")
    report = audit(spec, canaries=["answers_learnt_by_validating"])
    assert verdicts(report)["answers_learnt_by_validating"] == BEATS_HONESTY, report.table()
