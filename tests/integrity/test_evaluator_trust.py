"""The audit observes what the honest evaluation trusts (the harness's trace of what its process opened, ran as code
and started): a submission run as code, or a file of the agent's the task does not declare, is a failing verdict of
its own, with the fix, whatever any canary was paid."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlgym_registry.integrity import audit
from mlgym_registry.integrity.auditor import OK, RUNS_SUBMISSION

sys.path.insert(0, str(Path(__file__).parent))
import weak_tasks  # noqa: E402 - the tasks of this folder


def reference_verdict(spec) -> tuple[str, str]:
    report = audit(spec, canaries=[])  # the references alone: the trace is theirs
    result = next(r for r in report.results if r.canary.name == "reference")
    return result.verdict, result.detail


@pytest.mark.slow
@pytest.mark.parametrize("evaluator, said", [
    (weak_tasks.EVALS_LABELS, "compiled '1', a piece of the submission, as code"),
    (weak_tasks.SHELLS_OUT, "fed from the submission"),
])
def test_an_evaluator_that_runs_the_submission_fails_the_audit(tmp_path, evaluator, said):
    verdict, detail = reference_verdict(weak_tasks.csv_task(tmp_path / "task", evaluator, "runsSubmission"))
    assert verdict == RUNS_SUBMISSION, detail
    assert said in detail


@pytest.mark.slow
def test_an_honest_evaluator_trusts_only_its_files_and_the_submission(tmp_path):
    verdict, detail = reference_verdict(weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honest"))
    assert verdict == OK, detail
