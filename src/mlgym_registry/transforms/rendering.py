"""Rendering a conversation with a chat template, offline, and growing the rendered prompt one turn at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchrl.data.llm.history import _CHAT_TEMPLATES

DEFAULT_CHAT_TEMPLATE = "chatml_format"

_PROBE = [
    {"role": "system", "content": "probe system"},
    {"role": "user", "content": "probe user 1"},
    {"role": "assistant", "content": "probe assistant 1"},
    {"role": "user", "content": "probe user 2"},
    {"role": "assistant", "content": "probe assistant 2"},
    {"role": "user", "content": "probe user 3"},
]
_SENTINEL = "\x00end-of-turn probe\x00"


def load_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` itself, or the tokenizer saved at a local path (never downloaded)."""
    if tokenizer is None or not isinstance(tokenizer, (str, Path)):
        return tokenizer
    path = Path(tokenizer).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"tokenizer={str(tokenizer)!r} is not a local path; pass a tokenizer object or the folder a tokenizer "
            "was saved to (tokenizer.save_pretrained(folder)); nothing is downloaded"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def chat_template_names() -> list[str]:
    """The chat templates TorchRL knows by name."""
    return sorted(_CHAT_TEMPLATES)


class ChatRenderer:
    """Renders ``[{"role", "content"}, ...]`` with a chat template: the tokenizer's, or one TorchRL names.

    With ``tools`` (a tool-calling parser's), the template gets them as ``tools``, and, when it renders structured
    tool calls, the messages as ``structured_messages`` makes them (assistant ``tool_calls``, ``tool_call_id``).

    ``chat_template_name`` wins over the tokenizer's own template; with neither, TorchRL's ``chatml_format``. Without
    a tokenizer the template is rendered with transformers' jinja renderer and empty special tokens.
    """

    def __init__(self, tokenizer: Any = None, chat_template_name: str | None = None,
                 tools: list[dict[str, Any]] | None = None):
        self.tokenizer = load_tokenizer(tokenizer)
        self.tools = tools or None
        """The JSON-schema tools of a tool-calling parser: given to the template, which may list them."""
        if chat_template_name is not None:
            if chat_template_name not in _CHAT_TEMPLATES:
                raise ValueError(
                    f"unknown chat_template_name {chat_template_name!r}; "
                    f"TorchRL knows {', '.join(chat_template_names())}"
                )
            self.template = _CHAT_TEMPLATES[chat_template_name]
            self.template_name: str | None = chat_template_name
        elif self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            self.template = self.tokenizer.chat_template
            self.template_name = None
        else:
            self.template = _CHAT_TEMPLATES[DEFAULT_CHAT_TEMPLATE]
            self.template_name = DEFAULT_CHAT_TEMPLATE
        self.end_of_turn = self._end_of_turn()

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's prompt text."""
        extra: dict[str, Any] = {}
        if self.tools:
            from ..components.tool_calling import structured_messages, template_renders_tools

            extra["tools"] = self.tools
            if template_renders_tools(self.template):
                messages = structured_messages(messages)
        if self.tokenizer is not None:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt,
                **extra,
            )
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(
            conversations=[messages],
            chat_template=self.template,
            **extra,
            add_generation_prompt=add_generation_prompt,
            bos_token="",
            eos_token="",
            pad_token="",
            unk_token="",
        )
        return rendered[0]

    def _end_of_turn(self) -> str:
        """The text the template puts right after an assistant turn's content (e.g. ``<|im_end|>``)."""
        text = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}], False)
        after = text.split(_SENTINEL, 1)[1].strip() if _SENTINEL in text else ""
        eos = getattr(self.tokenizer, "eos_token", None) if self.tokenizer is not None else None
        return after or (eos or "")

    def assistant_content(self, response: str) -> str:
        """The assistant turn's content in a generated ``response``: up to the end-of-turn marker or end of text."""
        if self.end_of_turn and self.end_of_turn in response:
            response = response.split(self.end_of_turn, 1)[0]
        tokenizer = self.tokenizer
        for token in (getattr(tokenizer, "eos_token", None), getattr(tokenizer, "pad_token", None)):
            if token and token in response:
                response = response.split(token, 1)[0]
        return response


class IncrementalPrompt:
    """The rendered prompt of one conversation, extended by rendering only the new turns.

    Each extension renders a small window (the first message, the last rendered one and the new ones) and appends
    the difference, so its cost does not grow with the conversation. Templates for which that difference is not
    exact (checked once on a probe conversation) are re-rendered in full instead. ``rewind`` goes back to an earlier
    extension, for a conversation whose later messages changed (a history processor's view).
    """

    def __init__(self, renderer: ChatRenderer):
        self.renderer = renderer
        self.messages: list[dict[str, str]] = []
        self.base = ""
        self.prompt = ""
        self.marks: list[tuple[int, int]] = []
        """``(messages, len(base))`` after each ``start`` and ``extend``: the points ``rewind`` can go back to."""
        self.unchanged = 0
        """How many leading characters the last prompt shares with the one before it, as far as this knows."""
        self.incremental = self._check_incremental()

    def _check_incremental(self) -> bool:
        try:
            self.incremental = True
            self.start(_PROBE[:2])
            self.extend(_PROBE[2:4])
            self.extend(_PROBE[4:])
            return self.prompt == self.renderer.render(_PROBE, True)
        except Exception:
            return False

    def start(self, messages: list[dict[str, str]]) -> str:
        """Render ``messages`` in full and remember them."""
        self.messages = list(messages)
        self.base = self.renderer.render(self.messages, False)
        self.prompt = self.renderer.render(self.messages, True)
        self.marks = [(len(self.messages), len(self.base))]
        self.unchanged = 0
        return self.prompt

    def rewind(self, keep: int) -> int:
        """Forget the messages after the last extension point at or before ``keep`` messages; return how many are
        left (0: none, start again). The prompt's first ``unchanged`` characters stay valid."""
        marks = self.marks
        while marks and marks[-1][0] > keep:
            marks.pop()
        if not marks or marks[-1][0] == 0:
            self.marks, self.messages, self.base = [], [], ""
            return 0
        count, length = marks[-1]
        del self.messages[count:]
        self.base = self.base[:length]
        self.unchanged = length
        return count

    def extend(self, new: list[dict[str, str]], split: int | None = None) -> str:
        """The prompt after appending ``new`` turns; ``split`` (0 < split < len(new)) also marks the point after the
        first ``split`` of them, for a later ``rewind`` there (one more small render)."""
        if not self.incremental or not self.messages:
            return self.start(self.messages + list(new))
        new = list(new)
        anchor = [self.messages[0]] + ([self.messages[-1]] if len(self.messages) > 1 else [])
        render = self.renderer.render
        before = render(anchor, False)
        middle = render(anchor + new[:split], False) if split is not None and 0 < split < len(new) else None
        after = render(anchor + new, False)
        with_prompt = render(anchor + new, True)
        if not (after.startswith(before) and with_prompt.startswith(after)):
            return self.start(self.messages + new)
        if middle is not None and before != middle and after.startswith(middle) and middle.startswith(before):
            self.marks.append((len(self.messages) + split, len(self.base) + len(middle) - len(before)))
        self.messages.extend(new)
        self.base += after[len(before):]
        self.prompt = self.base + with_prompt[len(after):]
        self.marks.append((len(self.messages), len(self.base)))
        return self.prompt
