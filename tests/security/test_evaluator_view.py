"""The evaluator's view is built, not inherited: the task's own files plus the declared submission, nothing else of
the agent's. Judged against a weak task of our own whose evaluator trusts whatever its working folder holds (a
local folder named like a hub dataset, the ids to score from an editable starter file, a helper module), and by
tracing what the honest evaluations of the built-in tasks open."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.specs import TaskSpec
from mlgym_registry.submissions import declared_submission

from .helpers import foreign_inputs, mini_prisoners_spec, open_backend, status, validate, write_file

pytestmark = pytest.mark.security

ANSWERS = {str(i): i % 2 for i in range(1, 11)}
"""The weak task's hidden labels: ids 1..10, odd ids 1, even ids 0."""
TRAIN_IDS = ("1",)
"""Ids the task also gives the agent with their labels (``train.csv``)."""

WEAK_EVALUATOR = '''
import argparse, csv, json, os
import metrics

def read(path):
    with open(path, newline="") as handle:
        return {row["id"]: int(row["label"]) for row in csv.DictReader(handle)}

parser = argparse.ArgumentParser()
parser.add_argument("--submission_file")
args = parser.parse_args()
# as datasets.load_dataset("org/name") does: a local folder of that name wins over the offline copy
labels = read("org/labels/test.csv") if os.path.isdir("org/labels") else read("data/answer.csv")
with open("test.csv", newline="") as handle:
    ids = [row["id"] for row in csv.DictReader(handle)]
submitted = read(args.submission_file)
print(json.dumps({"accuracy": metrics.accuracy([labels[i] for i in ids], [submitted.get(i) for i in ids])}))
'''
METRICS = '''
def accuracy(truth, predicted):
    return sum(t == p for t, p in zip(truth, predicted)) / len(truth)
'''


