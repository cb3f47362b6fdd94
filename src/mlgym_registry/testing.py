"""The conformance kit: check that a component honours its contract before you register it.

Each ``check_*`` function exercises one kind of component the way the chain will, and raises ``ConformanceError``
(an ``AssertionError``, so pytest shows it as a failure) with a message that says what broke and what the contract
expects. They return normally when the component conforms::

    from mlgym_registry.testing import check_parser
    check_parser(MyParser())

``registered_plugin`` is a pytest fixture that adds a plugin to the registry for one test and removes it after;
expose it to your tests with ``from mlgym_registry.testing import registered_plugin`` in your ``conftest.py``.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import shutil
import string
import subprocess
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import FormatError, MLGymRegistryError
from .specs import TaskSpec

__all__ = [
    "ComponentCheck",
    "ConformanceError",
    "EvaluationRun",
    "TaskCheck",
    "check_backend",
    "check_component",
    "check_history_processor",
    "check_isolator",
    "check_parser",
    "check_plugin",
    "check_reward_assigner",
    "check_task",
    "check_template",
    "example_conversation",
    "isolator_responses",
    "registered_plugin",
    "run_evaluator",
    "template_fields",
]


class ConformanceError(AssertionError):
    """A component that does not honour its contract; the message says which part and why."""


def _fail(what: str, why: str) -> None:
    raise ConformanceError(f"{what}: {why}")


def _name(obj: Any) -> str:
    """How a message names ``obj``: a template set by its ``name``, a function or class by its qualified name, an
    instance by its class's."""
    from .components.template_set import TemplateSet

    if isinstance(obj, TemplateSet):
        return repr(obj.name)
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


# -- parsers -----------------------------------------------------------------------------------------------------
WELL_FORMED_RESPONSES = (
    "DISCUSSION\nLet me look at the files first.\n```\nls -a\n```",
    "<command>\nls -a\n</command>",
    '{"thought": "Let me look at the files first.", "command": "ls -a"}',
    "ls -a",
)
"""One response in each common style, all asking for ``ls -a``: a parser must understand at least one."""

ODD_RESPONSES = (
    "",
    "I think we should look at the files.",
    "```\nls -a",
    "```\n```",
    "DISCUSSION\n```python\nprint('nested')\n```\nno closing fence",
    "caf\u00e9 \u2603 \x00 \ufffd",
    "x" * 100_000,
)
"""Responses a model really produces: empty, prose only, unclosed or empty blocks, odd characters, huge text."""


def check_parser(parser: Callable[[str], Any], *, well_formed: dict[str, str] | None = None,
                 malformed: tuple[str, ...] = ()) -> None:
    """Check ``parser(response) -> (thought, action)`` and its ``FormatError`` contract.

    ``well_formed`` maps responses to the action they must give (stripped); by default the parser must read
    ``ls -a`` out of at least one of ``WELL_FORMED_RESPONSES`` or, when it declares ``format_action(action) ->
    response`` (a response in its own format carrying ``action``), out of its own ``format_action("ls -a")``. Every
    odd response must give a ``(str, str)`` pair or raise ``FormatError``; each of ``malformed`` must raise
    ``FormatError``. The result must not vary between calls. A parser need not declare ``format_action`` (nor
    ``format_instructions``); a declared ``format_action`` must give ``ls -a`` back, and a declared
    ``format_instructions`` or ``format_error_message`` must be a string.
    """
    what = f"parser {_name(parser)}"
    if not callable(parser):
        _fail(what, "is not callable; a parser is a callable parser(response: str) -> (thought, action)")
    examples = well_formed or {response: "ls -a" for response in WELL_FORMED_RESPONSES}
    for attribute in ("format_instructions", "format_error_message"):
        text = getattr(parser, attribute, None)
        if text is not None and not isinstance(text, str):
            _fail(what, f"declares {attribute} = {text!r:.80}; it must be a str (or not be declared)")
    declared = getattr(parser, "format_action", None) if well_formed is None else None
    if callable(declared):  # a parser that shows its own format: its example counts as a well-formed response
        example = declared("ls -a")
        if not isinstance(example, str):
            _fail(what, f"format_action('ls -a') returned {example!r:.80}; it must return a response (a str)")
        examples = {example: "ls -a", **examples}
    understood = []
    for response, expected in examples.items():
        result = _parse(parser, response, what)
        if result is not None and result[1].strip() == expected.strip():
            understood.append(response)
        elif well_formed is not None:
            got = "a FormatError" if result is None else repr(result[1])
            _fail(what, f"parsed {response!r} into {got}; expected the action {expected!r}")
    if not understood:
        _fail(what, f"read the action 'ls -a' out of none of {list(examples)}; it must understand at least one")
    if callable(declared) and example not in understood:
        _fail(what, f"does not read 'ls -a' back out of its own format_action('ls -a') = {example!r:.80}; "
                    f"parser(parser.format_action(a))[1].strip() must equal a.strip()")
    for response in ODD_RESPONSES + tuple(understood):
        first = _parse(parser, response, what)
        if _parse(parser, response, what) != first:
            _fail(what, f"gave different results for the same response {response[:60]!r}; a parser must be pure")
    for response in malformed:
        if _parse(parser, response, what) is not None:
            _fail(what, f"accepted the malformed response {response[:60]!r}; it must raise FormatError")


def _parse(parser: Callable[[str], Any], response: str, what: str) -> tuple[str, str] | None:
    """The parser's ``(thought, action)``, or None for a ``FormatError``; anything else fails the check."""
    shown = response[:60] + ("..." if len(response) > 60 else "")
    try:
        result = parser(response)
    except FormatError:
        return None
    except Exception as exc:  # noqa: BLE001 - any other exception is exactly what the check reports
        _fail(what, f"raised {type(exc).__name__}: {exc} on {shown!r}; when a response holds no action a parser "
                    f"must raise mlgym_registry.errors.FormatError, and nothing else")
    if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(part, str) for part in result)):
        _fail(what, f"returned {result!r:.80} for {shown!r}; it must return a (thought, action) tuple of two strings")
    return result


