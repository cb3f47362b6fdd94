"""An evaluator that draws from Python's or numpy's global generator without reading the evaluation seed (as MLGym's
game evaluators do with ``random``) still follows the seed: the harness seeds both from it, so the draws are the same
for the same seed and differ for another, and the agent, who never sees the seed, cannot predict them."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlgym_registry import seeding
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.local.harness import harness
from mlgym_registry.specs import TaskSpec

pytestmark = pytest.mark.security

UNSEEDED_EVALUATOR = '''
import json, random
import numpy
print(json.dumps({"Score": random.random(), "numpy": float(numpy.random.rand())}))
'''


def unseeded_task(folder: Path) -> TaskSpec:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(UNSEEDED_EVALUATOR)
    return TaskSpec(id="unseededEvaluator", task_entrypoint="PythonSubmissionTasks", training_timeout=60,
                    starter_code=["evaluate.py"], evaluation_paths=["evaluate.py"], evaluation_read_only=True,
                    root=str(folder), requirements=["numpy"], baseline_scores=[{"Score": 0.5}],
                    extra={"priority_metric": "Score"})


def draws(env: LocalBackend) -> dict:
    obs, _, _, info = env.step("validate")
    assert info["evaluation_status"] == "ok", obs
    return info["score"][-1]


def test_the_evaluators_global_generators_follow_the_evaluation_seed(tmp_path):
    env = LocalBackend(unseeded_task(tmp_path / "task"))
    try:
        env.reset(options={"evaluation_seed": 1})
        env.install_tools()
        first = draws(env)
        assert draws(env) == first  # the second evaluation preloads numpy: seeded all the same
        env.reset(options={"evaluation_seed": 1})
        assert draws(env) == first
        env.reset(options={"evaluation_seed": 2})
        other = draws(env)
        assert other["Score"] != first["Score"] and other["numpy"] != first["numpy"]
    finally:
        env.close()


def test_the_harness_reads_the_packages_seed_variable():
    assert harness.EVALUATION_SEED_VARIABLE == seeding.EVALUATION_SEED_VARIABLE
