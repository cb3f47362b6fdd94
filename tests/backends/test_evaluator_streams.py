"""An evaluator's standard error is never read as its metrics: a library's warning or progress bar beside the JSON
line on standard output scores as usual, and a failed evaluation shows both streams to the agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.scores import EVALUATION_STATUS_KEY
from mlgym_registry.specs import TaskSpec

NOISY_EVALUATOR = '''
import json, sys, warnings
warnings.warn("this function is deprecated", DeprecationWarning, stacklevel=1)
warnings.warn("and so is this one", FutureWarning)
for done in range(0, 101, 25):
    sys.stderr.write(f"\\rscoring: {done}%")
sys.stderr.flush()
answer = open("answer.txt").read().strip()
if answer == "crash":
    raise RuntimeError("the evaluator cannot read this answer")
print(json.dumps({"Score": float(len(answer))}))
'''


def noisy_task(folder: Path) -> TaskSpec:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(NOISY_EVALUATOR)
    (folder / "answer.txt").write_text("abc\n")
    return TaskSpec(id="noisyEvaluator", task_entrypoint="PythonSubmissionTasks", training_timeout=60,
                    starter_code=["evaluate.py", "answer.txt"], evaluation_paths=["evaluate.py"],
                    evaluation_read_only=True, root=str(folder), baseline_scores=[{"Score": 3.0}])


@pytest.fixture
def backend(tmp_path):
    env = LocalBackend(noisy_task(tmp_path / "task"), seed=0)
    env.reset()
    env.install_tools()
    yield env
    env.close()


def test_warnings_and_progress_on_stderr_leave_the_metrics_readable(backend):
    obs, _, _, info = backend.step("validate")
    assert info[EVALUATION_STATUS_KEY] == "ok", obs
    assert info["score"] == [{"Score": 3.0}]
    assert "deprecated" not in obs and "scoring:" not in obs


def test_a_failed_evaluation_shows_what_it_wrote_on_stderr(backend):
    backend.communicate("echo crash > answer.txt")
    obs, _, _, info = backend.step("validate")
    assert info[EVALUATION_STATUS_KEY] != "ok"
    assert "the evaluator cannot read this answer" in obs, obs
