"""The short template and the capitals task: short prompts, the answer_or_command parser and real scored episodes."""

from __future__ import annotations

import pytest

from mlgym_registry import registry
from mlgym_registry.components.parsers import ANSWER_FILE, AnswerOrCommandParser, ThoughtActionParser
from mlgym_registry.components.templates import STATUS_BLOCK, short
from mlgym_registry.testing import check_parser, check_template
from mlgym_registry.testing.tiny_model import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def prompt_tokens(env, tokenizer) -> tuple[str, int]:
    """The first prompt of ``env`` and its length in the tiny tokenizer's tokens."""
    prompt = env.reset()["text", "prompt"]
    prompt = prompt if isinstance(prompt, str) else prompt[0]
    return prompt, len(tokenizer(prompt)["input_ids"])


def answer(env, reply: str):
    """One episode of ``env`` answered with ``reply``: the step's ``next`` tensordict."""
    td = env.reset()
    td["text", "response"] = [reply]
    return env.step(td)["next"]


# -- the short template -----------------------------------------------------------------------------------------------
def test_short_template_conforms_and_keeps_the_tool_language():
    check_template(short())
    templates = short()
    for command in ("open <path>", "edit <start>:<end>", "end_of_edit", "insert <line>", "validate", "submit"):
        assert command in templates.system_template
    assert "{format_instructions}" in templates.system_template
    assert templates.task_template.endswith(STATUS_BLOCK) and templates.next_step.endswith(STATUS_BLOCK)


def test_short_template_shortens_the_prompt_and_the_default_parser_still_reads_commands(tokenizer):
    default = registry.make("prisonersDilemma", tokenizer=tokenizer)
    small = registry.make("prisonersDilemma", template="short", tokenizer=tokenizer)
    try:
        _, default_length = prompt_tokens(default, tokenizer)
        prompt, short_length = prompt_tokens(small, tokenizer)
        assert ThoughtActionParser.format_instructions.strip() in prompt  # the fenced format, as the parser says
        assert short_length < default_length / 2, (short_length, default_length)
        td = small.reset()
        td["text", "response"] = ["DISCUSSION\nLook around.\n\n```\nls\n```"]
        observation = small.step(td)["next", "history", "prompt"][0][-1].content
        assert "strategy.py" in observation  # the command ran
    finally:
        default.close()
        small.close()


# -- the answer_or_command parser -------------------------------------------------------------------------------------
def test_answer_or_command_parser_conforms():
    check_parser(AnswerOrCommandParser())


def test_a_reply_without_a_block_is_written_and_submitted():
    thought, action = AnswerOrCommandParser()("HELLO there")
    assert thought == ""
    assert action.startswith(f"cat > {ANSWER_FILE} << 'END_OF_ANSWER'\nHELLO there\n") and action.endswith("\nsubmit")
    assert AnswerOrCommandParser()("Let me look.\n```\nls -a\n```")[1] == "ls -a\n"


# -- the capitals task, through the env ------------------------------------------------------------------------------
def test_capitals_is_registered_with_a_short_prompt(tokenizer):
    spec = registry.spec("capitals")
    assert (spec.template, spec.parser, spec.reward) == ("short", "answer_or_command", "mlgym_best_improvement")
    assert spec.baseline == {"Score": 0.0}
    env = registry.make("capitals", tokenizer=tokenizer)
    try:
        prompt, length = prompt_tokens(env, tokenizer)
        assert "Answer in capital letters" in prompt
        assert length < 500, length
    finally:
        env.close()


@pytest.mark.parametrize("reply, reward", [
    ("HELLO", 1.0),
    ("HELLO world", 0.5),
    ("all small", 0.0),
    ("1234 !!", 0.0),  # no letters: nothing in capitals
    ("ABC\nEND_OF_ANSWER\ncat answer.txt", 3 / 3),  # the rest of the reply runs as commands; the answer is cut
])
def test_capitals_pays_the_share_of_capitals(reply, reward):
    env = registry.make("capitals")
    try:
        step = answer(env, reply)
        assert float(step["reward"].sum()) == pytest.approx(reward)
        assert bool(step["done"].all())
    finally:
        env.close()


def test_capitals_score_cannot_be_printed_by_the_agent():
    env = registry.make("capitals")
    try:
        td = env.reset()
        td["text", "response"] = ['```\necho \'Evaluation Score: {"Score": 1.0}\'; echo "{\\"Score\\": 1.0}"\n```']
        stepped = env.step(td)
        assert float(stepped["next", "reward"].sum()) == 0.0 and not bool(stepped["next", "done"].all())
        td = env.step_mdp(stepped)
        td["text", "response"] = ["still small letters"]
        step = env.step(td)["next"]
        assert float(step["reward"].sum()) == 0.0 and bool(step["done"].all())  # the evaluator's score, not the echo
    finally:
        env.close()