# -- reward assigners --------------------------------------------------------------------------------------------
def _reward_cases(spec: TaskSpec) -> list[tuple[str, str, dict[str, Any]]]:
    """Every kind of step the env hands a reward: each exit status the backends produce (``""``, ``submitted``,
    ``skipped``, ``exit_forfeit``, the autosubmissions, MLGym's failed-evaluation exits) with each evaluation status
    (``ok``, ``invalid_submission``, ``agent_error``, ``infra_error``, none), with and without earlier scores."""
    from .backends.protocol import (
        AGENT_ERROR,
        EVALUATION_OK,
        EVALUATION_STATUS_KEY,
        EVALUATIONS_KEY,
        INFRA_ERROR,
        INVALID_SUBMISSION,
        new_info,
    )

    def step_info(status: str = "", exit_status: str = "", scores: list | None = None,
                  earlier: tuple[str, ...] = ()) -> dict[str, Any]:
        """The info the env hands a reward: the backend's, with this step's evaluation status and the episode's."""
        info = new_info()
        info.update(exit_status=exit_status, score=list(scores or []))
        info[EVALUATION_STATUS_KEY] = status
        info[EVALUATIONS_KEY] = [*earlier, status] if status else list(earlier)
        return info

    baseline = spec.baseline or {"Score": 1.0}
    better = {key: float(value) + 1.0 for key, value in baseline.items()}
    validated = step_info(EVALUATION_OK, scores=[better])
    submitted = step_info(EVALUATION_OK, "submitted", [better])
    submitted["submission"] = "target.py"
    validate_text = (f"Your code produced a valid submission artefact at /w/target.py.\nBaseline Score: {baseline}\n"
                     f"Evaluation Score: {better}")
    failed_text = "Failed to decode metrics from evaluation script. Output:\n---\nTraceback ...\n---"
    not_found = "Submission artefact not found."
    ok = (EVALUATION_OK,)
    cases = [
        ("a plain observation", "file.txt\nstrategy.py", step_info()),
        ("an empty observation", "", step_info()),
        ("a validate observation", validate_text, validated),
        ("the final submit", "Exited (submit)", submitted),
        ("a format error", "Malformed edit command.", step_info()),
        ("a failed validate (agent_error, no score yet)", failed_text, step_info(AGENT_ERROR)),
        ("a failed submit (invalid_submission, no score)", "Exited (submit)",
         step_info(INVALID_SUBMISSION, "evaluation_format_error (submit)")),
        ("a failed validate after a scored one (agent_error)", failed_text,
         step_info(AGENT_ERROR, scores=[better], earlier=ok)),
        ("a validate without the submission artefact (invalid_submission)", not_found,
         step_info(INVALID_SUBMISSION)),
        ("an infra_error validate", "Error: the evaluation did not finish", step_info(INFRA_ERROR)),
        ("a validate that timed out (agent_error)", "Error: Timeout reached while reading from subprocess.",
         step_info(AGENT_ERROR)),
        ("a skip", "Skipped", step_info(exit_status="skipped")),
        ("a skip after a scored validate", "Skipped", step_info(exit_status="skipped", scores=[better], earlier=ok)),
        ("a forfeit", "Exited (exit_forfeit)", step_info(exit_status="exit_forfeit")),
        ("a forfeit after a scored validate", "Exited (exit_forfeit)",
         step_info(exit_status="exit_forfeit", scores=[better], earlier=ok)),
    ]
    for action in ("submit", "max_steps", "exit_format", "exit_context", "exit_cost", "exit_error", "exit_api"):
        exited = f"Exited ({action})"
        if action != "submit":
            cases.append((f"the autosubmission ({action})", exited,
                          step_info(EVALUATION_OK, f"autosubmission ({action})", [better])))
        if action != "submit":  # (the failed submit without a score is among the first cases)
            cases.append((f"a failed {action} (evaluation_format_error, no score)", exited,
                          step_info(INVALID_SUBMISSION, f"evaluation_format_error ({action})")))
        cases += [
            (f"a failed {action} after a scored validate (evaluation_format_error)", exited,
             step_info(INVALID_SUBMISSION, f"evaluation_format_error ({action})", [better], ok)),
            (f"a {action} without the submission artefact (submission_not_found)", exited,
             step_info(INVALID_SUBMISSION, f"submission_not_found ({action})")),
            (f"a {action} with non-finite metrics (invalid_submission)", exited,
             step_info(INVALID_SUBMISSION, f"invalid_submission ({action})")),
            (f"a {action} that timed out (agent_error)", exited,
             step_info(AGENT_ERROR, f"EvaluationTimeout, the evaluation ran out of time, ({action})")),
            (f"a {action} the infrastructure failed (infra_error)", exited,
             step_info(INFRA_ERROR, f"EvaluationUnsupported, the backend cannot evaluate this task, ({action})")),
        ]
    return cases


