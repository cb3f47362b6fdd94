"""Native tool calling: MLGym's commands as JSON-schema tools, and tool calls read back into backend actions.

Models served behind a chat API call tools through function calling (``tool_calls`` in OpenAI's wire format); models
sampled directly (tokens mode) write the same calls as text, the way tool-aware chat templates render them (Qwen,
Hermes and TorchRL's ``qwen`` template)::

    <tool_call>
    {"name": "open", "arguments": {"path": "strategy.py"}}
    </tool_call>

That text form is the one place a tool call lives in the env: the response, the assistant turn of the ``History`` and
the ``.traj`` all hold it, so replay, trajectories and every history processor work unchanged. The ``openai`` policy
writes the calls it receives in this form (with the call's ``id``, and ``arguments`` as the raw JSON string the API
gave, so malformed arguments reach the parser as they came). Where a chat template or an API needs structured
messages, ``structured_messages`` rebuilds them: an assistant message with ``tool_calls`` and one ``tool`` message
(with its ``tool_call_id``) per call.

- ``tool_schemas()``: the tools in OpenAI's ``tools`` format, built from the tool set's own documentation
  (``tool_language/commands.yaml``, which also renders ``{command_docs}``), plus ``bash`` for any shell command.
- ``ToolCallParser`` (parser ``tool_calls``): one tool call -> the command line the text language would give
  (``open 'strategy.py'``; ``edit 1:3`` with its body and ``end_of_edit``). No call, an unknown tool, arguments that
  are not a JSON object or do not fit the tool, and several calls are ``FormatError``: the chain retries (and applies
  ``reward_wrong_format``) as for the text parsers. It is linear in the reply and raises nothing else, however the
  reply is made: the blocks are found with ``str.find`` (no regex that backtracks over blank space), the JSON is read
  with ``bounded_json.loads`` (nesting measured before decoding: no ``RecursionError``), and every error message
  quotes the reply's text cut short.
- ``tool_calling()`` (template ``tool_calling``): a template set for tool-calling runs.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import bounded_json
from ..errors import FormatError
from ..tool_language import SPECIAL_ACTIONS
from .parsers import ThoughtActionParser
from .template_set import TemplateSet

BASH_TOOL = "bash"
"""The tool that runs any shell command (the text language's bare command)."""


NO_TOOL_CALL = "No tool call found in the model response: call exactly one tool."

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PLACEHOLDER = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>")

JsonSchema = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One call as the response holds it: ``arguments`` is an object, or the raw JSON string an API sent."""

    name: str
    arguments: Any
    id: str | None = None


# -- the tools -----------------------------------------------------------------------------------------------------
def _commands() -> list[dict[str, Any]]:
    from .. import tool_language as toolset

    return toolset.commands()


@functools.lru_cache(maxsize=1)
def tool_schemas() -> tuple[JsonSchema, ...]:
    """The tools in OpenAI's ``tools`` format: every documented tool command, then ``bash``."""
    from ..tool_language import ENV_VARIABLES

    tools = [_schema(command, ENV_VARIABLES) for command in _commands()]
    tools.append(_function(BASH_TOOL, "runs a shell command in the workspace (any bash command, or a tool command "
                                      "written as text) and shows its output",
                           {"command": {"type": "string", "description": "the command line to run"}}, ["command"]))
    return tuple(tools)


def _schema(command: Mapping[str, Any], variables: Mapping[str, str]) -> JsonSchema:
    arguments = command.get("arguments") or {}
    properties = {name: {"type": arg["type"], "description": arg["description"]} for name, arg in arguments.items()}
    required = [name for name, arg in arguments.items() if arg.get("required")]
    return _function(command["name"], command["docstring"].format(**variables), properties, required)


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> JsonSchema:
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def tool_names() -> list[str]:
    """The names of the tools, in order."""
    return [tool["function"]["name"] for tool in tool_schemas()]


# -- reading calls out of a response -------------------------------------------------------------------------------
def encode_call(name: str, arguments: Any, call_id: str | None = None) -> str:
    """The text form of one call; ``arguments`` is an object or a JSON string (kept as given)."""
    body: dict[str, Any] = {"id": call_id} if call_id else {}
    body.update(name=name, arguments=arguments)
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def response_text(content: str | None, calls: Sequence[ToolCall]) -> str:
    """A response holding ``content`` (the thought) followed by ``calls`` in their text form."""
    parts = [content.strip()] if content and content.strip() else []
    parts += [encode_call(call.name, call.arguments, call.id) for call in calls]
    return "\n".join(parts)


def _blocks(response: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` span of each ``<tool_call>...</tool_call>`` block, left to right: an opening tag and the
    first closing tag after it. One pass of ``str.find`` (the regex ``<tool_call>\\s*(.*?)\\s*</tool_call>`` it replaces
    backtracked cubically over blank space: 2,000 spaces after an unclosed tag took 22 s)."""
    spans = []
    start = response.find(_OPEN)
    while start >= 0:
        close = response.find(_CLOSE, start + len(_OPEN))
        if close < 0:  # no closing tag after this opening one, so none after any later one either
            break
        end = close + len(_CLOSE)
        spans.append((start, end))
        start = response.find(_OPEN, end)
    return spans


def _problem(exc: ValueError) -> str:
    """What is wrong with an unreadable JSON text (``bounded_json.loads`` raises ``ValueError`` for all of it: invalid,
    nested too deep, an integer with too many digits), in a few words."""
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def read_calls(response: str) -> tuple[str, list[ToolCall]]:
    """``(thought, calls)`` of a response: the text outside the ``<tool_call>`` blocks, and each block's call.

    ``FormatError`` when a block is not a JSON object with a string ``name``. Linear in the response, and nothing
    but ``FormatError`` is raised, whatever the response holds.
    """
    calls = []
    spans = _blocks(response)
    for start, end in spans:
        block = response[start + len(_OPEN):end - len(_CLOSE)].strip()
        try:
            data = bounded_json.loads(block)
        except ValueError as exc:
            raise FormatError(f"A tool call is not valid JSON ({_problem(exc)}): {_cut(block)}") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise FormatError('A tool call must be a JSON object {"name": ..., "arguments": {...}}.')
        call_id = data.get("id")
        calls.append(ToolCall(data["name"], data.get("arguments", {}), call_id if isinstance(call_id, str) else None))
    if not spans:
        return response.strip(), calls
    pieces, last = [], 0
    for start, end in spans:
        pieces.append(response[last:start])
        last = end
    pieces.append(response[last:])
    return "".join(pieces).strip(), calls


def _cut(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters for an error message (a reply may be a megabyte)."""
    return text if len(text) <= limit else text[:limit] + "..."


def calls_in(response: str) -> list[ToolCall]:
    """The calls of a response, or ``[]`` when it has none or one of its blocks cannot be read."""
    try:
        return read_calls(response)[1]
    except FormatError:
        return []


def decode_arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as a dict; ``FormatError`` for bad JSON or anything but an object."""
    arguments = call.arguments
    name = _cut(call.name, 100)
    if isinstance(arguments, str):
        try:
            arguments = bounded_json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise FormatError(f"The arguments of the {name} call are not valid JSON ({_problem(exc)}): "
                              f"{_cut(call.arguments)}") from None
    if not isinstance(arguments, dict):
        raise FormatError(f"The arguments of the {name} call must be a JSON object, got {_cut(repr(arguments))}.")
    return arguments


# -- from a call to the command line -------------------------------------------------------------------------------
def command_line(name: str, arguments: Mapping[str, Any]) -> str:
    """The command line the text language gives for a call of tool ``name``; ``FormatError`` when it does not fit.

    It follows the tool's documented signature: ``open "<path>" [<line_number>]`` with ``{"path": "a b.py"}``
    gives ``open 'a b.py'``; the lines after an ``edit``'s or ``insert``'s first line are its body and end line.
    """
    if name == BASH_TOOL:
        _check_arguments(name, arguments, {"command": "string"}, ["command"])
        command = arguments["command"]
        if not command.strip():
            raise FormatError("The bash call's command is empty.")
        return command
    command = next((c for c in _commands() if c["name"] == name), None)
    if command is None:
        raise FormatError(f"Unknown tool {_cut(repr(name), 100)}. The tools are: {', '.join(tool_names())}.")
    spec = command.get("arguments") or {}
    values = _check_arguments(name, arguments, {key: arg["type"] for key, arg in spec.items()},
                              [key for key, arg in spec.items() if arg.get("required")])
    from ..tool_language import signature

    first, *rest = signature(command).split("\n")
    words = [_word(word, values) for word in first.split()]
    lines = [" ".join(word for word in words if word)]
    for line in rest:
        body = _PLACEHOLDER.fullmatch(line.strip())
        lines.append(str(values[body.group(1)]).removesuffix("\n") if body else line)
    return "\n".join(lines)


def _word(word: str, values: Mapping[str, Any]) -> str:
    """One word of a signature's first line, filled in; '' for an optional word whose argument is not given."""
    optional = word.startswith("[") and word.endswith("]")
    word = word.strip("[]")
    names = _PLACEHOLDER.findall(word)
    if optional and any(values.get(name) is None for name in names):
        return ""
    if len(names) == 1 and word.strip('"') == f"<{names[0]}>":
        value = values[names[0]]
        return shlex.quote(value) if isinstance(value, str) else str(value)
    return _PLACEHOLDER.sub(lambda match: str(values[match.group(1)]), word)


def _check_arguments(name: str, arguments: Mapping[str, Any], types: Mapping[str, str],
                     required: Sequence[str]) -> dict[str, Any]:
    unknown = sorted(set(arguments) - set(types))
    if unknown:
        shown = ", ".join(_cut(repr(key), 60) for key in unknown[:5]) + (f" (and {len(unknown) - 5} more)"
                                                                          if len(unknown) > 5 else "")
        raise FormatError(f"The {name} tool takes no argument {shown}; it takes: {', '.join(types) or 'none'}.")
    missing = [key for key in required if arguments.get(key) is None]
    if missing:
        raise FormatError(f"The {name} call misses its required argument(s) {', '.join(map(repr, missing))}.")
    values = {}
    for key, value in arguments.items():
        if value is not None:
            values[key] = _typed(name, key, value, types[key])
    return values


def _typed(name: str, key: str, value: Any, kind: str) -> Any:
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdecimal():  # isdigit() would let "²" through, which int() refuses
            try:
                return int(value)
            except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
                pass
        raise FormatError(f"The {name} call's {key!r} must be an integer, got {_cut(repr(value), 100)}.")
    if not isinstance(value, str):
        raise FormatError(f"The {name} call's {key!r} must be a string, got {_cut(repr(value), 100)}.")
    return value


# -- the parser ----------------------------------------------------------------------------------------------------
_INSTRUCTIONS = """\
Act by calling the tools you are given, exactly one tool call per reply; you may explain your reasoning briefly in
the reply's text. The tools are the commands listed above ({tools}); `bash` runs any other shell command. When you
write a tool call as text, use this form, with the call's arguments as a JSON object:

<tool_call>
{{"name": "bash", "arguments": {{"command": "ls -a"}}}}
</tool_call>
"""


class ToolCallParser:
    """One tool call in the response (native ``tool_calls``, in their text form) -> ``(thought, command line)``.

    ``tools`` is what the policy and the chat template are given (OpenAI's ``tools`` format); ``max_calls`` is how
    many calls one reply may hold (1: MLGym runs one command per step, so more is a format error). A response without
    any call that is one of MLGym's made-up exits (``exit_context``, ``exit_cost`` in a fenced block, as the
    ``openai`` policy and replay give them) is read as that action.
    """

    native_tools = True
    """Marks a parser whose calls the history answers with ``tool`` messages (``follow_up_roles``)."""

    def __init__(self, max_calls: int = 1):
        if max_calls != 1:
            raise ValueError("ToolCallParser(max_calls=...): only 1 is supported (one command per step)")
        self.max_calls = max_calls
        self.tools = [dict(tool) for tool in tool_schemas()]
        self.format_instructions = _INSTRUCTIONS.format(tools=", ".join(tool_names()))
        self.format_error_message = ("Your reply could not be used, no command was run: {error} Call exactly one "
                                     "of the tools you were given.")

    def __call__(self, response: str) -> tuple[str, str]:
        """``(thought, command line)`` of the response's one tool call; ``FormatError`` otherwise."""
        thought, calls = read_calls(response)
        if not calls:
            return _special_action(response)
        if len(calls) > self.max_calls:
            raise FormatError(f"The reply holds {len(calls)} tool calls; call exactly one tool per reply.")
        call = calls[0]
        return thought, command_line(call.name, decode_arguments(call))

    def format_action(self, action: str) -> str:
        """``action`` as a call of the ``bash`` tool, in the text form."""
        return encode_call(BASH_TOOL, {"command": action})

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _special_action(response: str) -> tuple[str, str]:
    try:
        thought, action = ThoughtActionParser()(response)
    except FormatError:
        raise FormatError(NO_TOOL_CALL) from None
    if action.strip() not in SPECIAL_ACTIONS:
        raise FormatError(NO_TOOL_CALL)
    return thought, action


def parser_tools(parser: Any) -> list[JsonSchema] | None:
    """The tools a parser exposes (its ``tools``), or None for a text-language parser."""
    tools = getattr(parser, "tools", None)
    return list(tools) if tools else None


def follow_up_roles(parser: Any, response: str) -> list[str]:
    """The roles of the messages that answer an assistant turn: one ``tool`` message per call when the parser calls
    tools natively and the turn holds readable calls, else one ``user`` message."""
    if getattr(parser, "native_tools", False):
        calls = calls_in(response)
        if calls:
            return ["tool"] * len(calls)
    return ["user"]


# -- structured messages for chat templates and APIs ---------------------------------------------------------------
def structured_messages(messages: Sequence[Mapping[str, Any]], *, json_arguments: bool = False) -> list[dict]:
    """``{"role", "content"}`` messages with tool calls in their text form -> chat messages with ``tool_calls``.

    An assistant message holding calls gets its thought as ``content`` and the calls as ``tool_calls``
    (``{"id", "type": "function", "function": {"name", "arguments"}}``); each following ``tool`` message gets the
    ``tool_call_id`` of the call it answers. ``arguments`` is a JSON string with ``json_arguments`` (OpenAI's wire
    format), else an object (what chat templates expect). A call without an id gets one from its position.
    """
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for index, message in enumerate(messages):
        role, content = str(message["role"]), message.get("content")
        if role == "assistant":
            try:
                thought, calls = read_calls(str(content or ""))
            except FormatError:
                calls = []
            if calls:
                ids = [call.id or f"call_{index}_{number}" for number, call in enumerate(calls)]
                out.append({"role": "assistant", "content": thought or None,
                            "tool_calls": [_structured_call(call, ids[n], json_arguments) for n, call in
                                           enumerate(calls)]})
                pending = ids
                continue
            pending = []
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": pending.pop(0) if pending else f"call_{index}",
                        "content": content})
            continue
        out.append({"role": role, "content": content})
    return out


def trailing_tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``tool`` messages that end ``messages``, structured (each with its ``tool_call_id``)."""
    structured = structured_messages(messages)
    start = len(structured)
    while start > 0 and structured[start - 1]["role"] == "tool":
        start -= 1
    return structured[start:]


def _structured_call(call: ToolCall, call_id: str, json_arguments: bool) -> dict[str, Any]:
    arguments = call.arguments
    if json_arguments and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not json_arguments and isinstance(arguments, str):
        try:
            arguments = bounded_json.loads(arguments)
        except ValueError:
            pass  # a malformed call is shown as it was made
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def template_renders_tools(template: str) -> bool:
    """Whether a chat template renders structured tool calls (it reads ``tool_calls``)."""
    return "tool_calls" in template


# -- the template set ----------------------------------------------------------------------------------------------
_SYSTEM = """\
You are an autonomous machine-learning researcher working alone in a Linux shell. You improve a solution to a
research task step by step: read the files, change the code, run experiments and check the results. There is no
human to answer questions, so decide for yourself and keep going until the task is done.

You act through tools. The file viewer shows {WINDOW} lines of the open file at a time; edit and insert change the
open file, and the text you give them is written exactly as given, so mind the indentation.

AVAILABLE COMMANDS:
{command_docs}

HOW TO REPLY
{format_instructions}
Use `validate` whenever you want to measure your current solution: it reports its score next to the baseline's. When
you are satisfied, call `submit`: it ends the task. A training or evaluation run is stopped after {training_timeout}
seconds and any other command much sooner."""


def tool_calling() -> TemplateSet:
    """The template set of tool-calling runs: ``mlgym_default``'s turns (so a ``tool`` message holds the command's
    output and MLGym's status block) and a system message that speaks of tools."""
    from .templates import mlgym_default

    default = mlgym_default()
    return TemplateSet(
        name="tool_calling",
        system_template=_SYSTEM,
        task_template=default.task_template,
        next_step_template=default.next_step_template,
        next_step_no_output_template=default.next_step_no_output_template,
    )
