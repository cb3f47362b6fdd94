"""Submissions an evaluator would trust: each is checked against its task's schema before the evaluator runs.

MLGym's titanic evaluator checks only the columns and the row count, then joins the submission with the answers on
PassengerId: 418 rows that all name one passenger (with that passenger's fate) score accuracy 1.0 with no model. Our
overlay declares titanic's schema (PassengerId unique and equal to the answers' ids, Survived 0 or 1), so such a
submission, and every other malformed one, is an ``invalid_submission`` paid the task's floor, with the rule named;
honest submissions score exactly what they scored before. Everything runs on the real sandbox and evaluator, on a
checkout shaped like MLGym's (its task id, file layout and CSV schema; an evaluator in the standard library that
behaves as titanic's does), and is judged from the host: the evaluation status, the score list, the reward.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlgym_registry import InvalidTaskError, Registry, load_task_yaml, registry
from mlgym_registry.backends.protocol import EVALUATION_OK, EVALUATION_STATUS_KEY, INFRA_ERROR, INVALID_SUBMISSION
from mlgym_registry.cli import main as cli_main
from mlgym_registry.components.rewards import ScoreDeltaReward, failure_reward
from mlgym_registry.held_out import SUBMIT, VALIDATE, row_split
from mlgym_registry.specs import TaskSpec
from mlgym_registry.submissions import SubmissionRejected, SubmissionSchema, submission_schema
from mlgym_registry.tasks.mlgym_overlay import overlay_submission

from .helpers import SEED, foreign_inputs, open_backend, run, status, write_file

pytestmark = pytest.mark.security

PASSENGERS = range(892, 1310)  # titanic's 418 test passengers


def female(passenger: int) -> bool:
    return passenger % 3 == 0


def survived(passenger: int) -> int:
    """The answers: the gender rule holds for four passengers in five."""
    return int(female(passenger) != (passenger % 5 == 0))


TASK = """\
id: titanicSurvival
name: Titanic Survival Prediction
description: Predict 'Survived' for data/test.csv; write submission.csv (PassengerId, Survived).
task_entrypoint: CSVSubmissionTasks
training_timeout: 120
starter_code:
  - data/titanic/evaluate.py
dataset_configs:
  - datasets/titanic.yaml
baseline_scores:
  - Accuracy: 0.5
evaluation_paths:
  - evaluate.py
sample_submission: data/titanic/sample_submission.csv
evaluation_read_only: true
requirements: []
"""

DATASET = 'name: titanic\ndescription: "train.csv and test.csv"\ndata_path: "data/titanic/data"\nis_local: true\n'

# titanic's evaluate.py in the standard library: the columns must be there and the row count that of the answers;
# then an inner join on PassengerId, and the accuracy over the joined rows
EVALUATE = """\
import csv, json, os, sys

workspace = "/home/agent/workspace"
with open(os.path.join(workspace, "data", "ground_truth.csv")) as handle:
    truth = {row["PassengerId"]: row["Survived"] for row in csv.DictReader(handle)}
with open(os.path.join(workspace, "submission.csv")) as handle:
    reader = csv.DictReader(handle)
    rows = list(reader)
if not {"PassengerId", "Survived"} <= set(reader.fieldnames or ()):
    sys.exit("Error: Submission file must contain the columns: ['PassengerId', 'Survived']")
if len(rows) != len(truth):
    sys.exit(f"Error: Submission file has the incorrect number of rows. Expected {len(truth)}, got {len(rows)}.")
joined = [(row["Survived"], truth[row["PassengerId"]]) for row in rows if row["PassengerId"] in truth]
if not joined:
    sys.exit("Error: No matching PassengerIds found between submission and ground truth.")
