"""Stage 5, read state: the backend's ``state`` command output (a JSON string) after reset and after each step."""

from __future__ import annotations

from tensordict import TensorDictBase
from torchrl.data import Composite, NonTensor

from .base import ChainTransform, is_retry


class ReadState(ChainTransform):
    """Writes ``state``. A retry step did not touch the session, and a finished episode has nothing left to
    show, so both keep the previous state instead of asking the backend again."""

    def _read(self) -> str:
        base = self.base
        command = base.tools.state_command if base.tools is not None else "state"
        return str(base.backend.communicate(command))

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set(self.layout.state, self._read())
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        previous = tensordict.get(self.layout.state, None)
        done = bool(next_tensordict.get("done").any())
        if previous is not None and (done or is_retry(tensordict, self.layout)):
            state = previous if isinstance(previous, str) else str(getattr(previous, "data", previous))
        else:
            state = self._read()
        next_tensordict.set(self.layout.state, state)
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[self.layout.state] = NonTensor(
            example_data='{"open_file": "n/a", "working_dir": "/"}', shape=(), device=observation_spec.device
        )
        return observation_spec
