"""A deterministic agent that needs no model: it speaks MLGym's tool language like a model would.

It lists the workspace, opens the file the task asks it to edit, replaces it with a strategy (an ``edit`` whose line
range comes from the file window it was shown), validates, tries the next strategy of its playbook, and submits the best
one. Every response is a short discussion and one command, so the whole pipeline (parser, isolator, heredoc guard,
tools, evaluator, reward) is exercised exactly as with a model.

The command is written in the format of the env's parser when the parser declares ``format_action(action)`` (every
built-in parser does): a fenced block for ``thought_action``, ``<command>`` tags for ``xml_thought_action``, the bare
command for ``identity``. The parser comes from the spec given to ``reset(spec)`` (the episode runners pass the env's
spec), else from ``ScriptedPolicy(parser=...)``; a parser without ``format_action`` gets MLGym's fenced format.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ..components.parsers import reads_action
from ..scores import find_metric, parse_validation
from ..specs import baseline_command
from .base import Messages, Policy, fenced, file_window, last_user_message, remaining_steps
from .playbooks import Candidate, Playbook, playbook_for

Plan = Generator[str, str, None]


class ScriptedPolicy(Policy):
    """Plays each task of our suite from its playbook; other tasks get: look around, run the task's baseline program
    (``specs.baseline_command``: a CSV task's ``baseline.py`` writes the submission), validate, submit."""

    name = "scripted"

    def __init__(self, task_id: str | None = None, metric: str | None = None, lower_is_better: bool = False,
                 parser: Any = None):
        """``parser``: the env's parser, whose format the responses use (a parser, a registered parser name or a
        lazy ``"module:attr"`` reference); None for MLGym's fenced format until ``reset(spec)`` names one."""
        self.task_id = task_id
        self.metric = metric
        self.lower_is_better = lower_is_better
        self.parser: Any = resolve_parser(parser)
        self.baseline: str | None = None
        """The shell command that makes the task's baseline submission, run before validating a task without a
        playbook (from ``reset(spec)``; None: the starter code is the baseline)."""
        self._plan: Plan | None = None

    def reset(self, spec: Any = None) -> None:
        """Start over; ``spec`` (a ``TaskSpec``) names the task when the policy was built without one, and its parser
        (``spec.parser``, resolved as the env resolves it) sets the format of the responses."""
        if spec is not None:
            self.task_id = spec.id
            self.baseline = baseline_command(spec)
            baseline = spec.baseline or {}
            self.metric = self.metric or spec.extra.get("priority_metric") or next(iter(baseline), None)
            self.lower_is_better = str(spec.extra.get("metric_direction", "max")).lower() == "min"
            if getattr(spec, "parser", None):
                from ..errors import UnknownNameError
                from ..registry import registry

                try:
                    self.parser = registry.component(spec, "parser")
                except UnknownNameError:  # a name only another Registry knows, with no reference: keep the parser
                    pass
        self._plan = None

    def notice(self, task_id: str) -> str | None:
        """What a person running this policy on ``task_id`` should know first: that it has no plan for the task (it
        only validates and submits the starter code); None when it has one."""
        if playbook_for(task_id) is not None:
            return None
        from .playbooks import PLAYBOOKS

        return (f"the scripted policy has no plan for task {task_id!r}: it lists the files, runs the task's baseline "
                f"program (its baseline_paths), validates what is there and submits it (it has plans for "
                f"{', '.join(sorted(PLAYBOOKS))})")

    def say(self, discussion: str, command: str) -> str:
        """A response with ``discussion`` and ``command`` in the parser's format (``in_format``)."""
        return in_format(self.parser, discussion, command)

    def respond(self, messages: Messages) -> str:
        """The next response: the plan's next command given the last observation."""
        observation = last_user_message(messages)
        if self._plan is None:
            self._plan = self._episode(playbook_for(self.task_id))
            return next(self._plan)
        try:
            return self._plan.send(observation)
        except StopIteration:
            return self.say("The task has been submitted; there is nothing left to do.", "submit")

    # -- the plan ------------------------------------------------------------------------------------------------
    def _episode(self, playbook: Playbook | None) -> Plan:
        observation = yield self.say("Let me list the files in the workspace to see what I am given.", "ls -a")
        if playbook is None or playbook.editable not in _listed_files(observation):
            yield from self._validate_and_submit(observation)
            return
        observation = yield self.say(
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
            observation = yield self.say(reason, edit_command(1, total, candidate.code))
            if "File updated" not in observation:
                continue  # the edit was refused (lint); the file is unchanged
            total = file_window(observation)[1] if file_window(observation) else len(candidate.code.splitlines())
            current = candidate
            for command in playbook.setup:
                observation = yield self.say("Before validating I run the task's preparation step.", command)
            observation = yield self.say(f"Let me validate '{candidate.label}' to get its score.", "validate")
            score = self._score(observation)
            if score is not None and (best is None or score > best[0]):
                best = (score, candidate)
        if best is not None and current is not best[1] and (remaining_steps(observation) or 0) >= 2:
            label = best[1].label
            observation = yield self.say(
                f"The strategy '{label}' scored best; I put it back before submitting.",
                edit_command(1, total, best[1].code),
            )
        summary = f"The best strategy was '{best[1].label}'." if best else "No strategy validated."
        yield self.say(f"{summary} I am done, so I submit.", "submit")

    def _validate_and_submit(self, observation: str) -> Plan:
        if self.baseline is not None:
            observation = yield self.say(
                f"I have no specific plan for this task; I run its baseline program (`{self.baseline}`), which makes "
                "the baseline submission.", self.baseline)
            if (remaining_steps(observation) or 0) < 2:  # one step left: keep it to submit
                yield self.say("There is no step left to validate; I submit what the baseline made.", "submit")
                return
        observation = yield self.say("Let me validate what is there.", "validate")
        score = self._score(observation)
        note = f"It scored {score:.4f}." if score is not None else "Validation gave no score."
        yield self.say(f"{note} I submit the current solution.", "submit")

    def _score(self, observation: str) -> float | None:
        metrics = parse_validation(observation).get("evaluation")
        if not metrics:
            return None
        key = (find_metric(self.metric, metrics) if self.metric else None) or next(iter(metrics))
        value = metrics[key]
        if not isinstance(value, (int, float)):
            return None
        # scores are compared with ">": flip metrics where lower is better
        return -float(value) if self.lower_is_better else float(value)


def in_format(parser: Any, discussion: str, command: str) -> str:
    """A response asking for ``command`` in ``parser``'s format, with ``discussion`` before it when the format allows.

    With ``parser.format_action``: ``"DISCUSSION\n<discussion>\n"`` followed by ``format_action(command)`` when the
    parser reads ``command`` back out of that, else ``format_action(command)`` alone (e.g. a parser whose whole
    response is the command). Without it (or without a parser): ``fenced(discussion, command)``, MLGym's format.
    """
    write = getattr(parser, "format_action", None)
    if not callable(write):
        return fenced(discussion, command)
    action = write(command)
    response = f"DISCUSSION\n{discussion.strip()}\n{action}"
    return response if reads_action(parser, response, command) else action


def resolve_parser(parser: Any) -> Any:
    """A parser from a parser object (returned as is), a registered name or a lazy ``"module:attr"`` reference."""
    if not isinstance(parser, str):
        return parser
    from ..entries import build_component, import_reference
    from ..registry import registry

    if parser not in registry.names("parser") and ":" in parser:
        return build_component("parser", import_reference(parser))
    return registry.build("parser", parser)


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
