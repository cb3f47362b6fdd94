"""Stage 4, task sampler (``tasks=[...]`` only): picks the task of each episode and writes it as ``task``.

The choice comes from the env's seeded generator (``env.set_seed(seed)`` makes the sequence reproducible); the base
env swaps to that task's backend and components at reset and closes the previous backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensordict import TensorDict, TensorDictBase
from torchrl.data import Composite, NonTensor

from .base import ChainTransform
from .layout import Layout


class TaskSampler(ChainTransform):
    """Samples one of ``tasks`` on every reset; ``task`` is in every observation of the episode."""

    def __init__(self, layout: Layout, tasks: Sequence[str]):
        super().__init__(layout)
        if not tasks:
            raise ValueError("TaskSampler needs at least one task")
        self.tasks = list(tasks)
        self._current: str | None = None

    def _reset_env_preprocess(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        if tensordict is None:
            tensordict = TensorDict(batch_size=())
        index = int(self.base.task_rng.integers(len(self.tasks)))
        self._current = self.tasks[index]
        tensordict.set(self.layout.task, self._current)
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set(self.layout.task, self.base.task_name)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(self.layout.task, self.base.task_name)
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[self.layout.task] = NonTensor(
            example_data=self.tasks[0], shape=(), device=observation_spec.device
        )
        return observation_spec