def check_reward_assigner(reward: Callable[..., Any], spec: TaskSpec | None = None) -> None:
    """Check ``reward(observation, info, spec) -> float`` on every kind of step the env produces (``_reward_cases``):
    plain, empty, validate, submit and format-error steps; failed, timed-out and infra-failed evaluations (with and
    without earlier scores: ``info["score"]`` need not hold this step's); skips and forfeits; every autosubmission and
    every failed-evaluation exit status, for ``submit``, ``max_steps`` and each ``exit_*`` action.

    Each call must return a finite real number, leave ``info`` unchanged and give the same value when repeated.
    """
    what = f"reward assigner {_name(reward)}"
    if not callable(reward):
        _fail(what, "is not callable; a reward assigner is reward(observation, info, spec) -> float")
    spec = spec or _example_spec()
    for label, observation, info in _reward_cases(spec):
        before = copy.deepcopy(info)
        values = []
        for _ in range(2):
            try:
                value = reward(observation, info, spec)
            except Exception as exc:  # noqa: BLE001 - reported as the failure
                _fail(what, f"raised {type(exc).__name__}: {exc} on {label} (exit_status="
                            f"{info['exit_status']!r}, evaluation_status={info['evaluation_status']!r}, score="
                            f"{info['score']}); it must return a float for every step: read info['score'][-1] only "
                            f"when info['evaluation_status'] == 'ok' (this step was scored)")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                _fail(what, f"returned {value!r} ({type(value).__name__}) on {label}; it must return a finite float")
            values.append(float(value))
        if info != before:
            _fail(what, f"changed the info dict on {label} ({before} -> {info}); it must only read it")
        if values[0] != values[1]:
            _fail(what, f"returned {values[0]} then {values[1]} for the same {label}; it must be a pure function")


def _example_spec() -> TaskSpec:
    return TaskSpec(id="conformance", name="conformance", description="A task used by the conformance kit.",
                    baseline_scores=[{"Score": 1.0}])


# -- templates ---------------------------------------------------------------------------------------------------
STATE_FIELDS = {"open_file": "n/a", "working_dir": "/workspace"}
TOOL_VARIABLES = {"WINDOW": "100", "OVERLAP": "2", "CURRENT_LINE": "0", "CURRENT_FILE": "", "SEARCH_RESULTS": "()",
                  "SEARCH_FILES": "()", "SEARCH_INDEX": "0"}
"""MLGym's default tool env variables: system templates may use any of them (``{WINDOW}`` in MLGym's)."""
TURN_FIELDS = {**STATE_FIELDS, "current_step": 3, "remaining_steps": 7, "observation": "OBSERVATION-MARKER"}
"""What the turn templates get besides every template's fields: the ``state`` command's fields, the step counts and
the observation. The system template and the format-error text do not get them."""
TURN_TEMPLATES = ("task_template", "strategy_template", "next_step_template", "next_step_no_output_template")
"""The templates the env renders after a reset or a step, with ``TURN_FIELDS``."""


def template_fields(spec: TaskSpec | None = None) -> dict[str, dict[str, Any]]:
    """The placeholders the env passes to each template of a set, by template field (as the chain renders them:
    ``transforms/reset_module.py``, ``transforms/state_to_message.py``): every template gets the task fields,
    ``{command_docs}``, the tools' env variables and ``{format_instructions}``; the turn templates also get
    ``TURN_FIELDS``; ``format_error_template`` gets ``{error}`` (the parser's ``FormatError`` text); the
    ``demonstration_template`` (never rendered by the chain) gets ``{demonstration}``."""
    spec = spec or _example_spec()
    common = {**spec.to_dict(), "command_docs": "open <path>: open a file", **TOOL_VARIABLES,
              "format_instructions": "Reply with one command."}
    fields = {"system_template": common, "format_error_template": {**common, "error": "No command found."},
              "demonstration_template": {"demonstration": "DEMO"}}
    fields.update({name: {**common, **TURN_FIELDS} for name in TURN_TEMPLATES})
    return fields


def check_template(template: Any, spec: TaskSpec | None = None) -> None:
    """Check a template set: a ``TemplateSet`` (or a zero-argument callable returning one) each of whose templates
    formats with exactly the placeholders the env passes to it (``template_fields``), and whose next-step template
    shows the observation. ``format_error_template`` may use ``{error}``; a placeholder only the turn templates get
    (``{working_dir}``, ``{observation}``...) fails in the system template (the env's ``reset`` would raise) and in
    the format-error text (it would be sent as written)."""
    from .components.template_set import TemplateSet

    templates = template() if callable(template) and not isinstance(template, TemplateSet) else template
    what = f"template set {_name(templates if isinstance(templates, TemplateSet) else template)}"
    if not isinstance(templates, TemplateSet):
        _fail(what, f"is a {type(templates).__name__}; register a TemplateSet or a zero-argument callable "
                    f"returning one")
    fields = template_fields(spec)
    for name, available in fields.items():
        text = getattr(templates, name)
        if text is None:
            if name in ("system_template", "task_template"):
                _fail(what, f"has no {name}; it is required")
            continue
        if not isinstance(text, str):
            _fail(what, f"{name} is a {type(text).__name__}, not a str")
        unknown = _unknown_placeholder(text, available, lenient=name == "format_error_template")
        if unknown is not None:
            _fail(what, _placeholder_problem(name, unknown, available))
    if "OBSERVATION-MARKER" not in templates.next_step.format_map(_Fields(fields["next_step_template"], {})):
        _fail(what, "the next-step template does not show {observation}; the model would never see command output")


def _unknown_placeholder(text: str, available: dict[str, Any], *, lenient: bool) -> str | None:
    """The first placeholder of ``text`` that ``available`` lacks (None when all format). ``lenient`` is the
    format-error text's rule: literal braces are sent as is, and only a placeholder another template gets counts."""
    try:
        string.Formatter().vformat(text, (), _Fields(available, {}))
    except KeyError as exc:
        name = str(exc.args[0]).removeprefix("unknown placeholder {").removesuffix("}")
        if lenient and name not in TURN_FIELDS:
            return None
        return name
    except (IndexError, ValueError, AttributeError) as exc:
        return None if lenient else f"?{type(exc).__name__}: {exc}"
    return None


