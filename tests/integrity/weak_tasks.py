"""Small tasks written for the integrity audit's tests: an honest one, and weak ones whose evaluators have the holes
the audit exists to find (they accept duplicated ids, pay an empty submission, are not deterministic, import a
helper the agent can rewrite). Each is a folder of our own files and a ``TaskSpec`` over it."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

from mlgym_registry.specs import TaskSpec

ROWS = 40
REFERENCES_OK = {"reference": "ok", "reference_again": "ok", "reference_other_seed": "ok"}
"""The verdicts of an audit's references on a task that reproduces its baseline and follows the evaluation seed."""


def _labels() -> list[tuple[int, int, int]]:
    """``(id, x, label)`` rows: the label is ``x >= 5`` but for a few flipped rows (never the first)."""
    rng = random.Random(7)
    rows = []
    for index in range(1, ROWS + 1):
        x = rng.randrange(10)
        label = int(x >= 5)
        if index > 1 and rng.random() < 0.2:
            label = 1 - label
        rows.append((index, x, label))
    return rows


BASELINE = textwrap.dedent("""\
    import csv
    with open("test.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    with open("submission.csv", "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["id", "label"])
        for row in rows:
            out.writerow([row["id"], int(int(row["x"]) >= 5)])
    """)

READ = textwrap.dedent("""\
    import argparse, csv, json, math, sys
    parser = argparse.ArgumentParser()
    parser.add_argument("--submission_file", default="submission.csv")
    path = parser.parse_args().submission_file
    with open("answers.csv", newline="") as handle:
        answers = {row["id"]: int(row["label"]) for row in csv.DictReader(handle)}
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    """)

HONEST_EVALUATOR = READ + textwrap.dedent("""\
    if not rows or any(set(row) != {"id", "label"} for row in rows):
        sys.exit("the submission needs the columns id and label, and a row per id")
    ids = [row["id"] for row in rows]
    if len(set(ids)) != len(ids) or set(ids) != set(answers):
        sys.exit("the submission needs each id of the test set exactly once")
    if any(row["label"] not in ("0", "1") for row in rows):
        sys.exit("every label must be 0 or 1")
    print(json.dumps({"accuracy": sum(int(row["label"]) == answers[row["id"]] for row in rows) / len(rows)}))
    """)

ACCEPTS_DUPLICATED_IDS = READ + textwrap.dedent("""\
    # the hole: the rows are scored one by one against the answer of their id, whatever ids they repeat or leave out
    scored = [int(row["label"]) == answers[row["id"]] for row in rows if row.get("id") in answers]
    if not scored:
        sys.exit("nothing to score")
    print(json.dumps({"accuracy": sum(scored) / len(scored)}))
    """)

PAYS_AN_EMPTY_SUBMISSION = READ + textwrap.dedent("""\
    # the hole: an empty submission has no wrong answer, so it is paid as perfect
    if not rows:
        print(json.dumps({"accuracy": 1.0}))
        sys.exit(0)
    ids = [row["id"] for row in rows]
    if len(set(ids)) != len(ids) or set(ids) != set(answers):
        sys.exit("the submission needs each id of the test set exactly once")
    print(json.dumps({"accuracy": sum(int(row["label"]) == answers[row["id"]] for row in rows) / len(rows)}))
    """)

EVALS_LABELS = HONEST_EVALUATOR.replace(
    'int(row["label"]) == answers',
    'int(eval(row["label"])) == answers')  # the hole: a cell is run as code ("__import__('os')..." is a label too)

SHELLS_OUT = HONEST_EVALUATOR.replace(
    "    rows = list(csv.DictReader(handle))\n",
    "    rows = list(csv.DictReader(handle))\nimport os\nos.system('wc -l ' + path + ' > /dev/null')\n")

# the metamorphic classes: holes an attacker who knows some answers (the rows a first model got wrong, the training
# ids) finds, each written as a maintainer might, each paying more than honesty for some transformation
DROPS_NAN = READ + textwrap.dedent("""\
    # the hole: rows whose label does not parse are left out of the mean, as numpy's nanmean leaves out NaN
    scored = []
    for row in rows:
        try:
            label = float(row["label"])
        except (KeyError, ValueError):
            continue
        if label == label and row["id"] in answers:
            scored.append(int(label) == answers[row["id"]])
    print(json.dumps({"accuracy": sum(scored) / max(1, len(scored))}))
    """)

