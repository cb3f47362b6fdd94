"""Prompt template sets: ``mlgym_default`` (our own wording) and MLGym agent YAML files loaded by path.

Templates are ``str.format`` strings with MLGym's placeholders: the system template takes ``{command_docs}``, the
tool variables (``{WINDOW}``) and the task fields (``{training_timeout}``); the turn templates take ``{description}``,
``{observation}`` and the status-block fields below. Every template may also use ``{format_instructions}``: how to
write a reply in the format of the task's parser (``format_reply_instructions``), which ``mlgym_default`` shows under
HOW TO REPLY, so that swapping the parser changes what the model is told.

To use your own MLGym agent config, register it as a template by path::

    from mlgym_registry import registry
    from mlgym_registry.components.templates import load_agent_yaml, template_from_path

    registry.register("template", "mine", lambda: load_agent_yaml("configs/agents/my_agent.yaml"))
    # or, picklable and lazy:
    registry.register("template", "mine", template_from_path("configs/agents/my_agent.yaml"))
    env = registry.make("prisonersDilemma", template="mine")
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..specs import read_yaml_mapping
from .template_set import TemplateSet

STATUS_BLOCK = """\
(Current Step: {current_step}, Remaining Steps: {remaining_steps})
(Open file: {open_file})
(Current directory: {working_dir})
bash-$"""
"""The status block that ends every turn message: an interface format (TorchRL's regexes read it)."""

TEMPLATE_FIELDS = (
    "system_template",
    "task_template",
    "next_step_template",
    "next_step_no_output_template",
    "strategy_template",
    "demonstration_template",
    "format_error_template",
)
"""The keys of an MLGym agent config that hold templates (the fields of ``TemplateSet`` besides ``name``)."""

_SYSTEM = """\
You are an autonomous machine-learning researcher working alone in a Linux shell. You improve a solution to a
research task step by step: read the files, change the code, run experiments and check the results. There is no
human to answer questions, so decide for yourself and keep going until the task is done.

The workspace comes with a file viewer that shows {WINDOW} lines of the open file at a time, and with the commands
listed below, on top of ordinary bash commands.

AVAILABLE COMMANDS:
{command_docs}

Mind the indentation when you edit a file: the replacement text is written exactly as you give it, so a Python line
needs all of its leading spaces.

HOW TO REPLY
{format_instructions}

Send one command per reply and wait for its output before sending the next one; put any further commands in later
replies. Multi-line commands such as edit and insert count as one command.

Interactive programs (vim, nano, a Python REPL, anything that waits for keyboard input) are not available: use the
commands above, or scripts that run to completion. A training or evaluation run is stopped after {training_timeout}
seconds and any other command much sooner, so keep every run within that limit.

Use `validate` whenever you want to measure your current solution: it checks the submission artefact and reports its
score next to the baseline's, and you may run it as often as you like. When you are satisfied with the score, run
`submit`: it ends the task and scores your final solution. If you run out of steps, the current workspace is
submitted for you.

A few habits that help:
- Read the task description and the starter files before changing anything.
- When an edit fails or a command returns an error, read the message and fix the cause rather than repeating it.
- Open a file at the line you care about (`open <file> <line>`, or `goto`) instead of scrolling through it.
- Create new scripts in their own files (`create`), then run them with python.
- Keep an eye on the remaining steps and submit before they run out."""

_TASK = """\
We are now starting the task below. Work in the workspace, validate your solution as you go and submit it when you
are done.

TASK DESCRIPTION:
{description}

Reply in the format described in the system message: one command per reply.

""" + STATUS_BLOCK

_NEXT_STEP = "{observation}\n" + STATUS_BLOCK

_NEXT_STEP_NO_OUTPUT = "Your command finished and printed nothing.\n" + STATUS_BLOCK

_DEMONSTRATION = """\
Here is an example of a complete episode on another task, for reference only:
--- EXAMPLE START ---
{demonstration}
--- EXAMPLE END ---"""


def mlgym_default() -> TemplateSet:
    """The default template set: MLGym's fields, placeholders and status block, in our own wording.

    The system template shows the parser's ``{format_instructions}`` under HOW TO REPLY, and ``format_error_template``
    is left unset so that the parser's own ``format_error_message`` explains the format it expects (see
    ``format_error_message``): the whole prompt follows the task's parser.
    """
    return TemplateSet(
        name="mlgym_default",
        system_template=_SYSTEM,
        task_template=_TASK,
        next_step_template=_NEXT_STEP,
        next_step_no_output_template=_NEXT_STEP_NO_OUTPUT,
        demonstration_template=_DEMONSTRATION,
    )


_SHORT_SYSTEM = """\
You work alone in a Linux shell on the task the next message gives. Besides bash, you can use these commands:
open <path> [<line>], goto <line>, scroll_up, scroll_down, create <file>, search_dir <text> [<dir>],
search_file <text> [<file>], find_file <name> [<dir>], edit <start>:<end> (new text, then a line end_of_edit),
insert <line> (new text, then a line end_of_insert), validate (scores your solution), submit (final; ends the task).

{format_instructions}"""

_SHORT_TASK = "TASK:\n{description}\n\n" + STATUS_BLOCK


def short() -> TemplateSet:
    """A short template set for training small models: the commands' signatures in one paragraph instead of the
    full ``{command_docs}``, the parser's ``{format_instructions}``, the task and MLGym's status block.

    Same tool language and turn templates as ``mlgym_default``, so every parser and tool works unchanged; about a
    tenth of its length in tokens.
    """
    return TemplateSet(
        name="short",
        system_template=_SHORT_SYSTEM,
        task_template=_SHORT_TASK,
        next_step_template=_NEXT_STEP,
        next_step_no_output_template=_NEXT_STEP_NO_OUTPUT,
    )


GENERIC_FORMAT_INSTRUCTIONS = (
    "Every reply holds a short explanation of what you intend to do, then exactly one command to run, written in "
    "the format this environment reads commands in."
)
"""``{format_instructions}`` for a parser that describes its format neither with ``format_instructions`` nor with
``format_action``."""


def format_reply_instructions(parser: Any) -> Any:
    """What ``{format_instructions}`` shows for ``parser`` (the chain checks that the result is a string).

    The parser's ``format_instructions`` when it declares them (not None); else, when it declares
    ``format_action(action)``, a sentence with ``format_action("ls -a")`` as the example; else
    ``GENERIC_FORMAT_INSTRUCTIONS``. A str comes back with trailing blank space removed.
    """
    text = getattr(parser, "format_instructions", None)
    if text is None:
        write = getattr(parser, "format_action", None)
        if not callable(write):
            return GENERIC_FORMAT_INSTRUCTIONS
        example = write("ls -a")
        if not isinstance(example, str):
            return example
        text = ("Every reply holds exactly one command to run, in the format shown here for the command `ls -a`:\n\n"
                + example)
    return text.rstrip() if isinstance(text, str) else text


def format_error_message(templates: TemplateSet, parser: Any = None) -> str:
    """The message that asks the model to retry after a format error.

    The template set's ``format_error_template`` when it has one, else the parser's ``format_error_message``, else a
    generic request.
    """
    if templates.format_error_template:
        return templates.format_error_template
    message = getattr(parser, "format_error_message", None)
    if message:
        return message
    return "Your reply could not be used: no command was run. Please answer again in the expected format.\n"


class AgentConfigError(ValueError):
    """An MLGym agent config that cannot be used as a template set."""


def load_agent_yaml(path: str | Path, name: str | None = None) -> TemplateSet:
    """Load the templates of an MLGym agent config YAML (``configs/agents/*.yaml``) as a ``TemplateSet``.

    Reads ``system_template``, ``task_template``, ``next_step_template``, ``next_step_no_output_template``,
    ``strategy_template``, ``demonstration_template`` and ``format_error_template``; other keys (tools, parser,
    history processor, ...) are ignored. The set is named after the file (``default.yaml`` -> ``"default"``) unless
    ``name`` is given.
    """
    path = Path(path)
    data = read_yaml_mapping(path, "agent config", AgentConfigError)
    fields: dict[str, str | None] = {}
    for key in TEMPLATE_FIELDS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise AgentConfigError(f"agent config {str(path)!r}: {key} must be a string, got {type(value).__name__}")
        fields[key] = value
    missing = [key for key in ("system_template", "task_template") if not fields[key]]
    if missing:
        raise AgentConfigError(
            f"agent config {str(path)!r} has no {' or '.join(missing)}; MLGym agent configs need both "
            f"(found keys: {', '.join(sorted(map(str, data))) or 'none'})"
        )
    return TemplateSet(name=name or path.stem, **fields)  # type: ignore[arg-type]


def template_from_path(path: str | Path, name: str | None = None) -> Callable[[], TemplateSet]:
    """A lazy, picklable template factory for ``registry.register("template", ...)`` that loads ``path`` when used.

    The path is made absolute now, so the factory still works after the working directory changes.
    """
    return functools.partial(load_agent_yaml, str(Path(path).resolve()), name)