def _placeholder_problem(name: str, placeholder: str, available: dict[str, Any]) -> str:
    """Why ``name`` fails to render with ``placeholder``, and which templates get it."""
    if placeholder.startswith("?"):
        return f"{name} is not a valid str.format template ({placeholder[1:]}); double literal braces: {{{{ }}}}"
    if placeholder in TURN_FIELDS:
        where = "would be sent as written" if name == "format_error_template" else "makes the env's reset fail"
        return (f"{name} uses {{{placeholder}}}, which only the turn templates ({', '.join(TURN_TEMPLATES)}) get; "
                f"it {where}. Move it to a turn template or remove it.")
    return (f"{name} uses the unknown placeholder {{{placeholder}}}, which the env does not pass to it; it gets: "
            f"{', '.join(sorted(available))}")


class _Fields(dict):
    """Format fields: the known ones, plus ``extra``; an unknown name raises ``KeyError`` naming it."""

    def __init__(self, fields: dict[str, Any], extra: dict[str, Any]):
        super().__init__({**fields, **extra})

    def __missing__(self, key: str) -> Any:
        raise KeyError(f"unknown placeholder {{{key}}}")


# -- history processors -----------------------------------------------------------------------------------------
def example_conversation(turns: int, output_lines: int = 3) -> list[dict[str, str]]:
    """A conversation as the chain gives it to a history processor: the system message, the task, then ``turns``
    turns (an assistant reply with a fenced command and the user message with its output)."""
    messages = [{"role": "system", "content": "You work alone in a shell. Reply with one command."},
                {"role": "user", "content": "TASK: write a strategy.\n(Current Step: 0, Remaining Steps: 50)"}]
    for turn in range(turns):
        output = "\n".join(f"turn {turn} output line {line}" for line in range(output_lines))
        messages.append({"role": "assistant", "content": f"DISCUSSION\nStep {turn}.\n```\nls -l\n```"})
        messages.append({"role": "user", "content": f"{output}\n(Current Step: {turn + 1}, Remaining Steps: "
                                                    f"{49 - turn})"})
    return messages


def check_history_processor(processor: Callable[[list[dict[str, str]]], Any]) -> None:
    """Check a history processor on conversations of 0 to 60 turns: it returns a non-empty list of ``{"role",
    "content"}`` dicts with known roles, ends with the latest message unchanged (the policy must see the output of its
    last command), leaves its input as it was, and gives the same view when asked twice."""
    from .output_checks import bad_message

    what = f"history processor {_name(processor)}"
    for turns in (0, 1, 6, 60):
        messages = example_conversation(turns)
        before = copy.deepcopy(messages)
        try:
            shown = processor(list(messages))
        except Exception as exc:  # noqa: BLE001 - reported as the processor's failure
            _fail(what, f"raised {type(exc).__name__}: {exc} on a conversation of {turns} turns")
        if messages != before:
            _fail(what, "changed the messages it was given; return new dicts for the messages it changes")
        if not isinstance(shown, list) or not shown:
            _fail(what, f"returned {shown!r:.80} for {turns} turns; it must return a non-empty list of messages")
        bad = bad_message(shown)
        if bad is not None:
            _fail(what, f"message {bad[0]} is {bad[1]!r:.80}; each must be a {{'role', 'content'}} dict with role "
                        "system, user or assistant and str content")
        if shown[-1] != messages[-1]:
            _fail(what, f"does not end with the latest message ({turns} turns); the policy would not see the output "
                        "of its last command")
        if processor(list(messages)) != shown:
            _fail(what, "gave two different views of the same conversation")


# -- isolators ---------------------------------------------------------------------------------------------------
EDIT_RESPONSE = "DISCUSSION\nReplace the function.\n```\nedit 1:2\ndef f(x):\n    return (x, 'a')\nend_of_edit\n```"


EDIT_ACTION = "edit 1:2\ndef f(x):\n    return (x, 'a')\nend_of_edit"
"""The multi-line edit the isolator check asks for, in whatever format the parser reads."""

NO_COMMAND_RESPONSES = ("", "Just thinking out loud, no command.")
"""Responses that hold no command in the common formats."""

RESPONSE_STYLES: dict[str, Callable[[str], str]] = {
    "fenced": lambda action: f"DISCUSSION\nLet me do this.\n```\n{action}\n```",
    "xml": lambda action: f"DISCUSSION\nLet me do this.\n<command>\n{action}\n</command>",
    "json": lambda action: json.dumps({"thought": "Let me do this.", "command": action}),
    "bare": lambda action: action,
}
"""How a response asks for an action in each common style; ``isolator_responses`` tries them in this order."""


def isolator_responses(parser: Callable[[str], Any]) -> tuple[str, str] | None:
    """Two responses in ``parser``'s own format, ``(asks for 'ls -a', asks for EDIT_ACTION)``, or None.

    A parser that declares ``format_action(action) -> response`` (a method or callable attribute) is asked for them;
    otherwise each of ``RESPONSE_STYLES`` is tried and the first style whose responses the parser reads back into
    exactly these actions is used.
    """
    from .components.parsers import reads_action

    styles = list(RESPONSE_STYLES.values())
    declared = getattr(parser, "format_action", None)
    if callable(declared):
        styles.insert(0, declared)
    for style in styles:
        try:
            command, edit = style("ls -a"), style(EDIT_ACTION)
        except Exception:  # noqa: BLE001 - a broken format_action falls back to the common styles
            continue
        if (isinstance(command, str) and isinstance(edit, str) and reads_action(parser, command, "ls -a")
                and reads_action(parser, edit, EDIT_ACTION)):
            return command, edit
    return None


