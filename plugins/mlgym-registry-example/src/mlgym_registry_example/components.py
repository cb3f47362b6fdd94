"""The example components: a parser and a reward assigner, written against mlgym-registry's component contracts."""

from __future__ import annotations

import json
import re
from typing import Any

from mlgym_registry import FormatError, TaskSpec
from mlgym_registry.bounded_json import loads as load_json
from mlgym_registry.components.rewards import validation_reward

# A fence line: ``` or ```json, then blank space to the end of the line. Found line by line, so the search is linear
# (a regex from each opening fence to its closing one restarts at every fence: quadratic on 10^5 unclosed ```json).
_FENCE_LINE = re.compile(r"^```(json)?[^\S\n]*$", re.MULTILINE)


def _fenced_bodies(response: str) -> list[str]:
    """The body of each fenced block, in order: a fence line opens one, the next bare ``` line closes it."""
    bodies, start = [], None
    for fence in _FENCE_LINE.finditer(response):
        if start is None:
            start = fence.end()
        elif fence.group(1) is None:
            bodies.append(response[start:fence.start()])
            start = None
    return bodies


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
        candidates = _fenced_bodies(response) or [response.strip()]
        for text in reversed(candidates):
            try:
                data = load_json(text)  # json.loads with a nesting bound: any unreadable text is a ValueError
            except ValueError:
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