def weak_task(folder: Path, **changes) -> TaskSpec:
    """A CSV task whose evaluator reads files of its working folder besides the submission and the answers."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(WEAK_EVALUATOR)
    (folder / "metrics.py").write_text(METRICS)
    (folder / "test.csv").write_text("id\n" + "".join(f"{i}\n" for i in ANSWERS))
    (folder / "train.csv").write_text("id,label\n" + "".join(f"{i},{ANSWERS[i]}\n" for i in TRAIN_IDS))
    (folder / "data" / "answer.csv").write_text("id,label\n" + "".join(f"{i},{v}\n" for i, v in ANSWERS.items()))
    spec = TaskSpec(
        id="weakView", task_entrypoint="CSVSubmissionTasks", training_timeout=60, max_steps=100,
        starter_code=["evaluate.py", "metrics.py", "test.csv", "train.csv"], evaluation_paths=["evaluate.py"],
        evaluation_read_only=True, secret_files=["data/answer.csv"], root=str(folder),
        datasets=[{"name": "labels", "description": "", "data_path": "data", "is_local": True}],
        baseline_scores=[{"accuracy": 0.5}],
    )
    return spec.replace(**changes)


ALL_ZEROS = "id,label\n" + "".join(f"{i},0\n" for i in ANSWERS)
"""An honest poor submission: right on the even ids, accuracy 0.5."""


@pytest.fixture
def weak(tmp_path):
    env = open_backend(weak_task(tmp_path / "task"))
    yield env
    env.close()


def submit_zeros(env) -> dict | None:
    write_file(env, "submission.csv", ALL_ZEROS)
    _, score = validate(env)
    return score


def test_the_honest_submission_scores_the_same_through_the_built_view(weak):
    assert submit_zeros(weak) == {"accuracy": 0.5}


@pytest.mark.parametrize("attack", [
    # a local folder named like the dataset the evaluator loads by name, with labels of the agent's
    "mkdir -p org/labels && printf 'id,label\\n' > org/labels/test.csv && "
    "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i,0 >> org/labels/test.csv; done",
    # the ids to score taken from an editable starter file: only one whose label the agent was given
    "chmod u+w test.csv; printf 'id\\n2\\n' > test.csv",
    # a helper module the evaluator imports, rewritten to pay perfection
    "chmod u+w metrics.py; printf 'def accuracy(truth, predicted):\\n    return 1.0\\n' > metrics.py",
    # the same helper shadowed by a package of the agent's
    "mv metrics.py old.py; mkdir metrics; printf 'def accuracy(t, p):\\n    return 1.0\\n' > metrics/__init__.py",
    # a bytecode cache of the helper beside it
    "mkdir -p __pycache__ && python -c \"import py_compile,sys; open('/tmp/m.py','w').write('def accuracy(t,p): "
    "return 1.0\\n'); py_compile.compile('/tmp/m.py', cfile='__pycache__/metrics.cpython-%d%d.pyc' % "
    "sys.version_info[:2])\"",
])
def test_nothing_of_the_agents_but_its_submission_reaches_the_evaluator(weak, attack):
    output, code = status(weak, attack)
    assert code == 0, output
    assert submit_zeros(weak) == {"accuracy": 0.5}


def test_a_submission_linked_to_the_answers_finds_nothing_to_score(weak):
    status(weak, "ln -s data/answer.csv submission.csv")
    obs, score = validate(weak)
    assert score is None and "0.0" not in obs.split("Evaluation Score")[-1][:0]
    status(weak, "rm submission.csv; mkdir -p sub; ln -s ../data sub/data; ln -s sub/data/answer.csv submission.csv")
    _, score = validate(weak)
    assert score is None


def test_a_declared_submission_can_name_more_than_the_default(tmp_path):
    """A task may declare what its evaluator reads from the agent: here the ids file too, which then counts."""
    spec = weak_task(tmp_path / "task", submission_files=["submission.csv", "test.csv"])
    assert declared_submission(spec) == ["submission.csv", "test.csv"]
    env = open_backend(spec)
    try:
        status(env, "chmod u+w test.csv; printf 'id\\n2\\n' > test.csv")
        assert submit_zeros(env) == {"accuracy": 1.0}
    finally:
        env.close()


@pytest.mark.parametrize("entry", ["/etc/passwd", "../outside.csv", "a/../../b"])
def test_a_declared_submission_outside_the_workspace_is_refused(tmp_path, entry):
    with pytest.raises(ValueError, match="submission_files entry"):
        weak_task(tmp_path / "task", submission_files=[entry])


BUILT_IN_BASELINES = {
    # each task's honest first move: its starter strategy or answer as given, houseRegression's baseline program
    "miniPrisonersDilemma": "",
    "battleOfSexes": "",
    "blotto": "",
    "capitals": "",
    "houseRegression": "python baseline.py",
}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(BUILT_IN_BASELINES))
def test_every_path_an_honest_evaluation_opens_is_the_tasks_or_the_submission(task, tmp_path):
    spec = mini_prisoners_spec(tmp_path / "pd") if task == "miniPrisonersDilemma" else registry.spec(task)
    env = open_backend(spec)
    try:
        # the agent leaves files of its own beside the submission: the evaluator must not even list them
        status(env, "mkdir -p notes && echo mine > notes/a.txt && echo mine > scratch.py")
        if BUILT_IN_BASELINES[task]:
            output, code = status(env, BUILT_IN_BASELINES[task], timeout=300)
            assert code == 0, output
        assert foreign_inputs(env) == []
    finally:
        env.close()


OPPONENT_EVALUATOR = '''
import json
import strategy
import target
score = sum(strategy.move(i) == target.move(i) for i in range(10)) / 10
print(json.dumps({"Score": score}))
'''


def test_a_python_tasks_unprotected_opponent_is_the_tasks_own(tmp_path):
    """A Python task whose description names only strategy.py: the evaluator's target.py (an opponent the task forgot
    to protect, and the name MLGym gives every Python submission) is the task's, whatever the agent writes there."""
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "evaluate.py").write_text(OPPONENT_EVALUATOR)
    (folder / "target.py").write_text("def move(i):\n    return i % 2\n")
    (folder / "strategy.py").write_text("def move(i):\n    return 0\n")
    spec = TaskSpec(id="opponentView", description="Make move(i) in strategy.py match the opponent's moves.",
                    task_entrypoint="PythonSubmissionTasks", training_timeout=60, root=str(folder),
                    starter_code=["evaluate.py", "target.py", "strategy.py"], evaluation_paths=["evaluate.py"],
                    evaluation_read_only=True, baseline_scores=[{"Score": 0.5}], max_steps=20)
    env = open_backend(spec)
    try:
        assert validate(env)[1] == {"Score": 0.5}
        status(env, "printf 'def move(i):\\n    return 0\\n' > target.py")  # the opponent now plays like the agent
        assert validate(env)[1] == {"Score": 0.5}
    finally:
        env.close()