def check_isolator(isolator: Callable[..., Any], parser: Callable[[str], Any] | None = None,
                   responses: tuple[str, str] | None = None) -> None:
    """Check ``isolator(response, parser) -> action``: a plain command comes through, a response without a command
    raises ``FormatError``, and a multi-line ``edit`` comes out as one shell-safe command (what MLGym's heredoc
    guard ensures: ``bash -n`` accepts it, its body is kept).

    The isolator is called as the chain calls it, ``isolator(response, parser)``, so the responses must be in the
    parser's format. ``parser`` defaults to ``thought_action`` (fenced code blocks). ``responses`` is a pair of
    responses in that format: the first asks for the command ``ls -a``, the second for ``EDIT_ACTION`` (an
    ``edit 1:2`` with a two-line body ending in ``end_of_edit``). When it is not given they are built with
    ``isolator_responses(parser)`` (the parser's ``format_action`` if it declares one, else the first common style
    it reads: fenced, ``<command>`` tags, JSON, bare). The no-command responses (``""`` and prose) must raise
    ``FormatError`` whenever the parser itself finds no action in them.
    """
    from .components.parsers import ThoughtActionParser

    what = f"isolator {_name(isolator)}"
    parser = parser or ThoughtActionParser()
    if not callable(isolator):
        _fail(what, "is not callable; an isolator is isolator(response, parser) -> action")
    if responses is None:
        responses = isolator_responses(parser)
        if responses is None:
            _fail(what, f"cannot be checked with parser {_name(parser)}: it reads none of the common response "
                        f"styles; pass responses=(command_response, edit_response) in its format")
    command_response, edit_response = responses
    action = _isolate(isolator, command_response, parser, what)
    if action is None or action.strip() != "ls -a":
        _fail(what, f"turned {command_response[:60]!r} (asking for 'ls -a') into {action!r}; expected the action "
                    f"'ls -a'")
    for response in NO_COMMAND_RESPONSES:
        if _parse_quietly(parser, response) is None and _isolate(isolator, response, parser, what) is not None:
            _fail(what, f"accepted {response!r}, which holds no command; it must raise FormatError")
    edit = _isolate(isolator, edit_response, parser, what)
    if edit is None or not edit.lstrip().startswith("edit 1:2") or "return (x, 'a')" not in edit:
        _fail(what, f"turned an edit into {edit!r}; the edit command and its body must be kept")
    bash = shutil.which("bash")
    if bash is not None:
        check = subprocess.run([bash, "-n"], input=edit, text=True, capture_output=True, timeout=10)
        if check.returncode != 0:
            _fail(what, f"left the edit body unguarded: bash -n rejects {edit!r} ({check.stderr.strip()}); guard "
                        f"multi-line edit/insert bodies with a heredoc (<< 'end_of_edit') as MLGym's agent does")


def _parse_quietly(parser: Callable[[str], Any], response: str) -> Any:
    """What ``parser`` makes of ``response``, or None when it raises (no action)."""
    try:
        return parser(response)
    except Exception:  # noqa: BLE001 - any failure means the parser found no action
        return None


def _isolate(isolator: Callable[..., Any], response: str, parser: Any, what: str) -> str | None:
    try:
        action = isolator(response, parser)
    except FormatError:
        return None
    except Exception as exc:  # noqa: BLE001 - reported as the failure
        _fail(what, f"raised {type(exc).__name__}: {exc} on {response[:60]!r}; it must raise FormatError only")
    if not isinstance(action, str):
        _fail(what, f"returned {type(action).__name__} for {response[:60]!r}; it must return the action as a str")
    return action


# -- backends ----------------------------------------------------------------------------------------------------
def check_backend(factory: Callable[..., Any], spec: TaskSpec | str = "prisonersDilemma", **options: Any) -> None:
    """Run a short episode on a backend and check MLGym's contract: reset, tools, a command, step counting, the
    five-key ``info``, a validate and a submit whose ``info["score"]`` accumulates (the submission's score after the
    validation's, when the starter code validates), and a ``close`` that leaves nothing behind.

    ``task_workspace`` is the workspace's path as the agent sees it; it need not exist on this machine (a container's
    or a sandbox's path). A backend whose workspace is a folder here exposes it as ``host_workspace``: the kit then
    checks that it exists after ``reset()`` and is gone after ``close()``. A container backend (``mlgym``) has none,
    and the kit checks its workspace only through the agent's shell (``ls`` shows the starter files)."""
    from .backends.protocol import EVALUATION_STATUS_KEY, EVALUATION_STATUSES, INFO_KEYS, ToolSet
    from .registry import registry

    what = f"backend {_name(factory)}"
    spec = registry.spec(spec) if isinstance(spec, str) else spec
    backend = factory(spec, **options)
    workspace: Path | None = None
    try:
        reset = backend.reset(seed=0)
        if not (isinstance(reset, tuple) and len(reset) == 2 and isinstance(reset[0], dict)):
            _fail(what, f"reset() returned {reset!r}; it must return ({{'observation': None}}, {{}})")
        # ``task_workspace`` is where the agent sees its workspace (a path inside a sandbox or container may not
        # exist here); a backend whose workspace is a folder on this machine names it ``host_workspace``
        host = getattr(backend, "host_workspace", None)
        workspace = Path(host) if host is not None else None
        if workspace is not None and not workspace.is_dir():
            _fail(what, f"host_workspace {workspace} is not a directory after reset()")
        if not str(backend.task_workspace).startswith("/"):
            _fail(what, f"task_workspace {backend.task_workspace!r} is not an absolute path")
        tools = backend.install_tools()
        if not isinstance(tools, ToolSet):
            _fail(what, f"install_tools() returned {type(tools).__name__}; it must return a ToolSet")
        output = backend.communicate("echo conformance")
        if output.strip() != "conformance" or backend.returncode != 0:
            _fail(what, f"communicate('echo conformance') gave {output!r} (returncode {backend.returncode})")
        state = json.loads(backend.communicate(tools.state_command))
        if not {"open_file", "working_dir"} <= set(state):
            _fail(what, f"the state command printed {state}; it needs open_file and working_dir")
        result = backend.step("ls")
        if not (isinstance(result, tuple) and len(result) == 4):
            _fail(what, f"step() returned {result!r:.80}; it must return (observation, reward, done, info)")
        observation, _reward, done, info = result
        if not set(INFO_KEYS) <= set(info) <= set(INFO_KEYS) | {EVALUATION_STATUS_KEY}:
            _fail(what, f"step() info has keys {sorted(info)}; MLGym's info has exactly {list(INFO_KEYS)} (and "
                        f"optionally {EVALUATION_STATUS_KEY!r})")
        if info.get(EVALUATION_STATUS_KEY, "") not in ("", *EVALUATION_STATUSES):
            _fail(what, f"step() info[{EVALUATION_STATUS_KEY!r}] is {info[EVALUATION_STATUS_KEY]!r}; use one of "
                        f"{list(EVALUATION_STATUSES)} or ''")
        if done or backend.current_step != 1:
            _fail(what, f"after one step done={done} and current_step={backend.current_step}; expected False and 1")
        starter = {Path(path).name for path in spec.starter_code}
        if starter and not starter & set((observation or "").split()):
            _fail(what, f"'ls' in the workspace showed {observation!r}; starter files {sorted(starter)} are missing")
        _observation, _reward, done, info = backend.step("validate")
        validated = list(info.get("score") or [])
        if done:
            _fail(what, f"validate ended the episode (exit_status={info.get('exit_status')!r})")
        observation, _reward, done, info = backend.step("submit")
        if not done or info.get("exit_status") != "submitted" or not info.get("score"):
            _fail(what, f"submit gave done={done}, exit_status={info.get('exit_status')!r}, score={info.get('score')}; "
                        f"expected done, 'submitted' and a score")
        if list(info["score"][:len(validated)]) != validated or len(info["score"]) != len(validated) + 1:
            _fail(what, f"after validate info['score'] was {validated} and after submit {info['score']}; it must "
                        f"accumulate: every metric dict of the episode so far, the submission's last")
    finally:
        backend.close()
    backend.close()  # closing twice must be harmless
    if workspace is not None and workspace.exists():
        _fail(what, f"close() left the workspace {workspace} on disk")


