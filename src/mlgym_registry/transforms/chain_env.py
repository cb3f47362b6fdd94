"""``ChainEnv``: the env ``registry.make`` returns, TorchRL's ``TransformedEnv`` with one guard of ours."""

from __future__ import annotations

from tensordict import TensorDictBase
from torchrl.envs import TransformedEnv

from .base import refuse_stepped


class ChainEnv(TransformedEnv):
    """TorchRL's ``TransformedEnv`` over the chain, refusing a tensordict that was already stepped before anything
    runs (``EnvMisuseError`` naming ``env.step_mdp``): without it the backend runs the command, and tensordict then
    fails with an error about lazy batch sizes."""

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``TransformedEnv.step``, after checking that ``tensordict`` is a step's input, not its output."""
        refuse_stepped(tensordict)
        return super().step(tensordict)
