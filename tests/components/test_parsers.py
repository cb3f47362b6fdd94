"""Response parsers: MLGym's recorded (response -> thought, action) pairs, and the fence rules one by one."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from outside_data import RECORDED, needs_recorded_runs, recorded_run_params

from mlgym_registry import registry
from mlgym_registry.components.parsers import (
    IdentityParser,
    StrictThoughtActionParser,
    ThoughtActionParser,
    XMLThoughtActionParser,
    count_code_blocks,
)
from mlgym_registry.errors import FormatError

# Entries the MLGym agent writes itself instead of parsing the model's output: the action is the special action and
# the response is an error text or, for exit_format, the model's answer to the last of MLGym's re-queries, which MLGym
# records without parsing it (after three failed parses, or blocked commands, it stops asking). No parser reproduces
# them: exit_context/exit_cost/exit_error/exit_api responses hold no code block, and an exit_format response may be
# malformed or perfectly well-formed.
SYNTHETIC_ACTIONS = {"exit_context", "exit_cost", "exit_error", "exit_api", "exit_format"}

thought_action = ThoughtActionParser()
strict = StrictThoughtActionParser()
xml = XMLThoughtActionParser()


def traj_steps(path: Path) -> list[dict]:
    return json.loads(path.read_text())["trajectory"]


def is_synthetic(step: dict) -> bool:
    return step["action"] in SYNTHETIC_ACTIONS and step["thought"].startswith("Exit due to")


# -- MLGym's recorded pairs ----------------------------------------------------------------------------------------
@pytest.mark.trajectories
@pytest.mark.parametrize("path", recorded_run_params())
def test_fenced_parsers_reproduce_recorded_pairs(path):
    steps = traj_steps(path)
    if all(is_synthetic(s) for s in steps):
        pytest.skip(f"{path.name} holds only steps MLGym's agent made up (e.g. a context overflow at once)")
    for index, step in enumerate(steps):
        if is_synthetic(step):
            continue
        # MLGym's default agent used the strict parser, so both must give back exactly what was recorded.
        assert thought_action(step["response"]) == (step["thought"], step["action"]), f"{path.name} step {index}"
        assert strict(step["response"]) == (step["thought"], step["action"]), f"{path.name} step {index}"


@pytest.mark.trajectories
@needs_recorded_runs
def test_synthetic_entries_are_expected_failures():
    """exit_context & co. have no code block; exit_format responses give any action but exit_format, or none."""
    synthetic = [step for path in RECORDED for step in traj_steps(path) if is_synthetic(step)]
    if not synthetic:
        pytest.skip("no synthetic exit_* entries in these trajectories")
    for step in synthetic:
        check_synthetic(step)


def check_synthetic(step: dict) -> None:
    if step["action"] != "exit_format":
        with pytest.raises(FormatError, match="No action found"):
            thought_action(step["response"])
        return
    for parser in (thought_action, strict):
        try:
            _, action = parser(step["response"])
        except FormatError:
            continue
        assert action != "exit_format"


@pytest.mark.parametrize(
    "step",
    [
        # The shapes MLGym's agent records (thought, action, response), e.g. 10 exit_context entries in the PD runs.
        {"thought": "Exit due to context window", "action": "exit_context", "response": "Exit due to context window"},
        {"thought": "Exit due to cost limit", "action": "exit_cost", "response": "Exit due to cost limit"},
        {"thought": "Exit due to runtime error: boom", "action": "exit_error",
         "response": "exit due to runtime error: boom"},
        {"thought": "Exit due to format error", "action": "exit_format",
         "response": "Two ideas.\n```\nls\n```\nOr rather\n```\nvalidate\n```\n"},
        # MLGym records its last re-query's answer unparsed: it can be well-formed (seen in MLGym's published runs)
        {"thought": "Exit due to format error", "action": "exit_format",
         "response": "DISCUSSION\nFirst a look at the files.\n\n```\nls -a\n```"},
    ],
    ids=lambda s: f"{s['action']}-{len(s['response'])}",
)
def test_synthetic_entry_shapes(step):
    assert is_synthetic(step)
    check_synthetic(step)


@pytest.mark.trajectories
@needs_recorded_runs
def test_xml_and_identity_on_recorded_responses():
    """The same commands written with <command> tags come back stripped; identity returns the text twice."""
    checked = 0
    for path in RECORDED:
        for step in traj_steps(path):
            if is_synthetic(step):
                continue
            response = step["response"]
            if "<command>" not in response or "</command>" not in response:
                with pytest.raises(FormatError):
                    xml(response)
            rewritten = step["thought"] + "<command>\n" + step["action"] + "</command>\n"
            assert xml(rewritten) == (step["thought"].strip(), step["action"].strip())
            assert IdentityParser()(response) == (response, response)
            checked += 1
    assert checked > 0


# -- ThoughtActionParser rules ---------------------------------------------------------------------------------------
def test_plain_block_keeps_trailing_newline():
    response = "DISCUSSION\nlist the files\n\n```\nls -a\n```\n"
    assert thought_action(response) == ("DISCUSSION\nlist the files\n\n", "ls -a\n")


def test_closing_fence_at_end_of_text_without_newline():
    assert thought_action("look\n```\nls\n```") == ("look\n", "ls\n")


def test_closing_fence_swallows_following_blank_lines():
    assert thought_action("a\n```\nls\n```\n\n\n  \nafter") == ("a\nafter", "ls\n")


def test_opening_fence_swallows_blank_lines_but_not_indentation():
    assert thought_action("```\n\n \n    x = 1\n```\n") == ("", "    x = 1\n")


def test_info_string_fence_opens_a_block():
    assert thought_action("run it\n```bash\npython train.py\n```\n") == ("run it\n", "python train.py\n")


def test_last_block_wins():
    response = "first\n```\nls\n```\nthen\n```\nvalidate\n```\nend"
    assert thought_action(response) == ("first\n```\nls\n```\nthen\nend", "validate\n")


def test_nested_block_stays_inside_the_outer_one():
    body = "create notes.md\n```python\nprint('hi')\n```\n"
    response = f"write notes\n```\n{body}```\n"
    assert thought_action(response) == ("write notes\n", body)


def test_info_fence_inside_open_block_is_an_opening():
    # ``` opens, ```python nests, ``` closes the nested one: the outer block never closes.
    with pytest.raises(FormatError, match="No action found"):
        thought_action("x\n```\necho\n```python\n```\n")


def test_unterminated_fence_is_a_format_error():
    with pytest.raises(FormatError, match="^No action found in model response.$"):
        thought_action("DISCUSSION\nI will list the files\n```\nls -a\n")


def test_complete_block_before_an_unterminated_one_is_not_top_level():
    # The trailing ``` opens a new block that never closes; the earlier block is still the last complete one.
    assert thought_action("```\nls\n```\nmore\n```\nvalidate\n") == ("more\n```\nvalidate\n", "ls\n")


def test_no_block_at_all():
    for response in ("", "just talking", "ls -a\n", "`ls`", "``\nls\n``"):
        with pytest.raises(FormatError):
            thought_action(response)


def test_inline_and_indented_fences_do_not_count():
    response = "I could use ```ls``` here\n  ```\nnot a fence\n  ```\n```\ncat x\n```\n"
    assert thought_action(response) == ("I could use ```ls``` here\n  ```\nnot a fence\n  ```\n", "cat x\n")


def test_fence_with_trailing_spaces():
    assert thought_action("t\n```   \nls\n```  \nrest") == ("t\nrest", "ls\n")


def test_crlf_line_endings():
    response = "DISCUSSION\r\nlist\r\n```\r\nls -a\r\n```\r\n"
    assert thought_action(response) == ("DISCUSSION\r\nlist\r\n", "ls -a\r\n")
    assert thought_action("t\r\n```bash\r\nls\r\n```\r\n") == ("t\r\n", "ls\r\n")


def test_empty_block_gives_empty_action():
    assert thought_action("nothing to run\n```\n```\n") == ("nothing to run\n", "")


# -- properties over generated responses ------------------------------------------------------------------------------
_PIECES = ["ls", " ", "`", "``", "```", "```x```", "\n", "\r\n", "python", "edit 1:2", "{", "}", "é", "\t", "#"]


def _text(rng: random.Random, newline_end: bool) -> str:
    """Random text in which no line starts with ``` (inline backticks and CRLF allowed)."""
    text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 12)))
    text = re.sub(r"(^|\n)`", r"\1x`", text)
    if newline_end and not text.endswith("\n"):
        text += "\n"
    return text


@pytest.mark.parametrize("seed", range(40))
def test_any_fence_free_text_around_one_block(seed):
    rng = random.Random(seed)
    for _ in range(25):
        before = _text(rng, newline_end=True)
        # Blank lines right after a fence line belong to the fence, so body and after start with a non-blank.
        body = rng.choice(["", "y" + _text(rng, newline_end=True)])
        after = rng.choice(["", "x" + _text(rng, newline_end=False)])
        info = rng.choice(["", "bash", "python", "sh"])
        response = f"{before}```{info}\n{body}```\n{after}"
        assert thought_action(response) == (before + after, body)
        # A later block always wins over this one.
        assert thought_action(response + "\n```\nsubmit\n```\n")[1] == "submit\n"


_FENCY_PIECES = ["ls", " ", "`", "```", "\n```\n", "\n```py\n", "\n", "\r\n", "say"]


@pytest.mark.parametrize("seed", range(20))
def test_strict_parser_raises_exactly_when_several_pairs(seed):
    rng = random.Random(1000 + seed)
    for _ in range(50):
        response = "".join(rng.choice(_FENCY_PIECES) for _ in range(rng.randint(0, 12)))
        pairs = count_code_blocks(response)
        try:
            lenient = thought_action(response)
        except FormatError:
            lenient = None
        if pairs > 1:
            with pytest.raises(FormatError, match="more than one code block"):
                strict(response)
        elif lenient is None:
            with pytest.raises(FormatError, match="No action found"):
                strict(response)
        else:
            assert strict(response) == lenient


def test_count_code_blocks():
    assert count_code_blocks("no fences") == 0
    assert count_code_blocks("```\nls\n```") == 1
    assert count_code_blocks("a ```x``` b ```y``` c ```") == 2
    assert count_code_blocks("``````") == 1