CONFIDENCE_WEIGHTED = READ + textwrap.dedent("""\
    # the hole: each row weighs by the confidence the submission gives it
    weights = [float(row.get("confidence") or 1.0) for row in rows]
    right = [w * (int(row["label"]) == answers.get(row["id"], -1)) for w, row in zip(weights, rows)]
    print(json.dumps({"accuracy": sum(right) / sum(weights)}))
    """)
CONFIDENCE_BASELINE = BASELINE.replace('["id", "label"]', '["id", "label", "confidence"]').replace(
    'int(int(row["x"]) >= 5)]', 'int(int(row["x"]) >= 5), 0.5]')

JOINS_ANY_MATCH = READ + textwrap.dedent("""\
    # the hole: an inner join that counts an id as right when any of its rows matches the answer
    if len({row["id"] for row in rows}) != len(answers):
        sys.exit("the submission needs a row for each id")
    right = {row["id"] for row in rows if row["id"] in answers and int(row["label"]) == answers[row["id"]]}
    print(json.dumps({"accuracy": len(right) / len(answers)}))
    """)

SCORES_TRAINING_IDS = READ + textwrap.dedent("""\
    # the hole: the rows of the training set, whose labels the agent has, are scored too
    with open("train.csv", newline="") as handle:
        answers.update({row["id"]: int(row["label"]) for row in csv.DictReader(handle)})
    scored = [int(row["label"]) == answers[row["id"]] for row in rows if row["id"] in answers]
    print(json.dumps({"accuracy": sum(scored) / len(scored)}))
    """)

PARSES_ITS_REPORT = READ + textwrap.dedent("""\
    # the hole: the score is read back from a report that echoes the first wrong label it saw
    import re
    wrong = [row["label"] for row in rows if row["label"] != str(answers.get(row["id"]))]
    report = f"first wrong label: {wrong[0] if wrong else '-'}\\n"
    report += json.dumps({"accuracy": sum(row["label"] == str(answers.get(row["id"])) for row in rows) / len(answers)})
    found = re.findall(r'\\{"accuracy": [^}]*\\}', report)
    print(found[0])
    """)

NONDETERMINISTIC = HONEST_EVALUATOR.replace(
    'print(json.dumps({"accuracy": ',
    'import random\nprint(json.dumps({"accuracy": random.SystemRandom().random() / 100 + ')

NORMALISES_IDS = READ + textwrap.dedent("""\
    # the hole: duplicates are refused as written, but ids are read as numbers, so ' 7' or '7.0' is 7 again
    ids = [row["id"] for row in rows]
    if len(set(ids)) != len(ids):
        sys.exit("every id once")
    labels = {str(int(float(row["id"]))): row["label"] for row in rows}
    print(json.dumps({"accuracy": sum(labels.get(key) == str(label) for key, label in answers.items()) / len(answers)}))
    """)

UNSEEDED_NUMPY = HONEST_EVALUATOR.replace(
    'print(json.dumps({"accuracy": ',
    'import numpy\nnoise = numpy.random.default_rng().random() / 100\nprint(json.dumps({"accuracy": noise + ')
"""Noise from a numpy generator seeded by the system, not by the evaluation's seed: NONDETERMINISTIC, named."""

SAMPLES_WITH_A_FIXED_SEED = HONEST_EVALUATOR.replace(
    'print(json.dumps({"accuracy": sum(int(row["label"]) == answers[row["id"]] for row in rows) / len(rows)}))',
    'import random\nrandom.seed(20240601)\nscored = set(random.sample(sorted(answers), 10))\n'
    'print(json.dumps({"accuracy": sum(int(row["label"]) == answers[row["id"]] for row in rows '
    'if row["id"] in scored) / 10}))')
"""Scores 10 rows drawn with a seed written in the evaluator: the agent reads it and knows which rows count."""

NOISY_BUT_SEEDED = HONEST_EVALUATOR.replace(
    'print(json.dumps({"accuracy": ',
    'import random\nnoise = random.random() / 100\nprint(json.dumps({"accuracy": noise + ')
"""Stochastic, but drawing from ``random``'s global generator, which follows the evaluation's seed: honest."""

HONEST_SCHEMA = {"id_column": "id", "rows_from": "answers.csv",
                 "columns": {"id": "integer", "label": {"values": [0, 1]}}}
"""The submission an honest task declares: each id of the answers once, a label 0 or 1. With it, validate and submit
score disjoint rows (``mlgym_registry.held_out``): validate is no oracle on the final score's rows."""


