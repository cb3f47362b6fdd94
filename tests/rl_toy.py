"""A tiny RL task of the same shape as MLGym's gymnax tasks, for the tests: no jax, a numpy environment.

``LineWorld``: each of 16 environments puts a point and a goal on [-1, 1]; an action (one float, clipped to [-1, 1])
moves the point by a quarter of it; reaching the goal (within 0.05) pays 1 and ends the episode, every other step
costs a hundredth of the distance. No return can exceed 1. The evaluator (``evaluate.py``) steps it in its own
process with the package's ``rl_driver``, seeded from the episode's evaluation seed, and asks the agent's side
(``toy_policy.py``, a pristine file declared in ``agent_side_files``) for each step's batch of actions; that side
loads the agent's network code (``src/linear.py``) and checkpoints (``checkpoints/config-*.pkl``, which the baseline
``src/train.py`` writes) where the agent's code runs.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import mlgym_registry
from mlgym_registry.specs import TaskSpec

RL_DATA = Path(mlgym_registry.__file__).resolve().parent / "tasks" / "data" / "rl"
NUM_ENVS, SEEDS, MAX_FRAMES = 16, 3, 30

EVALUATE = textwrap.dedent(
    f"""\
    import argparse
    import json
    import os
    from pathlib import Path

    import numpy as np

    import rl_driver
    import toy_policy  # the agent's side

    NUM_ENVS, SEEDS, MAX_FRAMES = {NUM_ENVS}, {SEEDS}, {MAX_FRAMES}


    class LineWorld:
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)
            self.x = self.rng.uniform(-1, 1, NUM_ENVS)
            self.goal = self.rng.uniform(-1, 1, NUM_ENVS)

        def obs(self):
            return np.stack([self.x, self.goal], 1).astype(np.float32)

        def step(self, actions):
            self.x = np.clip(self.x + 0.25 * np.clip(actions[:, 0], -1.0, 1.0), -1.0, 1.0)
            distance = np.abs(self.x - self.goal)
            done = distance < 0.05
            reward = np.where(done, 1.0, -0.01 * distance)
            self.x = np.where(done, self.rng.uniform(-1, 1, NUM_ENVS), self.x)  # auto-reset, as gymnax does
            return self.obs(), reward, done


    parser = argparse.ArgumentParser()
    parser.add_argument("--config_fname", default="config.yaml")
    args, _ = parser.parse_known_args()
    checkpoints = sorted(Path("checkpoints").glob(Path(args.config_fname).stem + "*.pkl"))
    if not checkpoints:
        raise rl_driver.fail("no checkpoints/config*.pkl")
    base = int(os.environ.get("MLGYM_REGISTRY_EVAL_SEED", "0"))
    space = rl_driver.ActionSpace(shape=(1,))
    load, act = toy_policy.load, toy_policy.act
    returns = []
    for checkpoint in checkpoints:
        load(args.config_fname, str(checkpoint))
        for seed in range(SEEDS):
            world = LineWorld([base, seed])
            try:
                returns.append(rl_driver.rollout(world.obs(), world.step, act, space=space, num_envs=NUM_ENVS,
                                                 max_frames=MAX_FRAMES))
            except rl_driver.PolicyFailure as exc:
                raise rl_driver.fail(str(exc)) from None
    print(json.dumps(rl_driver.metrics(returns)))
    """
)

TOY_POLICY = textwrap.dedent(
    """\
    import pickle

    import numpy as np

    _POLICY = {}


    def load(config_fname, checkpoint):
        from src.linear import policy_from

        with open(checkpoint, "rb") as handle:
            _POLICY["act"] = policy_from(pickle.load(handle))


    def act(data, shape, dtype):
        obs = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape))
        actions = _POLICY["act"](obs)
        return actions.tolist() if isinstance(actions, np.ndarray) else actions
    """
)

LINEAR = textwrap.dedent(
    """\
    import numpy as np


    def policy_from(params):
        weights, bias = np.asarray(params["w"], float), np.asarray(params["b"], float)
        return lambda obs: obs @ weights + bias
    """
)

TRAIN = textwrap.dedent(
    """\
    import os
    import pickle
    import sys
    import time

    SECONDS = 0

    time.sleep(SECONDS)  # "training"
    os.makedirs("checkpoints", exist_ok=True)
    for seed in range(2):
        with open(f"checkpoints/config-{seed}.pkl", "wb") as handle:
            pickle.dump({"w": [[-4.0], [4.0]], "b": [0.0]}, handle)
    print("trained", file=sys.stderr)
    """
)


def toy_spec(folder: Path, *, training_timeout: int = 60, linear: str = LINEAR, train_seconds: float = 0
             ) -> TaskSpec:
    """The tiny RL task, its files written into ``folder``; the package's own ``rl_driver.py``."""
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(EVALUATE)
    (folder / "toy_policy.py").write_text(TOY_POLICY)
    (folder / "src" / "__init__.py").write_text("")
    (folder / "src" / "linear.py").write_text(linear)
    (folder / "src" / "train.py").write_text(TRAIN.replace("SECONDS = 0", f"SECONDS = {train_seconds}"))
    (folder / "config.yaml").write_text("train_config: {}\n")
    return TaskSpec(
        id="toyLineWorld", name="LineWorld", description="Train a linear policy; save checkpoints/config-*.pkl.",
        task_entrypoint="ModelSubmissionTasks", training_timeout=training_timeout,
        starter_code=["evaluate.py", str(RL_DATA / "rl_driver.py"), "toy_policy.py", "src", "config.yaml"],
        evaluation_paths=["evaluate.py"], evaluation_read_only=True, baseline_paths=["src/train.py"],
        protected_files=["rl_driver.py", "toy_policy.py"], baseline_scores=[{"Reward Mean": 0.9, "Reward Std": 0.1}],
        max_steps=20, root=str(folder), extra={"agent_side_files": ["toy_policy.py"], "priority_metric": "Reward Mean",
                                                 "baseline_command": "python src/train.py"},
    )
