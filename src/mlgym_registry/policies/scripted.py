"""A deterministic agent that needs no model: it speaks MLGym's tool language like a model would.

It lists the workspace, opens the file the task asks it to edit, replaces it with a strategy (an ``edit`` whose line
range comes from the file window it was shown), validates, tries the next strategy of its playbook, and submits the best
one. Every response is a short discussion and one fenced command, so the whole pipeline (parser, isolator, heredoc
guard, tools, evaluator, reward) is exercised exactly as with a model.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .base import Messages, Policy, evaluation_score, fenced, file_window, last_user_message, remaining_steps
from .playbooks import Candidate, Playbook, playbook_for

Plan = Generator[str, str, None]


class ScriptedPolicy(Policy):
    """Plays each task of our suite from its playbook; other tasks get: look around, validate, submit."""

    name = "scripted"

    def __init__(self, task_id: str | None = None, metric: str | None = None, lower_is_better: bool = False):
        self.task_id = task_id
        self.metric = metric
        self.lower_is_better = lower_is_better
        self._plan: Plan | None = None

    def reset(self, spec: Any = None) -> None:
        """Start over; ``spec`` (a ``TaskSpec``) names the task when the policy was built without one."""
        if spec is not None:
            self.task_id = spec.id
            baseline = spec.baseline or {}
            self.metric = self.metric or spec.extra.get("priority_metric") or next(iter(baseline), None)
            self.lower_is_better = str(spec.extra.get("metric_direction", "max")).lower() == "min"
        self._plan = None

    def respond(self, messages: Messages) -> str:
        """The next response: the plan's next command given the last observation."""
        observation = last_user_message(messages)
        if self._plan is None:
            self._plan = self._episode(playbook_for(self.task_id))
            return next(self._plan)
        try:
            return self._plan.send(observation)
        except StopIteration:
            return fenced("The task has been submitted; there is nothing left to do.", "submit")

    # -- the plan ------------------------------------------------------------------------------------------------
    def _episode(self, playbook: Playbook | None) -> Plan:
        observation = yield fenced("Let me list the files in the workspace to see what I am given.", "ls -a")
        if playbook is None or playbook.editable not in _listed_files(observation):
            yield from self._validate_and_submit(observation)
            return
        observation = yield fenced(
            f"The task asks me to change `{playbook.editable}`. I will open it to see its current content.",
            f'open "{playbook.editable}"',
        )
        window = file_window(observation)
        total = window[1] if window else 1
        best: tuple[float, Candidate] | None = None
        current: Candidate | None = None
        for index, candidate in enumerate(playbook.candidates):
            # one candidate needs an edit and a validate; keep room to restore the best and to submit
            needed = 2 + len(playbook.setup) + (1 if best else 0) + 1
            if index and (remaining_steps(observation) or 0) < needed:
                break
            reason = f"I will write a strategy: {candidate.label}. {candidate.reason}"
            observation = yield fenced(reason, edit_command(1, total, candidate.code))
            if "File updated" not in observation:
                continue  # the edit was refused (lint); the file is unchanged
            total = file_window(observation)[1] if file_window(observation) else len(candidate.code.splitlines())
            current = candidate
            for command in playbook.setup:
                observation = yield fenced("Before validating I run the task's preparation step.", command)
            observation = yield fenced(f"Let me validate '{candidate.label}' to get its score.", "validate")
            score = self._score(observation)
            if score is not None and (best is None or score > best[0]):
                best = (score, candidate)
        if best is not None and current is not best[1] and (remaining_steps(observation) or 0) >= 2:
            label = best[1].label
            observation = yield fenced(
                f"The strategy '{label}' scored best; I put it back before submitting.",
                edit_command(1, total, best[1].code),
            )
        summary = f"The best strategy was '{best[1].label}'." if best else "No strategy validated."
        yield fenced(f"{summary} I am done, so I submit.", "submit")

    def _validate_and_submit(self, observation: str) -> Plan:
        observation = yield fenced("I have no specific plan for this task; let me validate what is there.", "validate")
        score = self._score(observation)
        note = f"It scored {score:.4f}." if score is not None else "Validation gave no score."
        yield fenced(f"{note} I submit the current solution.", "submit")

    def _score(self, observation: str) -> float | None:
        metrics = evaluation_score(observation)
        if not metrics:
            return None
        key = self.metric if self.metric in metrics else next(iter(metrics))
        value = metrics[key]
        if not isinstance(value, (int, float)):
            return None
        # scores are compared with ">": flip metrics where lower is better
        return -float(value) if self.lower_is_better else float(value)


def edit_command(start: int, end: int, text: str) -> str:
    """An MLGym ``edit start:end`` command replacing those lines with ``text``."""
    body = text if text.endswith("\n") else text + "\n"
    return f"edit {start}:{end}\n{body}end_of_edit"


def _listed_files(observation: str) -> set[str]:
    """File names in an ``ls`` observation (``ls -F`` suffixes such as ``*`` and ``/`` removed)."""
    names = set()
    for line in observation.splitlines():
        for word in line.split():
            names.add(word.rstrip("*/@=|"))
    return names
