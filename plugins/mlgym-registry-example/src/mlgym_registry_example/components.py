"""The example components: a parser and a reward assigner, written against mlgym-registry's component contracts."""

from __future__ import annotations

import json
import re
from typing import Any

from mlgym_registry import FormatError, TaskSpec
from mlgym_registry.components.rewards import validation_reward

_FENCED_JSON = re.compile(r"^```(?:json)?\s*\n(.*?)\n```\s*$", re.DOTALL | re.MULTILINE)


class JsonCommandParser:
    """Parse ``{"thought": "...", "command": "..."}`` (bare, or in a ```json fence) into ``(thought, command)``."""

    format_instructions = (
        "Reply with one JSON object with two string fields, the thought and the command to run, "
        'for example {"thought": "look around", "command": "ls -a"}.'
    )
    format_error_message = "Your reply could not be used: no command was run. " + format_instructions

    def format_action(self, action: str) -> str:
        """The reply that runs ``action``."""
        return json.dumps({"thought": "Next step.", "command": action})

    def __call__(self, response: str) -> tuple[str, str]:
        candidates = [m.group(1) for m in _FENCED_JSON.finditer(response)] or [response.strip()]
        for text in reversed(candidates):
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and isinstance(data.get("command"), str) and data["command"].strip():
                return str(data.get("thought", "")), data["command"]
        raise FormatError(f"No JSON command found in model response. {self.format_instructions}")


class RelativeImprovementReward:
    """Reward a step that scored (a validate, or the final evaluation) by ``(score - baseline) / |baseline|``.

    Stateless: the step's own score is the last entry of ``info["score"]``, and the step scored when its observation
    is a validate message showing that entry's metrics (``validation_reward`` refuses numbers the agent printed
    itself) or the episode ended with an evaluation (``exit_status`` "submitted" or "autosubmission (...)").
    """

    def __call__(self, observation: str, info: dict[str, Any], spec: TaskSpec) -> float:
        scores = info.get("score") or []
        status = info.get("exit_status") or ""
        validated = validation_reward(observation, info, spec) is not None
        scored = validated or status == "submitted" or status.startswith("autosub")
        if not (scored and scores and spec.baseline):
            return 0.0
        metric = spec.extra.get("priority_metric") or next(iter(spec.baseline))
        baseline = float(spec.baseline[metric])
        value = float(scores[-1][metric])
        sign = -1.0 if spec.extra.get("metric_direction") == "min" else 1.0
        return sign * (value - baseline) / (abs(baseline) or 1.0)
