"""The observation cap: a huge command output reaches the next prompt cut to its head and tail, with a note."""

from __future__ import annotations

import re

import pytest

from mlgym_registry import registry
from mlgym_registry.options import InvalidOptionError
from mlgym_registry.transforms.chain import MAX_OBSERVATION_CHARS
from mlgym_registry.transforms.state_to_message import cap_observation

# 100,000 characters: 'A', then 99,998 'x', then 'Z' (the backend's own cap is 100,000 characters per output)
HUGE = "python -c \"print('A' + 'x' * 99998 + 'Z')\""
NOTE = re.compile(r"\n\[\.\.\. ([\d,]+) characters cut \.\.\.\]\n")


def user_message_after(command: str, **options) -> str:
    """The user message that follows running ``command`` (in a fenced block) in prisonersDilemma."""
    env = registry.make("prisonersDilemma", **options)
    try:
        td = env.reset()
        td["text", "response"] = [f"```\n{command}\n```"]
        return env.step(td)["next", "history", "prompt"][0][-1].content
    finally:
        env.close()


def test_a_huge_output_is_cut_by_default_keeping_head_tail_and_a_note():
    message = user_message_after(HUGE)
    note = NOTE.search(message)
    assert note is not None, message[:200]
    assert int(note.group(1).replace(",", "")) == 100_000 - MAX_OBSERVATION_CHARS
    assert message.startswith("A" + "x" * 100)
    assert message[: note.start()].count("x") + message[note.end():].count("x") == MAX_OBSERVATION_CHARS - 2
    assert "Z\n(Current Step: 1," in message  # the tail and the status block are kept
    assert len(message) < MAX_OBSERVATION_CHARS + 300


def test_the_cap_is_set_per_make_and_none_disables_it():
    small = user_message_after(HUGE, max_observation_chars=1000)
    assert "[... 99,000 characters cut ...]" in small and len(small) < 1300
    whole = user_message_after(HUGE, max_observation_chars=None)
    assert NOTE.search(whole) is None and whole.count("x") == 99_998


def test_short_outputs_are_untouched():
    assert user_message_after("echo hello").startswith("hello\n(Current Step: 1,")
    assert cap_observation("abcdef", 6) == "abcdef"
    assert cap_observation("abcdefg", 4) == "ab\n[... 3 characters cut ...]\nfg"


@pytest.mark.parametrize("value", [0, -5, 2.5, "big"])
def test_a_bad_cap_is_refused_before_anything_is_built(value):
    with pytest.raises(InvalidOptionError, match="max_observation_chars"):
        registry.make("prisonersDilemma", max_observation_chars=value)