print(json.dumps({"accuracy": sum(float(a) == float(b) for a, b in joined) / len(joined)}))
"""

# Kaggle's example submission for the competition: every woman survives, no man does (an honest rule, no model)
GENDER_RULE = ("python -c \"import csv; rows = list(csv.DictReader(open('data/test.csv'))); "
               "w = csv.writer(open('submission.csv', 'w', newline='')); w.writerow(['PassengerId', 'Survived']); "
               "w.writerows([r['PassengerId'], int(r['Sex'] == 'female')] for r in rows)\"")
HONEST_ACCURACY = sum(int(female(p)) == survived(p) for p in PASSENGERS) / len(PASSENGERS)  # 0.80


def table(rows, header: str = "PassengerId,Survived") -> str:
    return header + "\n" + "".join(",".join(map(str, row)) + "\n" for row in rows)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("checkout") / "MLGym"
    write(root / "configs/tasks/titanic.yaml", TASK)
    write(root / "configs/datasets/titanic.yaml", DATASET)
    write(root / "data/titanic/evaluate.py", EVALUATE)
    write(root / "data/titanic/sample_submission.csv", table((p, 0) for p in PASSENGERS))
    write(root / "data/titanic/data/train.csv", "PassengerId,Survived,Sex\n1,0,male\n2,1,female\n")
    write(root / "data/titanic/data/test.csv", table(((p, "female" if female(p) else "male") for p in PASSENGERS),
                                                     "PassengerId,Sex"))
    write(root / "data/titanic/data/ground_truth.csv", table((p, survived(p)) for p in PASSENGERS))
    return root


@pytest.fixture(scope="module")
def spec(checkout):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLGYM_ROOT", str(checkout))
        reg = Registry()
        reg.names("task")
        return reg.spec("mlgym/titanicSurvival")


@pytest.fixture(scope="module")
def backend(spec):
    # every row scored, as MLGym does: these tests compare checked scores with the task's unchecked ones and with
    # accuracies over all of its answers (held-out validation rows have tests of their own, test_validate_oracle)
    env = open_backend(spec, validation_rows="all")
    yield env
    env.close()


@pytest.fixture
def env(backend):
    backend.reset(seed=SEED)
    return backend


def evaluate(env, action: str = "validate") -> tuple[str, dict, float]:
    """Run ``action``: its observation, its info and the reward the task's reward pays for it."""
    observation, _, _, info = env.step(action)
    return str(observation), info, ScoreDeltaReward()(observation, info, env.spec)


def assert_rejected(env, rule: str, *, action: str = "validate", not_found: bool = False) -> str:
    """The submission in the workspace is an invalid submission naming ``rule`` (or, with ``not_found``, one the
    evaluation found no plain file of), scores nothing, pays the floor."""
    scores_before = len(env._scores)
    observation, info, reward = evaluate(env, action)
    assert info[EVALUATION_STATUS_KEY] == INVALID_SUBMISSION, (observation, info)
    assert len(info["score"]) == scores_before, "an invalid submission was scored"
    assert reward == failure_reward(env.spec) < 0
    if action == "validate" and not_found and observation.startswith("Submission artefact not found"):
        return observation
    if action == "validate":
        assert observation.startswith("Invalid submission: submission.csv was not evaluated."), observation
        assert f" {rule}: " in observation, observation
    else:
        assert info["exit_status"] == f"evaluation_format_error ({action})", info
    return observation


def test_the_overlay_declares_titanics_schema(spec):
    schema = submission_schema(spec)
    assert schema is not None and schema.id_column == "PassengerId" and schema.rows_from == "data/ground_truth.csv"
    assert [c.name for c in schema.columns] == ["PassengerId", "Survived"]
    assert schema.column("Survived").values == (0, 1)


def test_without_the_check_one_passenger_418_times_scores_perfectly(spec):
    """What the check stops: MLGym's evaluator scores the fake submission 1.0, above the honest rule's 0.80."""
    env = open_backend(spec.replace(submission=None))
    try:
        write_file(env, "submission.csv", table((892, survived(892)) for _ in PASSENGERS))
        observation, info, _ = evaluate(env)
        assert info["score"][-1] == {"accuracy": 1.0}, observation
    finally:
        env.close()


def test_one_passenger_418_times_is_invalid_and_paid_the_floor(env):
    write_file(env, "submission.csv", table((892, survived(892)) for _ in PASSENGERS))
    observation = assert_rejected(env, "ids")
    assert "418 rows but 1 distinct PassengerId (repeated: 892)" in observation, observation
    assert "every PassengerId of data/ground_truth.csv must appear once" in observation
    assert_rejected(env, "ids", action="submit")  # and as a final submission


