"""Conformance checks for prompt templates: the placeholders each template gets from the env."""

from __future__ import annotations

import string
from typing import Any

from ..specs import TaskSpec
from ._common import _fail, _name
from .rewards import _example_spec

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
    from ..components.template_set import TemplateSet

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
