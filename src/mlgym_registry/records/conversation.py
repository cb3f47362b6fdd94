"""Reading a conversation: who said what, the assistant's thought and action, and what the action printed.

``format_conversation(source)`` turns any of these into text (``print_conversation`` prints it, with terminal control
characters escaped):

- a recorded ``.traj`` (its path, the loaded ``Trajectory`` or its JSON object): the system and task messages, then
  for every step the assistant's thought and action and the command's raw observation, then how the episode ended;
- the env's conversation: a tensordict the env returned (``env.reset()``, ``env.step_mdp(td)``,
  ``rollout[0, -1]["next"]``), its TorchRL ``History``, or ``[{"role", "content"}, ...]`` dicts: every message, the
  assistant's answers split into thought and action by a parser (``thought_action`` by default).

``render_chat(source)`` renders the same messages with a chat template and no tokenizer needed: TorchRL's
``History.apply_chat_template`` takes a ``tokenizer`` keyword it cannot do without, and this package does not change
TorchRL's classes. Reading a ``.traj`` imports neither torch nor TorchRL.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import FormatError
from .trajectories import TRAJ_KEYS, Trajectory, load_traj, trajectory_from_dict

DEFAULT_PARSER = "thought_action"
"""The parser that splits an assistant message of the env's conversation into thought and action."""

HISTORY_KEYS: tuple[Any, ...] = ("conversation", ("history", "prompt"), "history")
"""Where a tensordict of the env keeps its conversation: the whole one when a history processor shapes what the policy
sees, the default layout's, the seed layout's."""


@dataclass
class Block:
    """One message of a conversation as shown: a title and its named parts (``""`` for the message's text)."""

    title: str
    parts: list[tuple[str, str]] = field(default_factory=list)


def format_conversation(source: Any, *, parser: Callable[[str], tuple[str, str]] | str | None = DEFAULT_PARSER,
                        max_chars: int | None = None) -> str:
    """``source`` (a ``.traj`` or the env's conversation, see the module docstring) as readable text.

    Args:
        source: a ``.traj`` path, ``Trajectory`` or its JSON object; or a tensordict, ``History`` or message dicts.
        parser: splits the env's assistant messages into thought and action (a registered parser's name or a
            callable; None shows them whole). A ``.traj`` records both already.
        max_chars: show at most this many characters of each part, its head and tail (None: everything).
    """
    return "\n".join(_format_block(block, max_chars) for block in conversation_blocks(source, parser=parser))


def print_conversation(source: Any, *, file: IO[str] | None = None, **options: Any) -> None:
    """Print ``format_conversation(source, **options)`` with control characters escaped (``terminal.printable``)."""
    from ..terminal import printable

    print(printable(format_conversation(source, **options)), file=file or sys.stdout)


def render_chat(source: Any, *, tokenizer: Any = None, chat_template_name: str | None = None,
                add_generation_prompt: bool = True) -> str:
    """The env's conversation (a tensordict, ``History`` or message dicts) rendered with a chat template, as the
    chain renders ``("text", "prompt")``: the tokenizer's template, or one TorchRL names (``chat_template_name``),
    else ``chatml_format``. Unlike ``History.apply_chat_template``, ``tokenizer`` may be None."""
    from ..transforms.rendering import ChatRenderer

    renderer = ChatRenderer(tokenizer=tokenizer, chat_template_name=chat_template_name)
    return renderer.render(messages_of(source), add_generation_prompt=add_generation_prompt)


def conversation_blocks(source: Any, *, parser: Callable[[str], tuple[str, str]] | str | None = DEFAULT_PARSER,
                        ) -> list[Block]:
    """The ``Block`` of every message of ``source`` (see ``format_conversation``)."""
    trajectory = _trajectory(source)
    if trajectory is not None:
        return trajectory_blocks(trajectory)
    return message_blocks(messages_of(source), parser=_parser(parser))


