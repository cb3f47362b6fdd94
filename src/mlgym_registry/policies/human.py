"""A person at the terminal plays the agent: the prompt is printed and the command is read from the keyboard."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from ..terminal import printable
from .base import Messages, Policy, PolicyExhausted, fenced, last_user_message

BLOCK_ENDS = {"edit": "end_of_edit", "insert": "end_of_insert"}


class HumanPolicy(Policy):
    """Reads one command per turn. ``edit``/``insert`` read on until their ``end_of_*`` line; a line starting with
    a fence reads a whole response up to the closing fence. A bare command is wrapped in a fenced block for you."""

    name = "human"
    interactive = True

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None, show_system: bool = False):
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.show_system = show_system
        self._format_action = None  # the task's parser's, when it has one: the typed command in its format

    def reset(self, spec: Any = None) -> None:
        """Write commands the way the episode's parser reads them (its ``format_action``), MLGym's fenced block
        when it has none."""
        self._format_action = None
        if spec is not None:
            from ..registry import registry

            try:
                parser = registry.component(spec, "parser")
            except Exception:  # noqa: BLE001 - an unknown parser fails at make with its own message
                return
            self._format_action = getattr(parser, "format_action", None)

    def respond(self, messages: Messages) -> str:
        """Show the latest prompt, read the person's command."""
        if self.show_system and len(messages) <= 2 and messages and messages[0].get("role") == "system":
            self._print(str(messages[0].get("content", "")))
        self._print(last_user_message(messages))
        first = self._readline("> ")
        if first.startswith("```"):
            return "\n".join([first, *self._read_until(lambda line: line.strip() == "```")])
        command = first.split(maxsplit=1)[0] if first.strip() else ""
        lines = [first]
        if command in BLOCK_ENDS:
            end = BLOCK_ENDS[command]
            lines += self._read_until(lambda line: line.strip() == end)
        command_text = "\n".join(lines)
        if self._format_action is not None:
            return self._format_action(command_text)
        return fenced("(typed by a person)", command_text)

    def _read_until(self, is_last) -> list[str]:
        lines = []
        while True:
            line = self._readline("")
            lines.append(line)
            if is_last(line):
                return lines

    def _readline(self, prompt: str) -> str:
        if prompt:
            self.stdout.write(prompt)
            self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise PolicyExhausted("the input ended (end of file) before the episode did")
        return line.rstrip("\n")

    def _print(self, text: str) -> None:
        self.stdout.write(printable(text.rstrip("\n")) + "\n")  # prompts hold command output
        self.stdout.flush()
