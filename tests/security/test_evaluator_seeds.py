"""Every evaluator we ship or overlay draws its randomness from the evaluation seed: two seeds score different
episodes, one seed the same, and nothing fixed in the evaluator lets the agent replay its test episodes offline.

MLGym's RL evaluation rolls out from the keys 0 to 4 in every evaluation; our overlay's (``tasks/data/rl``) draws its
rollout seeds from ``MLGYM_REGISTRY_EVAL_SEED``. jax and gymnax are not installed on every test machine, so the
overlay's real evaluator program runs here over stand-ins of the two (numpy, a few lines each) whose episode returns
are the reset keys the evaluator gives them: the returns are then exactly the episodes the evaluator chose.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlgym_registry.seeding import EVALUATION_SEED_VARIABLE

from .helpers import PACKAGE_TASK_DATA

pytestmark = pytest.mark.security

RL_DATA = PACKAGE_TASK_DATA / "rl"

STAND_INS = {
    "jax/__init__.py": """\
        import numpy as np

        from . import numpy, random  # noqa: F401 - jax.numpy and jax.random


        def jit(function):
            return function


        def vmap(function, in_axes):
            def batched(*args):
                size = len(next(arg for arg, axis in zip(args, in_axes) if axis == 0))
                rows = [function(*[arg[i] if axis == 0 else arg for arg, axis in zip(args, in_axes)])
                        for i in range(size)]
                return tuple(np.stack([np.asarray(part) for part in parts]) for parts in zip(*rows))

            return batched
        """,
    "jax/numpy.py": "from numpy import asarray  # noqa: F401\n",
    "jax/random.py": """\
        import numpy as np


        def PRNGKey(seed):
            return np.array([0, int(seed) % 2**32], dtype=np.uint32)


        def split(key, num=2):
            words = [int(word) for word in np.asarray(key).ravel()]
            return np.random.default_rng(words).integers(0, 2**32, size=(num, 2), dtype=np.uint32)
        """,
    # each environment's episode pays, in one step, a number drawn from the key it was reset with
    "gymnax/__init__.py": """\
        import numpy as np


        class Discrete:
            n = 3


        class Env:
            def action_space(self, params):
                return Discrete()

            def reset(self, key, params):
                start = float(np.asarray(key)[1] % 100_003)
                return np.array([start], np.float32), np.array([start])

            def step(self, key, state, action, params):
                return np.array([0.0], np.float32), state, float(state[0]), True, 0


        def make(name):
            return Env(), None
        """,
    # the agent's side: the overlay's rl_policy.py loads a network with jax; this one always answers action 0
    "rl_policy.py": """\
        def load(config_fname, checkpoint):
            pass


        def act(data, shape, dtype):
            return [0] * shape[0]
        """,
}


@pytest.fixture(scope="module")
def rl_workspace(tmp_path_factory) -> Path:
    """The overlay's evaluator of rlMetaMazeMisc with its driver, the stand-ins, and 5 checkpoints."""
    folder = tmp_path_factory.mktemp("rl")
    (folder / "evaluate.py").write_text((RL_DATA / "rlMetaMazeMisc" / "evaluate.py").read_text())
    for name in ("rl_gymnax.py", "rl_driver.py"):
        (folder / name).write_text((RL_DATA / name).read_text())
    for name, text in STAND_INS.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))
    (folder / "checkpoints").mkdir()
    for index in range(5):
        (folder / "checkpoints" / f"config-{index}.pkl").write_bytes(b"")
    return folder


def rl_score(folder: Path, seed: int | None) -> dict[str, float]:
    """The evaluator's metrics with ``seed`` as the evaluation seed (unset when None)."""
    env = {key: value for key, value in os.environ.items() if key != EVALUATION_SEED_VARIABLE}
    if seed is not None:
        env[EVALUATION_SEED_VARIABLE] = str(seed)
    done = subprocess.run([sys.executable, "evaluate.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_rl_overlays_episodes_follow_the_evaluation_seed(rl_workspace):
    first, again = rl_score(rl_workspace, 7), rl_score(rl_workspace, 7)
    assert first == again
    others = [rl_score(rl_workspace, seed) for seed in (8, 2**63 + 5)]
    assert all(other != first for other in others) and others[0] != others[1]


def test_the_rl_overlay_does_not_roll_out_mlgyms_fixed_keys(rl_workspace):
    """MLGym's evaluation resets from PRNGKey(0..4) whatever the seed; ours never comes back to those episodes."""
    fixed = rl_score_of_keys(rl_workspace, range(5))
    assert all(rl_score(rl_workspace, seed) != fixed for seed in (0, 1, 4))
    assert rl_score(rl_workspace, None) != rl_score(rl_workspace, None)  # unseeded: fresh episodes every time


def rl_score_of_keys(folder: Path, seeds) -> dict[str, float]:
    """The metrics the evaluator would give had it rolled out from ``seeds`` (MLGym's way)."""
    script = ("import json, sys, rl_driver\nrl_driver.rollout_seeds = lambda count: " + repr(list(seeds)) +
              "\nsys.argv = ['evaluate.py']\nimport rl_gymnax\nrl_gymnax.main('MetaMaze-misc', max_frames=199)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_malformed_evaluation_seed_is_a_clear_failure(rl_workspace):
    env = {**os.environ, EVALUATION_SEED_VARIABLE: "seven"}
    done = subprocess.run([sys.executable, "evaluate.py"], cwd=rl_workspace, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 1
    assert f"Evaluation failed: {EVALUATION_SEED_VARIABLE} must be an integer, got 'seven'" in done.stderr


RANDOMNESS = re.compile(r"\bimport random\b|np\.random|numpy\.random|jax\.random|default_rng|secrets\.")


def evaluator_sources(evaluator: Path) -> str:
    """The evaluator's text with the text of every module of the package's task data it imports, directly or through
    another (from its folder or its parent's), so that a helper's randomness counts as the evaluator's."""
    seen, pending, text = {evaluator}, [evaluator], ""
    while pending:
        source = pending.pop()
        text += source.read_text()
        for name in re.findall(r"^\s*(?:import|from)\s+(\w+)", source.read_text(), flags=re.M):
            for folder in (evaluator.parent, evaluator.parent.parent):
                module = folder / f"{name}.py"
                if module.is_file() and module not in seen:
                    seen.add(module)
                    pending.append(module)
    return text


@pytest.mark.parametrize("evaluator", sorted(PACKAGE_TASK_DATA.rglob("evaluate.py")),
                         ids=lambda path: str(path.relative_to(PACKAGE_TASK_DATA)))
def test_every_shipped_evaluator_that_draws_randomness_reads_the_evaluation_seed(evaluator):
    text = evaluator_sources(evaluator)
    if RANDOMNESS.search(text):
        assert EVALUATION_SEED_VARIABLE in text, f"{evaluator} draws randomness but never reads the evaluation seed"
        assert "PRNGKey(seed)" not in text or "rollout_seeds" in text