# -- tasks -------------------------------------------------------------------------------------------------------
@dataclass
class EvaluationRun:
    """One run of a task's evaluator: the seed, the metrics it printed, how long it took."""

    seed: int
    metrics: dict[str, float]


@dataclass
class TaskCheck:
    """What ``check_task`` found: the spec, each evaluation run, and the verdict per metric."""

    spec: TaskSpec
    runs: list[EvaluationRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    known_differences: list[str] = field(default_factory=list)
    """Baseline metrics that differ from the recorded ones for a cause the task states (its ``baseline_note``)."""
    warnings: list[str] = field(default_factory=list)
    """What is not a problem but deserves a look: a single run beyond the tolerance (no noise estimate), a key of
    the task file that looks like a misspelt field."""

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems


def check_task(task: TaskSpec | str | Path, *, runs: int = 3, raise_on_failure: bool = True) -> TaskCheck:
    """Check a task for suite maintainers: it loads, its files exist, its evaluator runs on the starter code and
    prints its metrics, and its recorded baseline matches fresh runs within the evaluator's own noise.

    ``task`` is a registered name, a ``TaskSpec`` or a path to a task YAML file. The starter code is scored ``runs``
    times with different evaluator seeds, as ``validate`` scores it (``run_evaluator``: sandboxed, the task's data and
    interpreter, its baseline program first when it has one); the recorded baseline must lie within four standard
    deviations of the fresh runs' mean, or within the task's ``baseline_tolerance`` (relative, default 0.1 %) of it.
    A difference whose cause the task states (``baseline_note``) is listed in ``known_differences``, not a problem.
    """
    spec = _load_task(task)
    report = TaskCheck(spec)
    report.problems.extend(_task_field_problems(spec))
    report.warnings.extend(_misspelt_field_warnings(spec))
    missing = [path for path in spec.starter_code if not spec.resolve_path(path).exists()]
    if missing:
        report.problems.append(f"starter files missing: {missing} (resolved against {spec.root})")
    starter_names = {Path(path).name for path in spec.starter_code}
    for path in spec.evaluation_paths + spec.baseline_paths:
        if Path(path).parts[0] not in starter_names:
            report.problems.append(f"{path!r} is not among the starter files {sorted(starter_names)}")
    if not spec.evaluation_paths:
        report.problems.append("no evaluation_paths: the task has no evaluator")
    report.problems.extend(_metric_name_problems(spec))
    if report.problems:
        return _conclude(report, raise_on_failure)
    for seed in range(runs):
        try:
            report.runs.append(EvaluationRun(seed, run_evaluator(spec, seed=seed)))
        except MLGymRegistryError as exc:
            report.problems.append(str(exc))
            return _conclude(report, raise_on_failure)
    report.problems.extend(_metric_name_problems(spec, report.runs[0].metrics if report.runs else None))
    _compare_baseline(report)
    return _conclude(report, raise_on_failure)


def _task_field_problems(spec: TaskSpec) -> list[str]:
    """What of the task's own fields breaks its episodes: an unknown ``task_entrypoint`` (every ``validate`` would
    fail), an empty description (the prompt's TASK DESCRIPTION would be empty), a component name nothing registered
    (``make`` would fail)."""
    import difflib

    from .registry import PATH_LOADERS, is_task_file, registry
    from .specs import COMPONENT_KINDS, TASK_ENTRYPOINTS

    problems = []
    if spec.task_entrypoint not in TASK_ENTRYPOINTS:
        close = difflib.get_close_matches(spec.task_entrypoint, TASK_ENTRYPOINTS, n=1, cutoff=0.6)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        problems.append(f"task_entrypoint {spec.task_entrypoint!r} is not one of MLGym's task classes "
                        f"({', '.join(TASK_ENTRYPOINTS)}), so no backend can evaluate the agent's work. {hint}Fix "
                        f"'task_entrypoint:' in the task file")
    if not str(spec.description or "").strip():
        problems.append("description is empty: the prompt's TASK DESCRIPTION would show nothing; describe the task "
                        "in 'description'")
    for kind in COMPONENT_KINDS:
        name = getattr(spec, kind)
        if name in registry.names(kind) or (kind in PATH_LOADERS and is_task_file(name) and Path(name).is_file()):
            continue
        try:
            registry.entry(kind, name)
        except KeyError as exc:  # UnknownNameError, with its did-you-mean
            problems.append(f"{exc} The task's '{kind}:' field names it: fix that name, or install the plugin that "
                            f"registers {name!r} (`mlgym-registry list --kind {kind}` shows the registered ones)")
    return problems


def _misspelt_field_warnings(spec: TaskSpec) -> list[str]:
    """A warning per key of the task file that looks like a misspelt field (``specs.misspelt_fields``)."""
    from .specs import misspelt_field_message, misspelt_fields

    where = spec.source or spec.id
    return [misspelt_field_message(where, key, name) for key, name in misspelt_fields(spec).items()]


def _metric_name_problems(spec: TaskSpec, metrics: dict[str, float] | None = None) -> list[str]:
    """Mismatches between the metric the task is rewarded on and its baseline (``metrics`` None) or what its
    evaluator printed (``metrics``): each would make every scored step an ``infra_error``."""
    from .components.rewards import baseline_metric_problem, evaluation_metric_problem

    problem = baseline_metric_problem(spec) if metrics is None else evaluation_metric_problem(metrics, spec)
    return [problem] if problem is not None else []


def _load_task(task: TaskSpec | str | Path) -> TaskSpec:
    from .registry import registry
    from .specs import TaskFieldWarning, load_task_yaml

    if isinstance(task, TaskSpec):
        return task
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskFieldWarning)  # check_task reports them itself
        if isinstance(task, Path) or str(task).endswith((".yaml", ".yml")):
            return load_task_yaml(task)
        return registry.spec(str(task))