def test_an_honest_submission_scores_exactly_what_it_scored_unchecked(env, spec):
    output, code = status(env, GENDER_RULE)
    assert code == 0, output
    observation, info, reward = evaluate(env)
    assert info[EVALUATION_STATUS_KEY] == "ok", observation
    checked = info["score"][-1]
    assert checked == {"accuracy": pytest.approx(HONEST_ACCURACY)}
    assert reward == pytest.approx(HONEST_ACCURACY - 0.5)
    unchecked_env = open_backend(spec.replace(submission=None), validation_rows="all")
    try:
        output, code = status(unchecked_env, GENDER_RULE)
        assert code == 0, output
        _, info, _ = evaluate(unchecked_env)
        assert info["score"][-1] == checked  # exactly, not approximately
    finally:
        unchecked_env.close()


def test_titanics_evaluation_reads_only_the_tasks_files_and_the_submission(env):
    """An MLGym task through our overlay: its evaluator opens the answers, the submission and nothing else of the
    agent's, however many files the agent leaves beside them."""
    output, code = status(env, GENDER_RULE + " && mkdir -p data2 && cp data/test.csv data2/ && echo x > notes.txt")
    assert code == 0, output
    assert foreign_inputs(env) == []


def honest_rows() -> list[tuple[int, int]]:
    return [(p, int(female(p))) for p in PASSENGERS]


