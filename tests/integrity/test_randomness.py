"""The audit reads where an evaluator's randomness comes from (the references' traces): randomness that follows the
evaluation's seed passes, a seed written in the evaluator is FIXED SEED, and NONDETERMINISTIC names what did not
follow the seed; the canaries of a nondeterministic evaluator are judged against the reference's band."""

from __future__ import annotations

import sys
from pathlib import Path

from mlgym_registry.integrity import audit
from mlgym_registry.integrity.auditor import BEATS_HONESTY, FIXED_SEED, NONDETERMINISTIC, OK
from mlgym_registry.integrity.report import integrity_card

sys.path.insert(0, str(Path(__file__).parent))
import weak_tasks  # noqa: E402 - the tasks of this folder


def verdicts(report) -> dict[str, str]:
    return {result.canary.name: result.verdict for result in report.results}


def test_a_stochastic_evaluator_that_follows_the_seed_passes_and_its_card_says_which_generator(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.NOISY_BUT_SEEDED, "noisyButSeeded")
    report = audit(spec, canaries=["do_nothing"])
    assert verdicts(report) == {**weak_tasks.REFERENCES_OK, "do_nothing": OK}
    assert report.randomness["followed"] == ["random"] and report.randomness["fixed_seeds"] == []
    other = next(r for r in report.results if r.canary.name == "reference_other_seed")
    reference = next(r for r in report.results if r.canary.name == "reference")
    assert other.scores != reference.scores  # another seed, other noise
    band = integrity_card(report)["reward"]["band"]
    assert band["mlgym_best_improvement"][0] == band["mlgym_best_improvement"][1]  # deterministic per seed


def test_a_seed_written_in_a_csv_evaluator_is_a_fixed_seed(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.SAMPLES_WITH_A_FIXED_SEED, "fixedSample")
    report = audit(spec, canaries=["do_nothing"])
    assert verdicts(report)["reference_other_seed"] == FIXED_SEED
    failure = next(r for r in report.failures if r.verdict == FIXED_SEED)
    assert "evaluate.py:17 seeds random.seed with 20240601" in failure.detail
    assert "MLGYM_REGISTRY_EVAL_SEED" in failure.fix


def test_a_seed_written_in_a_python_tasks_evaluator_is_a_fixed_seed_and_following_the_seed_passes(tmp_path):
    weak = audit(weak_tasks.guessing_task(tmp_path / "weak"), canaries=["do_nothing"])
    assert verdicts(weak)["reference_other_seed"] == FIXED_SEED
    assert weak.randomness["fixed_seeds"] == ["random.seed at evaluate.py:3 = 1234"]
    honest = audit(weak_tasks.guessing_task(tmp_path / "honest", "guessFollows", seed_line=""),
                   canaries=["do_nothing"])
    assert honest.ok, honest.table()
    assert honest.randomness["followed"] == ["random"]


def test_nondeterminism_names_the_generator_and_the_line_and_the_band_keeps_canaries_fair(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.UNSEEDED_NUMPY, "unseededNumpy")
    report = audit(spec, canaries=["hide_wrong_rows"])
    found = verdicts(report)
    assert found["reference_again"] == NONDETERMINISTIC
    detail = next(r.detail for r in report.results if r.canary.name == "reference_again")
    assert "numpy.random.default_rng() unseeded at evaluate.py:" in detail
    assert {"reference_repeat_1", "reference_repeat_2", "reference_repeat_3"} <= set(found)
    low, top = report.band["mlgym_best_improvement"]
    assert low < top
    # the noise (at most 0.01 of accuracy) never makes a canary beat honesty: only what rises above the band does
    assert BEATS_HONESTY not in found.values()
