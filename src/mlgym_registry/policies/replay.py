"""Replays the responses recorded in an MLGym ``.traj`` file, one per turn, whatever the env answers.

The policy takes the responses only. What else a command takes from the run's record (task, components, seed, max
steps; never the backend or its options) goes through ``records.trust``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..records.trajectories import Step, Trajectory, load_traj
from ..tool_language import SPECIAL_ACTIONS
from .base import Messages, Policy, PolicyExhausted, fenced

MADE_UP_ACTIONS = (*SPECIAL_ACTIONS, "skip")
"""Actions MLGym's agent makes up itself (the model never wrote them); replay sends them as fenced commands."""


class ReplayPolicy(Policy):
    """Feeds the recorded ``response`` of each step of a trajectory, in order.

    MLGym's agent records made-up steps when it gives up (``exit_context`` after a context overflow, ``exit_format``
    after repeated format errors): their ``response`` holds no command, so the recorded special action is sent instead,
    in a fenced block, and the env autosubmits as MLGym's did.
    """

    name = "replay"

    def __init__(self, trajectory: Trajectory | str | Path):
        self.trajectory = trajectory if isinstance(trajectory, Trajectory) else load_traj(trajectory)
        self.source = str(self.trajectory.path) if self.trajectory.path else None  # recorded by the replay's run
        self.index = 0

    def reset(self, spec: Any = None) -> None:
        """Start again from the first recorded step."""
        self.index = 0

    @property
    def remaining(self) -> int:
        """How many recorded responses are left."""
        return len(self.trajectory.steps) - self.index

    def respond(self, messages: Messages) -> str:
        """The next recorded response; ``PolicyExhausted`` once every step has been replayed."""
        if self.index >= len(self.trajectory.steps):
            raise PolicyExhausted(
                f"all {len(self.trajectory.steps)} recorded steps of {self.trajectory.path or 'the trajectory'} "
                f"have been replayed"
            )
        step = self.trajectory.steps[self.index]
        self.index += 1
        return response_of(step)


def response_of(step: Step) -> str:
    """The text to send for a recorded step: its response, or its special action when MLGym made the step up."""
    action = (step.action or "").strip()
    if action in MADE_UP_ACTIONS and step.thought.strip().startswith("Exit due to"):
        return fenced(step.thought.strip(), action)
    return step.response
