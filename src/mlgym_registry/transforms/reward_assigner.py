"""Stage 9, reward assigner: the reward of a step from that step's own observation and info.

The reward component reads validate observations and the final ``info["score"]`` (MLGym prints the submission score
nowhere: reference bug #9); here it gets the observation and info the backend returned on this very step. Its value
must be a finite number and the info must come back unchanged (``output_checks``: ``ComponentOutputError``).
"""

from __future__ import annotations

from tensordict import TensorDictBase

from ..components.output_checks import call_reward
from .base import ChainTransform, is_retry, text_of


class RewardAssigner(ChainTransform):
    """Adds ``reward(observation, info, spec)`` to ``reward``. A retry step only carries the isolator's penalty,
    unless it ends the episode (the env's turn cap): the reward then pays how the episode ended."""

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        base = self.base
        if is_retry(tensordict, self.layout) and base.stop_reason is None:
            return next_tensordict
        info = base.last_info
        if info is None:
            return next_tensordict
        observation = next_tensordict.get(self.layout.observation, None)
        observation = text_of(observation)
        value = call_reward(base.task, observation, info)  # a finite float, info unchanged (output_checks)
        reward = next_tensordict.get(self.layout.reward)
        next_tensordict.set(self.layout.reward, reward + value)
        return next_tensordict