def messages_of(source: Any) -> list[dict[str, str]]:
    """The ``{"role", "content"}`` dicts of the env's conversation in ``source``: message dicts, a ``History`` or a
    tensordict holding one (under ``HISTORY_KEYS``)."""
    if isinstance(source, list):
        return [{"role": str(m.get("role", "")), "content": str(m.get("content") or "")} for m in source]
    from tensordict import TensorDictBase

    from ..transforms.history import History, as_dicts

    if isinstance(source, History):
        return as_dicts(source)
    if isinstance(source, TensorDictBase):
        keys = source.keys(include_nested=True)
        for key in HISTORY_KEYS:
            if key in keys and isinstance(source.get(key), History):
                return as_dicts(source.get(key))
    raise TypeError(f"cannot read a conversation from {type(source).__name__}; pass a .traj path, a Trajectory, "
                    "a tensordict of the env, a History or a list of {'role', 'content'} dicts")


def trajectory_blocks(trajectory: Trajectory) -> list[Block]:
    """A ``.traj`` as blocks: the messages before the first step, each step's thought, action and observation, and
    how the episode ended."""
    blocks = []
    for message in trajectory.history:
        if message.get("role") == "assistant":
            break
        blocks.append(Block(str(message.get("role", "")), [("", str(message.get("content") or ""))]))
    for index, step in enumerate(trajectory.steps, start=1):
        parts = [("thought", step.thought or ""), ("action", step.action or "")]
        blocks.append(Block(f"assistant (step {index})", parts))
        blocks.append(Block(f"observation (step {index})", [("", step.observation or "")]))
    ending = [(key, str(trajectory.info[key])) for key in ("exit_status", "score", "evaluations")
              if key in trajectory.info]
    if ending:
        blocks.append(Block("end", ending))
    return blocks


def message_blocks(messages: list[dict[str, str]], *, parser: Callable[[str], tuple[str, str]] | None) -> list[Block]:
    """Message dicts as blocks; an assistant message is split into thought and action by ``parser`` when it can.

    Whatever the parser does with a message (``FormatError``, a third party's ``RecursionError``, a value that is not
    two strings), the message is shown: as plain text, titled with what went wrong."""
    blocks = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "assistant" and parser is not None:
            blocks.append(_assistant_block(parser, content))
        else:
            blocks.append(Block(role, [("", content)]))
    return blocks


def _assistant_block(parser: Callable[[str], tuple[str, str]], content: str) -> Block:
    """``content`` split by ``parser`` into thought and action, or shown whole when the parser cannot split it."""
    try:
        value = parser(content)
    except FormatError:
        return Block("assistant (no action)", [("", content)])
    except Exception as exc:  # noqa: BLE001 - a broken parser must not keep a conversation from being shown
        return Block(f"assistant (shown as text: the parser raised {type(exc).__name__})", [("", content)])
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(part, str) for part in value)):
        return Block("assistant (shown as text: the parser returned no (thought, action) pair)", [("", content)])
    thought, action = value
    return Block("assistant", [("thought", thought), ("action", action)])


def _trajectory(source: Any) -> Trajectory | None:
    if isinstance(source, Trajectory):
        return source
    if isinstance(source, (str, os.PathLike)):
        return load_traj(Path(source))
    if isinstance(source, dict) and all(key in source for key in TRAJ_KEYS):
        return trajectory_from_dict(source)
    return None


def _parser(parser: Callable[[str], tuple[str, str]] | str | None) -> Callable[[str], tuple[str, str]] | None:
    if isinstance(parser, str):
        from ..registry import registry

        return registry.get("parser", parser)
    return parser


def _format_block(block: Block, max_chars: int | None) -> str:
    lines = [f"=== {block.title} ==="]
    for name, text in block.parts:
        if name:
            lines.append(f"--- {name} ---")
        lines.append(_cut(text.rstrip("\n"), max_chars))
    return "\n".join(lines) + "\n"


def _cut(text: str, limit: int | None) -> str:
    """``text``, or its head and tail around a line saying how many characters were left out."""
    if limit is None or len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return f"{text[:head]}\n[... {len(text) - head - tail:,} characters cut ...]\n{text[len(text) - tail:]}"
