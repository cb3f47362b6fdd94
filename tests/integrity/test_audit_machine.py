"""A loaded machine never changes a verdict: a canary whose evaluation the machine failed (``infra_error``: starved,
or its sandbox could not start) says nothing of the task, so the audit plays it again, and says so when the machine
fails it every time.

The machine's failure is a stand-in here (a backend whose first evaluations raise the local backend's own infra
failure): a real starved evaluation cannot be made to happen on exactly the evaluations a test wants."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.local.evaluation import EvaluationFailure
from mlgym_registry.integrity import audit
from mlgym_registry.integrity.auditor import DOCUMENTED_FARMING, ERROR, MACHINE_REPLAYS
from mlgym_registry.scores import INFRA_ERROR

sys.path.insert(0, str(Path(__file__).parent))
import weak_tasks  # noqa: E402 - the tasks of this folder


class MachineFailure(EvaluationFailure):
    status = INFRA_ERROR


class FailingMachine(LocalBackend):
    """The local backend on a machine that fails the next ``failures`` evaluations (of every env made from it)."""

    failures = 0

    def _outcome(self, info, action, evaluator, started):
        if FailingMachine.failures > 0:
            FailingMachine.failures -= 1
            evaluate = evaluator.evaluate

            def failed(**kwargs):
                evaluator.evaluate = evaluate
                raise MachineFailure("the evaluation got no CPU before its backstop: the machine's load")

            evaluator.evaluate = failed
        return super()._outcome(info, action, evaluator, started)


@pytest.fixture
def failing_machine():
    registry.register("backend", "local_failing_machine", FailingMachine)
    try:
        yield FailingMachine
    finally:
        FailingMachine.failures = 0
        registry.unregister("backend", "local_failing_machine")


def honest_task(tmp_path):
    return weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honestLabels",
                               submission=weak_tasks.HONEST_SCHEMA)


def explained(report) -> str:
    """Each canary's verdict with what decided it (the evaluator's scores and statuses), for a failing assertion."""
    return "".join(f"\n{r.canary.name}: {r.verdict} {r.rewards} limits {r.limits} scores {r.scores} statuses "
                   f"{r.statuses} {r.detail}" for r in report.results) + f"\nnotes: {report.notes}"


def test_a_canary_the_machine_failed_is_played_again_and_judged_as_on_a_quiet_machine(tmp_path, failing_machine):
    # the farming canary validates again and again: one validate lost to the machine paid less than the others, and
    # its verdict read 'ok' where mlgym_score_delta's documented farming is the truth (CI, at load 20+)
    names = ["validate_repeatedly"]
    quiet_report = audit(honest_task(tmp_path / "a"), rewards=["mlgym_score_delta"], canaries=names)
    quiet = {r.canary.name: r.verdict for r in quiet_report.results}
    assert quiet["validate_repeatedly"] == DOCUMENTED_FARMING, explained(quiet_report)
    failing_machine.failures = 2  # the reference's first evaluation, then the next play's
    report = audit(honest_task(tmp_path / "b"), rewards=["mlgym_score_delta"], canaries=names,
                   backend="local_failing_machine")
    assert {r.canary.name: r.verdict for r in report.results} == quiet, explained(report) + explained(quiet_report)
    assert all(INFRA_ERROR not in r.statuses for r in report.results)


def test_a_canary_the_machine_fails_at_every_play_is_an_error_that_names_the_machine(tmp_path, failing_machine):
    failing_machine.failures = MACHINE_REPLAYS + 1  # every play of the reference
    report = audit(honest_task(tmp_path), canaries=["constant_answer"], backend="local_failing_machine")
    reference = next(r for r in report.results if r.canary.name == "reference")
    assert reference.verdict == ERROR and INFRA_ERROR in reference.statuses
    assert "the machine failed evaluations of this canary" in reference.detail
    assert "machine" in reference.fix and "playable" not in reference.fix
    assert not report.ok
