"""The GRPO group key: ``query`` names the task an episode plays, the same in every env and worker that plays it.

TorchRL's ``MCAdvantage`` groups trajectories by ``query`` (its default ``prompt_key``); ``ChatEnv`` fills it with the
dataset's prompt. An MLGym task's first prompt is fixed by the task, so the task's id is the group: episodes of one
task form a group wherever they ran, episodes of different tasks never mix. It is written at reset and carried on
every step, so any step of a trajectory tells its group.
"""

from __future__ import annotations

from tensordict import TensorDictBase
from torchrl.data import Composite, NonTensor

from .base import ChainTransform


class GroupKey(ChainTransform):
    """Writes ``query`` = the current task's id."""

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set(self.layout.query, self.base.task_name)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(self.layout.query, self.base.task_name)
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[self.layout.query] = NonTensor(
            example_data="prisonersDilemma", shape=(), device=observation_spec.device
        )
        return observation_spec
