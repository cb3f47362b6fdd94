"""Stage 3, reset module: installs the tools in the fresh session and starts the conversation with the system message.

The base env has already reset the backend (workspace and session). This stage does what MLGym's agent does after
``reset()``: define the ``state`` command, the tool commands and their env variables (``backend.install_tools()``),
then format the template set's ``system_template`` with ``command_docs``, the env variables and the task fields.
"""

from __future__ import annotations

from tensordict import TensorDictBase
from torchrl.data import Composite

from .base import ChainTransform
from .history import history_from, history_spec, message
from .layout import set_entry, set_spec


class ResetModule(ChainTransform):
    """Writes ``history`` (``conversation`` when a history processor is on) = [system message] at reset."""

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        base = self.base
        base.tools = base.backend.install_tools()
        base.fields = None
        system = self.render_template(self.templates.system_template, self.template_fields(), what="system_template")
        set_entry(tensordict_reset, self.layout.stored_history,
                  history_from([message("system", system, base.device)]))
        return tensordict_reset

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        set_spec(observation_spec, self.layout.stored_history, history_spec(observation_spec.device))
        return observation_spec