def test_strict_parser_rejects_inline_backticks_plus_a_block():
    with pytest.raises(FormatError, match="^Found more than one code block in the model response.$"):
        strict("use ```ls``` maybe\n```\nls\n```\n")
    with pytest.raises(FormatError, match="more than one"):
        strict("```\nls\n```\n```\nvalidate\n```\n")
    assert strict("one\n```\nls\n```\n") == ("one\n", "ls\n")


# -- XML and identity -------------------------------------------------------------------------------------------
def test_xml_last_command_stripped():
    response = "look first\n<command>ls</command>\nthen\n<command>\n  validate  \n</command>\n bye "
    assert xml(response) == ("look first\n<command>ls</command>\nthen\n\n bye", "validate")


def test_xml_needs_a_complete_pair():
    for response in ("no tags", "<command>ls", "ls</command>", "</command> oops <command>ls"):
        with pytest.raises(FormatError, match="No action found"):
            xml(response)
    # A stray opening tag after the last pair does not hide that pair.
    assert xml("<command>ls</command> then <command>")[1] == "ls"


def test_identity():
    assert IdentityParser()("  ls -a\n") == ("  ls -a\n", "  ls -a\n")


# -- registration and error messages --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, cls",
    [("thought_action", ThoughtActionParser), ("mlgym_thought_action", StrictThoughtActionParser),
     ("xml_thought_action", XMLThoughtActionParser), ("identity", IdentityParser)],
)
def test_registered_parsers(name, cls):
    parser = registry.get("parser", name)
    assert type(parser) is cls
    response = "t\n```\nls\n```\n<command>pwd</command>"
    expected = {
        "thought_action": ("t\n<command>pwd</command>", "ls\n"),
        "mlgym_thought_action": ("t\n<command>pwd</command>", "ls\n"),
        "xml_thought_action": ("t\n```\nls\n```", "pwd"),
        "identity": (response, response),
    }
    assert parser(response) == expected[name]
    assert parser.format_error_message.strip()


def test_format_error_messages_show_the_expected_format():
    assert "```\nthe command to run\n```" in ThoughtActionParser.format_error_message
    assert "only one code block" in StrictThoughtActionParser.format_error_message
    assert "<command>\nthe command to run\n</command>" in XMLThoughtActionParser.format_error_message
    # Ready to send as is: no format placeholders left in them.
    for cls in (ThoughtActionParser, StrictThoughtActionParser, XMLThoughtActionParser, IdentityParser):
        assert "{" not in cls.format_error_message


def test_components_import_without_torch():
    """Parsing, guarding, rewards and templates stay light: no torch/torchrl/tensordict import."""
    code = (
        "import sys\n"
        "import mlgym_registry.components.parsers, mlgym_registry.components.isolators\n"
        "import mlgym_registry.components.rewards, mlgym_registry.components.templates\n"
        "heavy = sorted(m for m in ('torch', 'torchrl', 'tensordict') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
