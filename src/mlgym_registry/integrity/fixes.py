"""The fix the audit suggests for each failing verdict, in one line: what the task's maintainer changes.

A verdict of a reference (what the honest evaluation trusted, ran or drew) has one fix per verdict; a canary that
was paid more than it may be has the fix of the hole its transformation probes, found by its name or family (the
metamorphic canaries name the transformation, ``metamorphic.py``), else the verdict's.
"""

from __future__ import annotations

from typing import Any

from ..scores import INFRA_ERROR

BY_VERDICT = {
    "TRUSTS AGENT INPUT": "ship the file with the task (starter_code, protected_files or data), or list it in "
                          "submission_files if it is the agent's to provide",
    "RUNS SUBMISSION": "parse the submission as data (int(), float(), csv, json), never with eval, exec or a shell",
    "NONDETERMINISTIC": "draw only from random or numpy's global generator (the harness seeds them from the "
                        "evaluation's seed), or from a generator seeded with that seed",
    "FIXED SEED": "drop the seed call (the harness seeds random and numpy from the evaluation's seed) or derive the "
                  "seed from $MLGYM_REGISTRY_EVAL_SEED",
    "BASELINE NOT REPRODUCED": "record the baseline's score on this evaluator again (check --runs 3), or declare a "
                               "baseline_tolerance that covers the evaluator's own noise",
    "LEAK": "keep the hidden file out of the agent's workspace: list it in secret_files",
    "FARMABLE": "pay improvements only (mlgym_best_improvement), or declare the reward farmable and document it",
    "ERROR": "make the task playable (its data, packages and evaluator) and audit it again",
}
"""The fix of each verdict that no canary's transformation refines."""

MACHINE_FAILED = ("audit again on a machine with CPU, memory and disk to spare; if it fails there too, mend what the "
                  "task needs to run (its evaluation's note says what failed)")
"""The fix of a canary whose evaluations the machine failed at every play: the task may be fine."""

BY_CANARY = (
    # (a prefix of the canary's name, the fix), the first match wins
    ("hide_wrong_rows", "score every id of the answers: a missing row counts as wrong, never as not asked"),
    ("blank_wrong_rows", "score an empty answer as wrong, or refuse the submission"),
    ("nan_", "score a NaN answer as wrong (or refuse it), never drop it from a mean"),
    ("wrong_rows_last", "match rows by id, never by position"),
    ("wrong_rows_twice", "refuse a submission with an id twice"),
    ("wrong_rows_respelled", "compare ids as the answers spell them, or refuse two spellings of one id"),
    ("every_answer_for", "refuse a submission with an id twice: one answer per id"),
    ("first_row_everywhere", "refuse a submission with an id twice: one answer per id"),
    ("zero_weight_", "weigh rows by the task's own data, never by a column the submission provides"),
    ("integer_", "read answers as floats or check their range: an integer past 2**63 wraps where int64 sums it"),
    ("answers_learnt_by_validating", "let validate score other rows than submit (declare the submission schema's "
                                     "id_column and rows_from: held_out.py)"),
    ("negated_", "check the metric's sign: a negated answer must never score better"),
    ("ids_from_task_files", "score exactly the ids of the answers file: refuse rows for any other id"),
    ("answers_like_", "parse answers as data and print the score only from the evaluator's own numbers"),
    ("huge_answers", "refuse answers past the metric's range (or not finite) before scoring"),
    ("inf_answers", "refuse answers that are not finite before scoring"),
    ("huge_", "ignore submitted columns that are no answer, or check their range before using them"),
    ("negative_", "ignore submitted columns that are no answer, or check their range before using them"),
    ("constant_answer", "check that the metric cannot be met by one answer for every row"),
    ("duplicated_rows", "refuse a submission with an id twice"),
    ("one_id_everywhere", "refuse a submission with an id twice"),
    ("half_the_rows", "score every id of the answers: a missing row counts as wrong"),
    ("extra_column", "refuse columns the task does not ask for, or ignore them"),
    ("missing_column", "refuse a submission without every answer column"),
    ("folder_submission", "refuse a submission that is no regular file"),
    ("link_to_", "refuse a submission that is a link, or open it without following links"),
    ("fifo_submission", "refuse a submission that is no regular file"),
    ("syntax_error", "score a submission that does not import as a failure"),
    ("raises", "score a submission whose functions raise as a failure"),
    ("read_hidden_files", "keep the hidden files out of the agent's workspace: list them in secret_files"),
    ("write_hidden_files", "keep the hidden files out of the agent's workspace: list them in secret_files"),
    ("print_score", "read the score only from the evaluator's output, never from the agent's shell"),
    ("rewrite_", "keep the evaluator and every file it imports among the task's protected or evaluation files"),
    ("module_shadows", "keep the evaluator's imports from resolving to the agent's files (the harness's rules)"),
    ("rebind_builtins", "run the agent's code apart from the evaluator (the harness's channel)"),
    ("returns_best_", "take scores and verdicts only from the task's own code (protected or evaluation files), "
                      "never from a function the agent can rewrite"),
    ("returns_", "validate what the submitted functions return (type, range, finiteness) and score the rest as a "
                 "failure"),
    ("empty_submission", "refuse an empty submission: exit non-zero so that it scores as a failure"),
    ("header_only", "refuse a submission without rows: exit non-zero so that it scores as a failure"),
    ("missing_submission", "refuse a missing submission: exit non-zero so that it scores as a failure"),
    ("do_nothing", "score the starter files as the baseline does, never above it"),
    ("sleep_past_limit", "let a submission that runs past the limit score as a failure"),
    ("fill_the_disk", "let a submission that fills the disk score as a failure"),
)


def suggested_fix(result: Any) -> str:
    """The one-line fix for ``result`` (an ``auditor.CanaryResult``); '' for a verdict that is no failure."""
    if not result.failed:
        return ""
    if result.verdict == "ERROR" and INFRA_ERROR in result.statuses:
        return MACHINE_FAILED
    if result.verdict in ("BEATS HONESTY", "ABOVE FLOOR"):
        for prefix, fix in BY_CANARY:
            if result.canary.name.startswith(prefix):
                return fix
        return (f"the canary {result.canary.name!r} ({result.canary.tries}) should score no more than the "
                f"{result.canary.bound}: make the evaluator refuse or score down what it does")
    return BY_VERDICT.get(result.verdict, "")
