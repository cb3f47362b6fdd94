"""A stand-in backend for tests and benchmarks: honours the MLGym env contract, costs nothing, runs nothing.

    backend = StandinBackend(spec, outputs=["file1  file2", ""], scores=[{"Score": 2.5}, {"Score": 2.6}])

- ``step(action)`` records ``action`` in ``actions`` and answers, in order of precedence:
  past ``max_steps`` -> autosubmission (``"Exited (max_steps)"``, done); ``submit`` -> ``"Exited (submit)"``, done,
  ``info["score"]`` gets the next score; ``validate`` -> MLGym's validation text with the baseline and the next score,
  ``info["score"]`` gets it; otherwise the next scripted output (``outputs``: strings, or one callable
  ``outputs(action) -> str``), then ``"ok"`` once the script runs out. Output that prints MLGym's markers
  (``<<VALIDATION||``, ``<<SUBMISSION||``) counts as validate/submit too, as in MLGym.
- ``communicate(cmd)`` records ``cmd`` in ``communicated``; the state command returns the state JSON.
- ``install_tools()`` returns a ``ToolSet`` (``command_docs``, ``env_variables``) and counts installs.
- ``resets``, ``closed`` and ``close_calls`` tell what the chain did with it.

Register it for ``registry.make`` with ``registry.register("backend", "standin", StandinBackend)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mlgym_registry.backends.protocol import ToolSet, new_info

COMMAND_DOCS = "open <path>:\n  opens a file\nvalidate:\n  scores the submission\nsubmit:\n  submits and ends"
"""The ``command_docs`` the stand-in's tools document."""


class StandinBackend:
    """A scripted MLGym-contract backend (see the module docstring)."""

    def __init__(
        self,
        spec: Any = None,
        *,
        outputs: Sequence[str] | Callable[[str], str] | None = None,
        scores: Sequence[dict[str, float]] | None = None,
        max_steps: int | None = None,
        command_docs: str = COMMAND_DOCS,
        env_variables: dict[str, str] | None = None,
        workspace: str = "/home/agent/workspace",
        submission: str = "target.py",
    ):
        self.spec = spec
        self.outputs = outputs if callable(outputs) else list(outputs or [])
        self.scores = [dict(s) for s in (scores or [])]
        self.max_steps = max_steps if max_steps is not None else getattr(spec, "max_steps", 50)
        self.command_docs = command_docs
        self.env_variables = dict(env_variables if env_variables is not None else {"WINDOW": "100"})
        self.task_workspace = Path(workspace)
        self.submission = f"{workspace}/{submission}"
        self.task = SimpleNamespace(args=spec if spec is not None else SimpleNamespace(id="standin", description=""))
        self.current_step = 0
        self.returncode: int | None = 0
        self.actions: list[str] = []
        self.communicated: list[str] = []
        self.added_commands: list[dict[str, str]] = []
        self.resets = 0
        self.tools_installed = 0
        self.closed = False
        self.close_calls = 0
        self.open_file = "n/a"
        self._script_index = 0
        self._score_index = 0
        self._info = new_info()

    # -- contract ------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new episode."""
        self.resets += 1
        self.current_step = 0
        self.closed = False
        self._info = new_info()
        return {"observation": None}, {}

    def install_tools(self) -> ToolSet:
        """The tools' docs and variables (nothing is installed anywhere)."""
        self.tools_installed += 1
        return ToolSet(command_docs=self.command_docs, env_variables=dict(self.env_variables), state_command="state")

    def step(self, action: str) -> tuple[str | None, float, bool, dict[str, Any]]:
        """Record ``action`` and answer from the script (see the module docstring)."""
        self.actions.append(action)
        self.current_step += 1
        info = self._info
        if self.current_step > self.max_steps:
            return self._evaluate(info, "max_steps")
        command = action.strip()
        if command == "submit":
            return self._evaluate(info, "submit")
        if command == "validate":
            return self._evaluate(info, "validate")
        output = self._next_output(action)
        if "<<VALIDATION||" in output:
            return self._evaluate(info, "validate")
        if "<<SUBMISSION||" in output:
            return self._evaluate(info, "submit")
        return output, 0.0, False, info

    def communicate(
        self, input: str, timeout_duration: float = 25, no_output_timeout_duration: float | None = None
    ) -> str:
        """Record ``input``; the state command prints the state JSON, anything else prints nothing."""
        self.communicated.append(input)
        self.returncode = 0
        if input.strip() == "state":
            return json.dumps({"open_file": self.open_file, "working_dir": str(self.task_workspace)})
        return ""

    def add_commands(self, commands: list[dict[str, str]]) -> None:
        """Record tool files."""
        self.added_commands.extend(commands)

    def close(self) -> None:
        """Mark closed (may be called more than once)."""
        self.closed = True
        self.close_calls += 1

    # -- helpers -------------------------------------------------------------------------------------------------
    @property
    def baseline(self) -> dict[str, float] | None:
        """The spec's first baseline score dict."""
        scores = getattr(self.spec, "baseline_scores", None) or []
        return scores[0] if scores else None

    def _next_output(self, action: str) -> str:
        if callable(self.outputs):
            return self.outputs(action)
        if self._script_index < len(self.outputs):
            self._script_index += 1
            return self.outputs[self._script_index - 1]
        return "ok"

    def _next_score(self) -> dict[str, float]:
        if self._score_index < len(self.scores):
            self._score_index += 1
            return self.scores[self._score_index - 1]
        return self.scores[-1] if self.scores else {"Score": 0.0}

    def _evaluate(self, info: dict[str, Any], action: str) -> tuple[str, float, bool, dict[str, Any]]:
        metrics = self._next_score()
        info["score"].append(metrics)
        if action == "validate":
            baseline = str(self.baseline) if self.baseline is not None else "NA (no baseline was there)"
            text = (
                f"Your code produced a valid submission artefact at {self.submission}.\n"
                f"Baseline Score: {baseline}\nEvaluation Score: {metrics}"
            )
            return text, 0.0, False, info
        info["submission"] = self.submission
        info["exit_status"] = "submitted" if action == "submit" else f"autosubmission ({action})"
        return f"Exited ({action})", 0.0, True, info