def _compare_baseline(report: TaskCheck) -> None:
    spec = report.spec
    if not spec.baseline:
        report.problems.append("no baseline_scores recorded; run the evaluator on the starter code and record them")
        return
    from .evaluator_runs import compare_baseline

    comparison = compare_baseline(spec, [run.metrics for run in report.runs])
    report.notes.extend(comparison.lines)
    report.warnings.extend(comparison.unconfirmed)
    if comparison.mismatches and comparison.note:
        report.known_differences.extend(f"{line}: {comparison.note}" for line in comparison.mismatches)
    else:
        report.problems.extend(f"baseline does not match: {line}" for line in comparison.mismatches)


def _conclude(report: TaskCheck, raise_on_failure: bool) -> TaskCheck:
    if report.problems and raise_on_failure:
        raise ConformanceError(f"task {report.spec.id!r}: " + "; ".join(report.problems))
    return report


def run_evaluator(spec: TaskSpec, *, seed: int | None = None, timeout: float | None = None,
                  backend_options: dict[str, Any] | None = None) -> dict[str, float]:
    """The metrics ``validate`` gives the task's starter code, with the evaluator's seed ``seed``: a fresh sandboxed
    workspace of the local backend with the task's files, data and interpreter, the baseline program run first when
    the task has one (``mlgym_registry.evaluator_runs.baseline_command``), then the pristine evaluator."""
    from .evaluator_runs import score_starter

    return score_starter(spec, seed=seed, timeout=timeout, backend_options=backend_options)


# -- registered components and distributions ---------------------------------------------------------------------
@dataclass
class ComponentCheck:
    """The verdict on one registered component: ``status`` is ``"ok"``, ``"FAIL"`` (``reason`` says why) or
    ``"skip"`` (it cannot be checked on this machine, e.g. a backend whose runtime is missing)."""

    kind: str
    name: str
    distribution: str | None
    status: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        """False only when the component failed its check."""
        return self.status != "FAIL"

    def line(self) -> str:
        """One line for a terminal: ``ok   parser   tagged``, or ``FAIL reward   shaped (distribution my-dist):
        <reason>`` (a failure names the distribution to fix)."""
        text = f"{self.status:<4} {self.kind:<8} {self.name}"
        if self.status == "FAIL" and self.distribution:
            text += f" (distribution {self.distribution})"
        return f"{text}: {self.reason}" if self.reason else text


KIT_CHECKS: dict[str, Callable[..., None]] = {
    "parser": check_parser,
    "reward": check_reward_assigner,
    "template": check_template,
    "backend": check_backend,
    "history": check_history_processor,
}
"""The kit check run on a built component of each kind (isolators and tasks have their own handling in
``check_component``); a kind not listed here is only imported and built."""


