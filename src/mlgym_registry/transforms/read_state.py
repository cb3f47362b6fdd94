"""Stage 5, read state: the backend's ``state`` command output (a JSON string) after reset and after each step.

The state command runs in the agent's own shell, so whatever the agent left there can print around its JSON line:
``set -x`` traces, a ``trap ... DEBUG``, a background job's messages. The state is therefore the last line of the
output that is a JSON object with the state's keys; when there is none (or the command times out) the step goes on
with the previous state (a fallback one on reset), and the transform warns once and counts it.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

from tensordict import TensorDictBase
from torchrl.data import Composite, NonTensor

from .. import bounded_json
from .base import ChainTransform, is_retry, text_of
from .layout import Layout

STATE_KEYS = ("open_file", "working_dir")
"""The keys every backend's state JSON has (MLGym's ``state`` command)."""

# a "\xNN" that the output's backslashreplace decoding made of a byte that is not UTF-8 (a JSON string has its own
# backslashes doubled, so such a backslash is the odd one of its run)
_UNDECODED_BYTE = re.compile(r"(?<!\\)((?:\\\\)*)\\(x[0-9a-f]{2})")


def _state_object(line: str) -> dict[str, Any] | None:
    try:
        fields = bounded_json.loads(line)  # a state nested too deep is unreadable, not a RecursionError
    except ValueError:
        return None
    if isinstance(fields, dict) and all(key in fields for key in STATE_KEYS):
        return fields
    return None


def parse_state(output: str) -> str | None:
    """The state JSON in the state command's ``output``: its last line that is a JSON object with ``STATE_KEYS``.

    The line is returned as it is, except that a byte of a path that is not UTF-8, which the backend's decoding shows
    as ``\\xNN``, is kept as that text with its backslash escaped. None when no line is a state.
    """
    for line in reversed(output.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        if _state_object(line) is not None:
            return line
        repaired = _UNDECODED_BYTE.sub(r"\1\\\\\2", line)
        if repaired != line and _state_object(repaired) is not None:
            return repaired
    return None


class ReadState(ChainTransform):
    """Writes ``state``. A retry step did not touch the session, and a finished episode has nothing left to
    show, so both keep the previous state instead of asking the backend again.

    ``unread`` counts the reads that found no state in the command's output (or timed out); the first one warns.
    """

    def __init__(self, layout: Layout, **kwargs: Any):
        super().__init__(layout, **kwargs)
        self.unread = 0

    def _read(self, previous: str | None) -> str:
        """The backend's state, or ``previous`` (else the fallback state) when it cannot be read."""
        base = self.base
        command = base.tools.state_command if base.tools is not None else "state"
        try:
            output = str(base.backend.communicate(command))
        except TimeoutError as exc:  # the local backend's CommandTimeout: the session is busy (a fork bomb, say)
            output = f"the state command timed out: {exc}"
        state = parse_state(output)
        if state is not None:
            return state
        self.unread += 1
        if self.unread == 1:
            warnings.warn(
                f"the backend's state command printed no state JSON line (a JSON object with "
                f"{' and '.join(STATE_KEYS)}), so the step keeps the previous state; it printed {output[-500:]!r}",
                RuntimeWarning,
                stacklevel=2,
            )
        return previous if previous is not None else self._fallback()

    def _fallback(self) -> str:
        workspace = getattr(self.base.backend, "task_workspace", "/")
        return json.dumps({"open_file": "n/a", "working_dir": str(workspace)}, ensure_ascii=False)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set(self.layout.state, self._read(None))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        previous = tensordict.get(self.layout.state, None)
        if previous is not None and not isinstance(previous, str):
            previous = text_of(previous)
        done = bool(next_tensordict.get("done").any())
        if previous is not None and (done or is_retry(tensordict, self.layout)):
            state = previous
        else:
            state = self._read(previous)
        next_tensordict.set(self.layout.state, state)
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec[self.layout.state] = NonTensor(
            example_data='{"open_file": "n/a", "working_dir": "/"}', shape=(), device=observation_spec.device
        )
        return observation_spec
