"""Model-submission tasks: the agent's model code runs in its own sandboxed process and only its predictions cross to
the pristine evaluator, which computes the metric; a task whose evaluator must run the agent's code itself is refused
unless the user trusts that code."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import fresh_registry as fresh

from mlgym_registry import TaskSpec
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.protocol import EVALUATION_STATUS_KEY
from mlgym_registry.errors import BackendUnavailable

INPUTS = [0.0, 1.0, 2.0, 3.0]
ANSWERS = [1.0, 3.0, 5.0, 7.0]  # y = 2x + 1

# pristine: loads the agent's model through its own functions, scores its predictions against the hidden answers
EVALUATE = """\
import argparse, json
import model

parser = argparse.ArgumentParser()
parser.add_argument("--config_fname")
config = parser.parse_args().config_fname
model.load(config)
answers = json.load(open("data/answers.json"))
predictions = model.predict(answers["inputs"])
errors = [(float(p) - y) ** 2 for p, y in zip(predictions, answers["outputs"])]
print(json.dumps({"Score": -sum(errors) / len(errors)}))
"""

# the agent's starter model: reads its weights from the file the config names
MODEL = """\
import json
import yaml_free_config

weights = {"a": 0.0, "b": 0.0}


def load(config_path):
    weights.update(json.load(open(yaml_free_config.weights_file(config_path))))


def predict(xs):
    return [weights["a"] * x + weights["b"] for x in xs]
"""

CONFIG_READER = """\
def weights_file(config_path):
    for line in open(config_path):
        key, _, value = line.partition(":")
        if key.strip() == "weights":
            return value.strip()
    raise ValueError("no weights in the config")
"""


def model_task(tmp_path: Path, **extra) -> TaskSpec:
    source = tmp_path / "task"
    (source / "data").mkdir(parents=True)
    files = {"evaluate.py": EVALUATE, "model.py": MODEL, "yaml_free_config.py": CONFIG_READER,
             "config.yaml": "weights: weights.json\n", "weights.json": json.dumps({"a": 0.0, "b": 0.0})}
    for name, text in files.items():
        (source / name).write_text(textwrap.dedent(text))
    (source / "data" / "answers.json").write_text(json.dumps({"inputs": INPUTS, "outputs": ANSWERS}))
    return TaskSpec(
        id="lineModel", task_entrypoint="ModelSubmissionTasks", training_timeout=60,
        starter_code=list(files), evaluation_paths=["evaluate.py"], evaluation_read_only=True,
        datasets=[{"name": "answers", "description": "", "data_path": "data", "is_local": True}],
        secret_files=["data/answers.json"], baseline_scores=[{"Score": -21.0}], root=str(source), extra=extra,
    )


def validate(backend: LocalBackend) -> tuple[str, dict | None]:
    observation, _, _, info = backend.step("validate")
    scores = info.get("score") or []
    return str(observation), (dict(scores[-1]) if info.get(EVALUATION_STATUS_KEY) == "ok" else None)


@pytest.fixture(autouse=True)
def no_data_folders(tmp_path, monkeypatch):
    """Data folders are searched before a task's own folder: this machine's default one (where a prepared task's
    data lies under data/...) must not stand in for these tasks' data/."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MLGYM_REGISTRY_DATA", raising=False)


@pytest.fixture
def backend(tmp_path):
    env = LocalBackend(model_task(tmp_path), seed=0)
    env.reset()
    env.install_tools()
    yield env
    env.close()


def test_the_evaluator_scores_the_predictions_of_the_agents_model(backend):
    observation, score = validate(backend)
    assert score == {"Score": pytest.approx(-21.0)}, observation  # the zero model: (1 + 9 + 25 + 49) / 4
    backend.communicate("""printf '{"a": 2.0, "b": 1.0}' > weights.json""")
    observation, score = validate(backend)
    assert score == {"Score": pytest.approx(0.0)}, observation


PRINTER = '''\
import os, sys

# what a model in the evaluator's process could print before the real metrics, and the answers it could read
print('{"Score": 1000.0}')
os.write(1, b'{"Score": 1000.0}\\n')
sys.stdout.write('{"Score": 1000.0}\\n')
try:
    GUESS = 1000.0 if open("data/answers.json").read() else 0.5
except OSError:
    GUESS = 0.5


def load(config_path):
    return None


def predict(xs):
    return [GUESS for _ in xs]
'''

PATCHER = '''\
import builtins, json

# what a model in the evaluator's process could rebind to change what the evaluator computes
json.dumps = lambda *args, **kwargs: '{"Score": 1000.0}'
json.load = lambda *args, **kwargs: {"inputs": [0.0], "outputs": [0.0]}
builtins.zip = lambda *args: []
builtins.sum = lambda *args: 0.0


def load(config_path):
    return None


def predict(xs):
    return [0.5 for _ in xs]
'''


def replace_model(backend: LocalBackend, text: str) -> None:
    backend.communicate(f"cat > model.py << 'EOF'\n{text}EOF")


def test_a_model_that_prints_scores_or_reads_answers_changes_nothing_but_its_predictions(backend):
    replace_model(backend, PRINTER)
    observation, score = validate(backend)
    honest = -sum((0.5 - y) ** 2 for y in ANSWERS) / len(ANSWERS)  # it could not read the answers: it guessed 0.5
    assert score == {"Score": pytest.approx(honest)}, observation
    assert "1000" not in observation


def test_a_model_that_rebinds_the_evaluators_functions_breaks_only_its_own_process(backend):
    replace_model(backend, PATCHER)
    observation, _, _, info = backend.step("validate")
    assert info[EVALUATION_STATUS_KEY] in ("ok", "agent_error"), observation
    assert all(score["Score"] <= 0 for score in info["score"]), info["score"]
    assert "1000" not in observation


def test_a_model_whose_predictions_cannot_cross_is_the_agents_failure(backend):
    backend.communicate("""cat >> model.py << 'EOF'

def predict(xs):
    return object()
EOF""")
    _, _, _, info = backend.step("validate")
    assert info[EVALUATION_STATUS_KEY] == "agent_error" and info["score"] == []


def test_an_evaluator_that_runs_the_agents_code_itself_is_refused_unless_trusted(tmp_path):
    spec = model_task(tmp_path, agent_code_in_evaluator=True)
    with pytest.raises(BackendUnavailable, match="agent_code_in_evaluator.*trust_agent_code=True"):
        LocalBackend(spec)
    with pytest.raises(BackendUnavailable, match="trust_agent_code"):
        fresh().make(spec)
    with LocalBackend(spec, trust_agent_code=True) as env:
        env.reset()
        env.install_tools()
        env.communicate("""printf '{"a": 2.0, "b": 1.0}' > weights.json""")
        observation, score = validate(env)
        assert score == {"Score": pytest.approx(0.0)}, observation