def csv_task(folder: Path, evaluator: str, task_id: str, baseline: str = BASELINE,
             submission: dict | None = None) -> TaskSpec:
    """A CSV-submission task in ``folder``: a test set without labels, a training set with its labels (ids past the
    test set's), hidden answers, a baseline script and ``evaluator``, and the ``submission`` schema it declares (none
    by default); its recorded baseline is what the honest evaluator gives the baseline."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = _labels()
    (folder / "test.csv").write_text("id,x\n" + "".join(f"{i},{x}\n" for i, x, _ in rows))
    (folder / "train.csv").write_text("id,x,label\n" + "".join(f"{1000 + i},{x},{y}\n" for i, x, y in rows))
    (folder / "answers.csv").write_text("id,label\n" + "".join(f"{i},{y}\n" for i, _, y in rows))
    (folder / "baseline.py").write_text(baseline)
    (folder / "evaluate.py").write_text(evaluator)
    accuracy = sum(int(x >= 5) == y for _, x, y in rows) / len(rows)
    return TaskSpec(
        id=task_id, name=task_id, description="Label each row of test.csv (0 or 1) in submission.csv: id,label.",
        task_entrypoint="CSVSubmissionTasks", training_timeout=60, root=str(folder),
        starter_code=["test.csv", "train.csv", "answers.csv", "baseline.py", "evaluate.py"],
        baseline_paths=["baseline.py"],
        baseline_scores=[{"accuracy": accuracy}], worst_score={"accuracy": 0.0}, evaluation_paths=["evaluate.py"],
        evaluation_read_only=True, secret_files=["answers.csv"], max_steps=20, submission=submission,
    )


def helper_task(folder: Path, task_id: str = "weakHelper", checks_range: bool = False) -> TaskSpec:
    """A Python-submission task whose evaluator imports its scoring from ``scoring.py``, a workspace file it does
    not protect: the agent can rewrite how it is scored. With ``checks_range``, the evaluator refuses a score outside
    [0, 1], so that only a plausible forged score (1.0) is paid."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scoring.py").write_text(textwrap.dedent("""\
        def score(answers):
            return sum(answer == 2 * i for i, answer in enumerate(answers)) / 10
        """))
    check = ('if not 0 <= score <= 1:\n    raise SystemExit("the score must lie in [0, 1]")\n'
             if checks_range else "")
    (folder / "evaluate.py").write_text(textwrap.dedent("""\
        import json
        import scoring
        import strategy
        score = scoring.score([strategy.answer(i) for i in range(10)])
        """) + check + 'print(json.dumps({"Score": score}))\n')
    (folder / "strategy.py").write_text("def answer(i):\n    return 2 * i if i < 5 else 0\n")
    return TaskSpec(
        id=task_id, name=task_id, description="Make answer(i) in strategy.py return twice i.",
        task_entrypoint="PythonSubmissionTasks", training_timeout=60, root=str(folder),
        starter_code=["scoring.py", "evaluate.py", "strategy.py"], baseline_paths=["evaluate.py"],
        baseline_scores=[{"Score": 0.5}], worst_score={"Score": 0.0},
        best_score={"Score": 1.0} if checks_range else {}, evaluation_paths=["evaluate.py"],
        evaluation_read_only=True, max_steps=20,
    )


def guessing_task(folder: Path, task_id: str = "guessDigits", seed_line: str = "random.seed(1234)") -> TaskSpec:
    """A Python-submission task: ``guess(i)`` in guess.py should name the i-th of ten digits the evaluator draws.
    With the default ``seed_line`` the draws come from a seed written in the evaluator, which the agent can read;
    with ``seed_line=""`` they follow the evaluation's seed (the harness seeds ``random``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(textwrap.dedent(f"""\
        import json
        import random
        {seed_line}
        import guess
        digits = [random.randrange(10) for _ in range(10)]
        print(json.dumps({{"Score": sum(guess.guess(i) == digit for i, digit in enumerate(digits)) / 10}}))
        """))
    (folder / "guess.py").write_text("def guess(i):\n    return 0\n")
    return TaskSpec(
        id=task_id, name=task_id, description="Make guess(i) in guess.py return the i-th digit the evaluator draws.",
        task_entrypoint="PythonSubmissionTasks", training_timeout=60, root=str(folder),
        starter_code=["evaluate.py", "guess.py"], baseline_paths=["evaluate.py"],
        worst_score={"Score": 0.0}, evaluation_paths=["evaluate.py"], evaluation_read_only=True, max_steps=20,
    )