def check_component(kind: str, name: str, *, registry: Any = None, parsers: list[str] | None = None,
                    runs: int = 3) -> ComponentCheck:
    """Import the registered ``name`` of ``kind`` (its lazy ``"pkg.module:attr"`` reference), build it and run the
    kit's check for its kind; never raises for the component's own faults, returns a ``ComponentCheck``.

    An isolator is checked with each parser named in ``parsers`` (default: the parsers its own distribution
    registered, or ``thought_action`` when it registered none), with responses in that parser's format. A task gets
    ``check_task`` with ``runs`` evaluator runs. Raises ``UnknownNameError`` when nothing of ``kind`` is ``name``.
    """
    from .errors import BackendUnavailable
    from .registry import registry as default_registry

    registry = registry or default_registry
    entry = registry.entry(kind, name)
    result = ComponentCheck(kind, name, entry.distribution, "ok")
    problem = _import_problem(entry)
    if problem is not None:
        result.status, result.reason = "FAIL", problem
        return result
    try:
        if kind == "task":
            report = check_task(registry.spec(name), runs=runs, raise_on_failure=False)
            if not report.ok:
                result.status, result.reason = "FAIL", "; ".join(report.problems)
            return result
        component = registry.build(kind, name)
        if kind == "isolator":
            for parser_name, parser in _isolator_parsers(registry, entry, parsers):
                try:
                    check_isolator(component, parser)
                except ConformanceError as exc:
                    raise ConformanceError(f"{exc} (checked with parser {parser_name!r})") from None
        elif kind == "backend":
            check_available = getattr(component, "check_available", None)
            if callable(check_available):
                check_available()
            check_backend(component)
        elif kind in KIT_CHECKS:
            KIT_CHECKS[kind](component)
    except BackendUnavailable as exc:
        result.status, result.reason = "skip", str(exc)
    except ConformanceError as exc:
        result.status, result.reason = "FAIL", str(exc)
    except Exception as exc:  # noqa: BLE001 - anything the component raises is its failure, reported, not raised
        result.status, result.reason = "FAIL", f"{type(exc).__name__}: {exc}"
    return result


def _import_problem(entry: Any) -> str | None:
    """Why ``entry``'s lazy reference does not import (naming the module), or None when it does or has none."""
    from .registry import import_reference, is_task_file, reference_fix

    target = entry.target
    if not isinstance(target, str) or (entry.kind == "task" and is_task_file(target)):
        return None
    module_name, _, attr = target.partition(":")
    try:
        importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - SyntaxError, ImportError, or whatever the module raises on import
        fix = reference_fix(target, exc) or "fix that module"
        return (f"cannot import module {module_name!r} (registered as {target!r}): {type(exc).__name__}: {exc}. "
                f"{fix[0].upper()}{fix[1:]}")
    try:
        import_reference(target)
    except AttributeError as exc:
        fix = reference_fix(target, exc) or f"{exc}"
        return f"module {module_name!r} has no attribute {attr!r} (registered as {target!r}). {fix}"
    return None


def _isolator_parsers(registry: Any, entry: Any, names: list[str] | None) -> list[tuple[str, Any]]:
    """The parsers to check an isolator with: ``names``, else its distribution's own, else ``thought_action``."""
    if names is None:
        names = [row.name for row in registry.describe("parser")
                 if entry.distribution is not None and row.distribution == entry.distribution]
    built = []
    for name in names:
        try:
            built.append((name, registry.build("parser", name)))
        except Exception:  # noqa: BLE001 - a parser that does not build fails its own check, not the isolator's
            continue
    if not built:
        from .components.parsers import ThoughtActionParser

        built = [("thought_action", ThoughtActionParser())]
    return built


def check_plugin(distribution: str, *, registry: Any = None, runs: int = 3) -> list[ComponentCheck]:
    """``check_component`` on every component the installed ``distribution`` registered (tasks included), plus one
    ``FAIL`` row of kind ``plugin`` for each of its plugins that failed to load.

    Raises ``UnknownNameError`` (with close matches) when no loaded plugin comes from ``distribution``.
    """
    from .errors import UnknownNameError
    from .registry import registry as default_registry

    registry = registry or default_registry
    plugins = registry.plugins()
    rows = registry.describe()
    known = {row["distribution"] for row in plugins if row["distribution"]}
    known |= {row.distribution for row in rows if row.distribution}
    wanted = _normalised_dist(distribution)
    matches = [name for name in known if _normalised_dist(name) == wanted]
    if not matches:
        raise UnknownNameError("distribution", distribution, known,
                               "See `mlgym-registry plugins` for the installed ones.")
    dist = matches[0]
    results = [ComponentCheck("plugin", row["name"], dist, "FAIL", row["error"])
               for row in plugins if row["distribution"] == dist and row["error"]]
    results += [ComponentCheck("plugin", row["name"], dist, "FAIL", refusal)
                for row in plugins if row["distribution"] == dist for refusal in row.get("refused", ())]
    results += [check_component(row.kind, row.name, registry=registry, runs=runs)
                for row in rows if row.distribution == dist]
    return results


def _normalised_dist(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# -- pytest fixture ----------------------------------------------------------------------------------------------
def _registered_plugin() -> Iterator[Callable[..., Any]]:
    from .registry import registry as default_registry

    added: list[tuple[Any, str]] = []

    def add(plugin: object, name: str | None = None, *, registry: Any = None) -> Any:
        """Load ``plugin`` (a module or object with ``@hookimpl`` functions) into the registry for this test."""
        target = registry or default_registry
        installed = target.plugin_info(plugin)
        if installed is not None:  # loaded already from its entry point (the plugin is pip-installed): keep it as is
            return installed
        plugin_name = name or getattr(plugin, "__name__", None) or f"test-plugin-{id(plugin)}"
        info = target.add_plugin(plugin, name=plugin_name)
        added.append((target, plugin_name))
        if info.error:
            raise ConformanceError(f"plugin {plugin_name!r} failed to load: {info.error}")
        return info

    try:
        yield add
    finally:
        for target, plugin_name in reversed(added):
            target.remove_plugin(plugin_name)


try:
    import pytest
except ImportError:  # pytest is only needed by people testing plugins
    registered_plugin = None
else:
    registered_plugin = pytest.fixture(_registered_plugin)
    registered_plugin.__doc__ = (
        "A pytest fixture: ``registered_plugin(plugin, name=None)`` loads ``plugin`` into the registry for the "
        "current test and removes it, with everything it registered, when the test ends. A plugin the registry "
        "loaded already from its entry point (installed with pip) is left as it is, and its ``PluginInfo`` returned."
    )
