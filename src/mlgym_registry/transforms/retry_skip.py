"""Stage 1, retry skip: a malformed response does not reach the backend.

TorchRL's reference uses ``ConditionalSkip``, which crashes as soon as the tensordict carries a ``History``
(reference bug #3). Here the skip happens in ``BackendEnv._step`` (it does not step the backend when ``retry`` is
set); this stage owns the ``retry`` entry itself: False after reset, and on each step whether that step was a retry,
so the conversation goes on (format-error message, penalty) instead of repeating the last observation.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.data import Categorical, Composite

from .base import ChainTransform, is_retry


class RetrySkip(ChainTransform):
    """Writes ``retry`` (bool): whether the step that produced this observation skipped the backend."""

    def _flag(self, value: bool) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.bool, device=self.parent.device if self.parent else None)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set(self.layout.retry, self._flag(False))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(self.layout.retry, self._flag(is_retry(tensordict, self.layout)))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[self.layout.retry] = Categorical(
            2, shape=(), dtype=torch.bool, device=observation_spec.device
        )
        return observation_spec