MALFORMED = {
    # rule named, submission.csv's text
    "one id missing": ("rows", table(honest_rows()[1:])),
    "an unknown id for a known one": ("ids", table([(5000, 1), *honest_rows()[1:]])),
    "an id twice": ("ids", table([honest_rows()[1], *honest_rows()[1:]])),
    "an extra row": ("rows", table([*honest_rows(), (5000, 1)])),
    "an extra column": ("columns", table(((p, s, 1) for p, s in honest_rows()), "PassengerId,Survived,Extra")),
    "an index column": ("columns", table(((i, p, s) for i, (p, s) in enumerate(honest_rows())),
                                         ",PassengerId,Survived")),
    "a missing column": ("columns", table(((p,) for p, _ in honest_rows()), "PassengerId")),
    "a nan": ("values", table([(892, "nan"), *honest_rows()[1:]])),
    "an empty cell": ("values", table([(892, ""), *honest_rows()[1:]])),
    "an inf": ("values", table([(892, "inf"), *honest_rows()[1:]])),
    "a 1e308": ("values", table([(892, "1e308"), *honest_rows()[1:]])),
    "a survival of 2": ("values", table([(892, 2), *honest_rows()[1:]])),
    "a short row": ("rows", table([(892,), *honest_rows()[1:]])),
    "a header only": ("rows", "PassengerId,Survived\n"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=lambda case: case.replace(" ", "_"))
def test_a_malformed_submission_is_invalid(env, case):
    rule, text = MALFORMED[case]
    write_file(env, "submission.csv", text)
    assert_rejected(env, rule)


ODD_FILES = {
    # rule named, the agent's command that puts something other than a plain file at submission.csv (the copy of the
    # workspace leaves out FIFOs and links to nothing it holds: for a CSV task that is "Submission artefact not
    # found" before the check; the check refuses them in any task)
    "an empty file": ("empty", ": > submission.csv"),
    "a folder": ("file", "mkdir submission.csv"),
    "a FIFO": ("file", "mkfifo submission.csv"),
    "a link to the hidden answers": ("file", "ln -s data/ground_truth.csv submission.csv"),
    "a link to the test set": ("file", "ln -s data/test.csv submission.csv"),
    "a link to a host file": ("file", "ln -s /etc/passwd submission.csv"),
    "a link to a folder": ("file", "mkdir folder && ln -s folder submission.csv"),
    "binary bytes": ("format", "head -c 3000 /dev/urandom > submission.csv"),
}


@pytest.mark.parametrize("case", list(ODD_FILES), ids=lambda case: case.replace(" ", "_"))
def test_anything_but_a_plain_csv_file_is_invalid(env, case):
    rule, command = ODD_FILES[case]
    output, code = status(env, command)
    assert code == 0, output
    assert_rejected(env, rule, not_found=rule == "file")


def test_the_kaggle_schemas_pair_rows_by_position_as_the_evaluator_does():
    """evaluate.py of the Kaggle tasks pairs SalePrice by position: the rows must follow the answers' order."""
    answer = table(((1461 + i, 100_000 + i) for i in range(5)), "Id,SalePrice").encode()
    for task in ("regressionKaggleHousePrice", "regressionKaggleHousePriceL1"):
        schema = SubmissionSchema.from_dict(task, overlay_submission(task))
        assert schema.check(answer, answer) == 5
        shuffled = table(((1461 + i, 1) for i in (1, 0, 2, 3, 4)), "Id,SalePrice").encode()
        with pytest.raises(SubmissionRejected, match="order: row 1 has Id 1462, data/answer.csv has 1461"):
            schema.check(shuffled, answer)
        with pytest.raises(SubmissionRejected, match="values: line 2: SalePrice '1e308' is outside"):
            schema.check(table([(1461, "1e308")], "Id,SalePrice").encode(), answer)


# -- a task author's schema ----------------------------------------------------------------------------------------
AUTHOR_EVALUATE = """\
import csv, json
truth = {r["key"]: r["label"] for r in csv.DictReader(open("data/answers.csv"))}
guess = {r["key"]: r["label"] for r in csv.DictReader(open("submission.csv"))}
print(json.dumps({"Score": sum(guess.get(k) == v for k, v in truth.items()) / len(truth)}))
"""
AUTHOR_TASK = """\
id: labelsTask
description: Label every key of data/keys.csv with a or b; write submission.csv (key, label, weight).
task_entrypoint: CSVSubmissionTasks
training_timeout: 60
starter_code: [files/evaluate.py, files/data]
evaluation_paths: [evaluate.py]
secret_files: [data/answers.csv]
baseline_scores: [{Score: 0.5}]
requirements: []
submission:
  file: submission.csv
  format: csv
  id_column: key
  rows_from: data/answers.csv
  max_bytes: 2000
  columns:
    key: text
    label: {values: [a, b]}
    weight: {type: number, min: 0, max: 1}
"""


def author_task(folder: Path, keys: int = 6) -> TaskSpec:
    """The task author's labelling task, written in ``folder``, with ``keys`` rows of answers."""
    write(folder / "files/evaluate.py", AUTHOR_EVALUATE)
    write(folder / "files/data/answers.csv", "key,label\n" + "".join(f"{k},{label}\n" for k, label in answers_of(keys)))
    write(folder / "files/data/keys.csv", "key\n" + "".join(f"k{i}\n" for i in range(keys)))
    write(folder / "labels.yaml", AUTHOR_TASK)
    return load_task_yaml(folder / "labels.yaml")


def answers_of(keys: int) -> list[tuple[str, str]]:
    """The answers of the author's task with ``keys`` rows: ``(key, label)``."""
    return [(f"k{i}", "ab"[i % 2]) for i in range(keys)]


@pytest.fixture(scope="module")
def author_spec(tmp_path_factory):
    return author_task(tmp_path_factory.mktemp("author"))


def labels(rows) -> str:
    return "key,label,weight\n" + "".join(f"{k},{label},{w}\n" for k, label, w in rows)


def assert_scored(env, action: str, score: float) -> None:
    """``action`` scored the submission in the workspace ``score``."""
    observation, info, _ = evaluate(env, action)
    assert info[EVALUATION_STATUS_KEY] == EVALUATION_OK, (observation, info)
    assert info["score"][-1] == {"Score": score}, observation


def test_a_task_authors_schema_is_enforced(author_spec):
    env = open_backend(author_spec)
    try:
        honest = [(f"k{i}", "ab"[i % 2], 0.5) for i in range(6)]
        write_file(env, "submission.csv", labels(honest))
        assert_scored(env, "validate", 1.0)
        for rule, rows in (("values", [(k, "c", w) for k, _, w in honest]),
                           ("values", [(k, label, 2.0) for k, label, _ in honest]),
                           ("ids", honest[:5] + [("k9", "a", 0.5)])):
            write_file(env, "submission.csv", labels(rows))
            assert_rejected(env, rule)
        write_file(env, "submission.csv", labels(honest) + "k0,a,0.5\n" * 400)  # over max_bytes: 2000
        assert_rejected(env, "size")
    finally:
        env.close()


def test_a_reference_the_agent_could_change_is_the_tasks_failure(author_spec):
    """rows_from must name a file of the task's own (its data, evaluation or secret files): a file the agent writes
    could say anything. Such a task fails its evaluations as infra errors, never paid to or charged on the agent."""
    schema = dict(author_spec.submission, rows_from="mine.csv")
    env = open_backend(author_spec.replace(submission=schema))
    try:
        write_file(env, "mine.csv", "key\nk0\n")
        write_file(env, "submission.csv", labels([("k0", "a", 0.5)]))
        observation, info, reward = evaluate(env)
        assert info[EVALUATION_STATUS_KEY] == INFRA_ERROR and reward == 0.0, observation
        assert "submission.rows_from 'mine.csv' is none of the task's" in observation
    finally:
        env.close()


# -- the rows validate and submit score (held_out) -----------------------------------------------------------------
@pytest.mark.parametrize("keys", [1, 2, 3, 5, 6, 41])
def test_validate_and_submit_each_score_rows_in_every_episode(tmp_path, keys):
    """The answers are shared out by rank: half to validate, the rest to submit, neither part ever empty (a part
    with no rows is an honest submission's failed evaluation, a mean over nothing); one row is scored by both."""
    spec = author_task(tmp_path, keys)
    data = (tmp_path / "files/data/answers.csv").read_bytes()
    ids = [key for key, _ in answers_of(keys)]
    shares = set()
    for seed in range(200):
        split = row_split(spec, seed, answers=lambda: data)
        validated = [key for key in ids if split.keeps(key, VALIDATE)]
        submitted = [key for key in ids if split.keeps(key, SUBMIT)]
        if keys == 1:
            assert validated == submitted == ids
            continue
        assert len(validated) == min(max(round(keys / 2), 1), keys - 1), (seed, validated)
        assert sorted(validated + submitted) == sorted(ids), (seed, validated, submitted)
        shares.add(tuple(validated))
    assert keys == 1 or len(shares) > 1  # the seed ranks them


def test_the_split_reads_nothing_of_where_the_task_is_installed(tmp_path):
    """Two copies of one task, in folders of different names and depths, split every seeded episode's rows alike, as
    must two machines that share the installation key; a row's side is drawn alike without the answers too."""
    here, there = author_task(tmp_path / "here", 8), author_task(tmp_path / "over" / "there" / "x", 8)
    data = (tmp_path / "here/files/data/answers.csv").read_bytes()
    ids = [key for key, _ in answers_of(8)] + ["k77"]
    for seed in range(20):
        for answers in (lambda: data, None):
            mine, theirs = row_split(here, seed, answers=answers), row_split(there, seed, answers=answers)
            assert [mine.keeps(key, VALIDATE) for key in ids] == [theirs.keeps(key, VALIDATE) for key in ids]


def test_an_honest_submission_scores_in_every_episode_of_a_two_row_task(tmp_path):
    """On the real sandbox and evaluator: the author's evaluator divides by the number of answers it is given, so an
    empty part of the answers would fail the honest submission's validate or submit."""
    env = open_backend(author_task(tmp_path, 2))
    try:
        for episode in range(4):
            if episode:
                env.reset()
            write_file(env, "submission.csv", labels([(key, label, 0.5) for key, label in answers_of(2)]))
            assert_scored(env, "validate", 1.0)
            assert_scored(env, "submit", 1.0)
    finally:
        env.close()


PYTHON_EVALUATE = """\
import csv, json
rows = list(csv.DictReader(open("out/predictions.csv")))
print(json.dumps({"Score": sum(float(r["v"]) for r in rows)}))
"""
PYTHON_TASK = """\
id: fileTask
description: Write out/predictions.csv with the columns n and v, one row for each n of 1, 2 and 3.
task_entrypoint: PythonSubmissionTasks
training_timeout: 60
starter_code: [files/evaluate.py]
evaluation_paths: [evaluate.py]
baseline_scores: [{Score: 0.0}]
requirements: []
submission:
  file: out/predictions.csv
  id_column: n
  rows: 3
  columns: {n: integer, v: {type: number, min: 0, max: 1}}
"""
PLACES = {
    # the agent's command, what the check says
    "a folder": ("mkdir -p out/predictions.csv", "file: out/predictions.csv is a folder"),
    "a FIFO": ("mkdir out && mkfifo out/predictions.csv", "file: there is no plain file out/predictions.csv"),
    "nothing": ("mkdir out", "file: there is no plain file out/predictions.csv"),
    "a folder link above it": ("mkdir real && printf 'n,v\\n1,1\\n2,1\\n3,1\\n' > real/predictions.csv && "
                               "ln -s real out", "file: out is a symbolic link"),
}


def test_the_check_reads_only_a_plain_file_at_the_schemas_path(tmp_path):
    """In a task whose evaluator reads a file of the schema's choosing (here a Python task's out/predictions.csv),
    the check opens it without following a link at any step, and only as a plain file."""
    write(tmp_path / "files/evaluate.py", PYTHON_EVALUATE)
    write(tmp_path / "file.yaml", PYTHON_TASK)
    env = open_backend(load_task_yaml(tmp_path / "file.yaml"))
    try:
        for case, (command, message) in PLACES.items():
            env.reset(seed=SEED)
            output, code = status(env, command)
            assert code == 0, (case, output)
            observation, info, reward = evaluate(env)
            assert info[EVALUATION_STATUS_KEY] == INVALID_SUBMISSION and not info["score"], (case, observation)
            assert message in observation and reward == failure_reward(env.spec), (case, observation)
        env.reset(seed=SEED)
        write_file(env, "out/predictions.csv", "n,v\n1,0.5\n2,0.5\n3,1\n")
        observation, info, _ = evaluate(env)
        assert info["score"] == [{"Score": 2.0}], observation
    finally:
        env.close()


@pytest.mark.parametrize(("change", "message"), [
    ({"columns": {"key": "float"}}, "column 'key': type 'float' is not one of text, number, integer"),
    ({"colums": {"key": "text"}}, "unknown key 'colums'; did you mean 'columns'?"),
    ({"id_column": "id"}, "id_column 'id' is none of the columns (key, label, weight); add it to columns"),
    ({"rows_from": "../answers.csv"}, "rows_from must be a path inside the workspace"),
    ({"file": "out.csv"}, "file 'out.csv', but a CSVSubmissionTasks evaluator is given submission.csv; set file: "
                          "submission.csv"),
    ({"columns": {"key": "text", "weight": {"type": "number", "min": 2, "max": 1}}},
     "column 'weight': min 2 is above max 1"),
], ids=["type", "misspelt-key", "id-column", "outside-path", "file", "bounds"])
def test_a_malformed_schema_is_refused_at_load(tmp_path, change, message, capsys):
    import yaml

    data = yaml.safe_load(AUTHOR_TASK)
    data["submission"] = {key: value for key, value in {**data["submission"], **change}.items()
                          if not (key == "columns" and "colums" in change)}
    path = tmp_path / "labels.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidTaskError) as caught:
        load_task_yaml(path)
    assert f"task 'labelsTask': submission: {message}" in str(caught.value), caught.value
    assert "docs/tasks.md" in str(caught.value)
    assert cli_main(["check", str(path), "--runs", "1"]) != 0  # the CLI refuses it too, with the same words
    shown = capsys.readouterr()
    assert message in shown.out + shown.err


@pytest.mark.slow  # two backends, each running the baseline: ~6 s
def test_house_regression_declares_its_schema_and_its_baseline_still_scores():
    spec = registry.spec("houseRegression")
    schema = submission_schema(spec)
    assert schema is not None and schema.rows_from == "data/answer.csv" and schema.id_column == "Id"
    scores = []
    for variant in (spec, spec.replace(submission=None)):
        env = open_backend(variant, validation_rows="all")  # the baseline's score is over every row
        try:
            output, code = status(env, "python baseline.py")
            assert code == 0, output
            observation, info, _ = evaluate(env)
            assert info[EVALUATION_STATUS_KEY] == "ok", observation
            scores.append(info["score"][-1])
            if variant is spec:
                run(env, "python -c \"import csv; r = list(csv.reader(open('submission.csv'))); r[1][1] = '1e308'; "
                    "csv.writer(open('submission.csv', 'w', newline='')).writerows(r)\"")
                assert "Price '1e308' is outside" in assert_rejected(env, "values")
        finally:
            env.close()
    assert scores[0] == scores[1]


def test_the_schema_survives_the_spec_round_trip(spec):
    again = type(spec).from_dict(spec.to_dict())
    assert again.submission == spec.submission and submission_schema(again) == submission_schema(spec)
    assert "\nsubmission:" not in TASK  # the checkout's task file declares none: the overlay does
