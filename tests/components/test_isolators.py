"""Action isolator: parse + heredoc guard for edit/insert, checked on MLGym's recorded actions."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from outside_data import RECORDED, needs_recorded_runs

from mlgym_registry import registry
from mlgym_registry.components.isolators import (
    CodeBlockIsolator,
    guard_multiline_input,
    replace_lone_surrogates,
    unterminated_command,
)
from mlgym_registry.components.parsers import StrictThoughtActionParser, ThoughtActionParser, XMLThoughtActionParser
from mlgym_registry.errors import FormatError

MULTILINE = re.compile(r"^\s*(edit|insert)(?=\s|$)", re.MULTILINE)
ENDINGS = {"edit": "end_of_edit", "insert": "end_of_insert"}
SYNTHETIC_ACTIONS = {"exit_context", "exit_cost", "exit_error", "exit_api", "exit_format"}

isolate = CodeBlockIsolator()


def recorded_multiline_actions() -> list[str]:
    actions = []
    for path in RECORDED:
        for step in json.loads(path.read_text())["trajectory"]:
            if MULTILINE.search(step["action"]):
                actions.append(step["action"])
    return actions


def expected_guard(action: str) -> str:
    """What MLGym's agent sends when the edit/insert is the first line: the heredoc operator on that line."""
    first, _, rest = action.partition("\n")
    command = first.split()[0]
    if not any(line.rstrip() == ENDINGS[command] for line in rest.split("\n")):
        return action
    return f"{first} << '{ENDINGS[command]}'\n{rest}"


def is_single_command(action: str) -> bool:
    """An action that is one edit/insert command from its first line to its terminator: MLGym guards it right."""
    lines = action.rstrip("\n").split("\n")
    command = MULTILINE.match(lines[0])
    return bool(command) and lines[-1].rstrip() == ENDINGS[command.group(1)] and not any(
        line.rstrip() in ENDINGS.values() for line in lines[1:-1])


def has_guardable_command(action: str) -> bool:
    """Whether some edit/insert command line is followed, later, by its own terminator line."""
    lines = action.split("\n")
    for index, line in enumerate(lines):
        command = MULTILINE.match(line)
        if command and any(later.rstrip() == ENDINGS[command.group(1)] for later in lines[index + 1 :]):
            return True
    return False


def assert_only_command_lines_guarded(action: str, guarded: str) -> None:
    """Every line is the recorded one, but edit/insert command lines, which gain the heredoc operator."""
    before, after = action.split("\n"), guarded.split("\n")
    assert len(before) == len(after)
    for old, new in zip(before, after, strict=True):
        if old != new:
            assert new == old + f" << '{ENDINGS[old.split()[0]]}'"


# -- recorded actions --------------------------------------------------------------------------------------------
@pytest.mark.trajectories
@needs_recorded_runs
def test_recorded_edit_actions_are_guarded():
    actions = recorded_multiline_actions()
    assert actions, "the trajectories hold no edit/insert action"
    guarded_count = 0
    for action in actions:
        guarded = guard_multiline_input(action)
        assert guard_multiline_input(guarded) == guarded  # idempotent
        assert_only_command_lines_guarded(action, guarded)
        if is_single_command(action):
            assert guarded == expected_guard(action)
        # else MLGym's agent mangles the action: it slices a command that does not start the action by an offset
        # into the whole action ("open x\nedit 1:1 ..." reaches the shell as "open x\n\n1 << 'end_of_edit' ...")
        # and puts a second command's heredoc operator on an empty line; we guard every command in place
        elif has_guardable_command(action):
            assert guarded != action
        guarded_count += guarded != action
    assert guarded_count > 0


@pytest.mark.trajectories
@needs_recorded_runs
def test_isolator_gives_mlgym_run_action_for_every_recorded_step():
    """What MLGym's agent sent to env.step: the recorded action, guarded when multi-line, stripped."""
    checked = 0
    for path in RECORDED:
        for step in json.loads(path.read_text())["trajectory"]:
            if step["action"] in SYNTHETIC_ACTIONS:
                continue
            action = step["action"]
            isolated = isolate(step["response"], StrictThoughtActionParser())
            if is_single_command(action):
                assert isolated == expected_guard(action).strip()
            elif MULTILINE.search(action):  # guarded in place, where MLGym's agent mangles the action
                assert_only_command_lines_guarded(action.strip(), isolated)
            else:
                assert isolated == action.strip()
            checked += 1
    assert checked > 0


@pytest.mark.trajectories
@needs_recorded_runs
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_guarded_recorded_edits_pass_bash_syntax_check():
    """MLGym runs ``bash -n`` on every action first: guarded edit bodies must not be parsed as shell code."""
    # one command each: a model's free text around its commands (a pasted prompt line, say) is its own syntax error
    actions = [guard_multiline_input(a).strip() for a in recorded_multiline_actions() if is_single_command(a)]
    assert actions
    # One bash process checks them all, each as its own function body so that one error does not hide another.
    script = "".join(f"f{i}() {{\n{a}\n}}\n" for i, a in enumerate(actions))
    result = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[:2000]


def test_unguarded_edit_fails_bash_syntax_check():
    """Why the guard exists: the body of an unguarded edit is parsed as shell code and rejected."""
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    action = "edit 3:4\ndef row_strategy(history):\n    return 0\nend_of_edit"
    bad = subprocess.run(["bash", "-n"], input=action, capture_output=True, text=True, timeout=30)
    good = subprocess.run(["bash", "-n"], input=guard_multiline_input(action), capture_output=True, text=True,
                          timeout=30)
    assert bad.returncode != 0
    assert good.returncode == 0, good.stderr


# -- guard rules ---------------------------------------------------------------------------------------------------
def test_edit_and_insert_are_guarded():
    assert guard_multiline_input("edit 14:33\n    x = 1\nend_of_edit\n") == (
        "edit 14:33 << 'end_of_edit'\n    x = 1\nend_of_edit\n"
    )
    assert guard_multiline_input("insert 5\nimport os\nend_of_insert") == (
        "insert 5 << 'end_of_insert'\nimport os\nend_of_insert"
    )


def test_text_before_the_edit_is_kept():
    # MLGym's agent loses "edit 1:2" here; we keep every line and guard the command where it stands.
    assert guard_multiline_input("echo hi\nedit 1:2\nabc\nend_of_edit\n") == (
        "echo hi\nedit 1:2 << 'end_of_edit'\nabc\nend_of_edit\n"
    )


def test_several_commands_in_one_action():
    action = "edit 1:1\na\nend_of_edit\nls\ninsert 3\nb\nend_of_insert\n"
    assert guard_multiline_input(action) == (
        "edit 1:1 << 'end_of_edit'\na\nend_of_edit\nls\ninsert 3 << 'end_of_insert'\nb\nend_of_insert\n"
    )


def test_body_lines_are_not_commands():
    action = "edit 1:3\nedit = 1\ninsert 4\nend_of_edit"
    assert guard_multiline_input(action) == "edit 1:3 << 'end_of_edit'\nedit = 1\ninsert 4\nend_of_edit"


def test_missing_terminator_is_left_alone():
    for action in ("edit 1:2\nabc\n", "insert 3\nx\nend_of_edit\n", "edit 1:2\nabc\n  end_of_edit\n"):
        assert guard_multiline_input(action) == action


def test_already_guarded_is_left_alone():
    for head in ("edit 1:2 << 'end_of_edit'", "edit 1:2 <<end_of_edit", 'edit 1:2 << "end_of_edit"',
                 "edit 1:2 <<-'end_of_edit'"):
        action = f"{head}\nabc\nend_of_edit\n"
        assert guard_multiline_input(action) == action


def test_other_commands_are_untouched():
    for action in ("ls -a\n", "editor 1:2\nx\nend_of_edit\n", "python edit.py\n", "validate\n", ""):
        assert guard_multiline_input(action) == action


def test_terminator_with_trailing_space_and_crlf():
    crlf = "edit 1:2\r\nx\r\nend_of_edit\r\n"
    assert guard_multiline_input(crlf) == "edit 1:2 << 'end_of_edit'\r\nx\r\nend_of_edit\r\n"
    assert guard_multiline_input("edit 1:2\nx\nend_of_edit  \n") == "edit 1:2 << 'end_of_edit'\nx\nend_of_edit  \n"


def test_guard_is_idempotent_on_made_up_actions():
    actions = [
        "edit 1:2\nx\nend_of_edit",
        "  insert 7\nfoo\nend_of_insert\nedit 2:2\nbar\nend_of_edit\n",
        "cat a\nedit 9:9\n\nend_of_edit\nvalidate",
        "edit 1:2\nno end",
    ]
    for action in actions:
        once = guard_multiline_input(action)
        assert guard_multiline_input(once) == once


def test_custom_endings():
    assert guard_multiline_input("write f\nx\nEOF", {"write": "EOF"}) == "write f << 'EOF'\nx\nEOF"
    assert guard_multiline_input("edit 1:2\nx\nend_of_edit", {}) == "edit 1:2\nx\nend_of_edit"


# -- the isolator ----------------------------------------------------------------------------------------------------
def test_isolator_parses_guards_and_strips():
    response = "DISCUSSION\nFix it.\n\n```\nedit 14:15\n    return 1\nend_of_edit\n```\n"
    assert isolate(response, ThoughtActionParser()) == "edit 14:15 << 'end_of_edit'\n    return 1\nend_of_edit"
    assert isolate("ok\n```\nvalidate\n```\n", ThoughtActionParser()) == "validate"


def test_isolator_uses_the_given_parser():
    assert isolate("go <command> ls -a </command>", XMLThoughtActionParser()) == "ls -a"
    two_blocks = "```\nls\n```\n```\nvalidate\n```\n"
    assert isolate(two_blocks, ThoughtActionParser()) == "validate"
    with pytest.raises(FormatError, match="more than one code block"):
        isolate(two_blocks, StrictThoughtActionParser())
    # Without a parser it falls back to thought_action.
    assert isolate(two_blocks) == "validate"


def test_isolator_format_errors():
    with pytest.raises(FormatError, match="No action found"):
        isolate("I will think about it.", ThoughtActionParser())
    with pytest.raises(FormatError, match="code block in the model response is empty"):
        isolate("nothing\n```\n  \n```\n", ThoughtActionParser())
    for response in (None, "", "  \n"):
        with pytest.raises(FormatError, match="model response is empty"):
            isolate(response, ThoughtActionParser())


def test_registered_isolator():
    isolator = registry.get("isolator", "code_block")
    assert isinstance(isolator, CodeBlockIsolator)
    parser = registry.get("parser", "thought_action")
    assert isolator("x\n```\ninsert 2\nimport os\nend_of_insert\n```", parser) == (
        "insert 2 << 'end_of_insert'\nimport os\nend_of_insert"
    )


# -- lone surrogates (issue 8) ----------------------------------------------------------------------------------------
def test_lone_surrogates_become_valid_text():
    assert replace_lone_surrogates("echo \ud800") == "echo \ufffd"
    assert replace_lone_surrogates("a\udc80b\udfff") == "a\ufffdb\ufffd"
    assert replace_lone_surrogates("\ude00\ud83d") == "\ufffd\ufffd"  # low before high is no pair
    assert replace_lone_surrogates("\ud83d\ude00!") == "\U0001f600!"  # a pair left as two code points
    for text in ("", "plain", "caf\u00e9 \u6f22 \U0001f600", "\ufffd"):
        assert replace_lone_surrogates(text) is text
    action = isolate("go\n```\necho \ud800 \ud83d\ude00\n```", ThoughtActionParser())
    assert action == "echo \ufffd \U0001f600"
    action.encode("utf-8")  # what the shell gets


# -- insert without end_of_insert (issue 8) ----------------------------------------------------------------------------
MALFORMED_INSERT = (
    "Malformed insert command. Please ensure you use the `end_of_insert` keyword to mark the end of your insert."
)


def test_insert_without_end_of_insert_is_a_format_error():
    for action in ("insert 3\ntouch ran\nimport os", "insert 3", "ls\ninsert 3\nx = 1\n", "  insert 3\r\nx\r\n",
                   "insert 3\nx\nend_of_edit", "insert 1\na\nend_of_insert\ninsert 2\nb", "insert\nx"):
        with pytest.raises(FormatError) as raised:
            isolate(f"DISCUSSION\nAdd it.\n```\n{action}\n```\n", ThoughtActionParser())
        assert str(raised.value) == MALFORMED_INSERT
        assert unterminated_command(action) == "insert"


def test_what_is_not_a_malformed_insert():
    for action in (
        "insert 3\nx\nend_of_insert",  # terminated
        "edit 1:2\ninsert 4\nend_of_edit",  # a body line
        "python - << 'EOF'\ninsert 3\nEOF",  # another here-document's body
        "python - <<EOF\ncur.execute('''\ninsert into t values (1)\n''')\nEOF",
        "insert into t values (1)\nx",  # free text, not the command as a model writes it
        "insert 3 << 'end_of_insert'\nx",  # already guarded (bash reads the body to the end of the action)
        "edit 1:2\nx",  # an edit without end_of_edit is the backend's malformed edit
        "ls -a",
    ):
        assert unterminated_command(action) is None, action
    # the edit is passed on unguarded, for the backend to answer with MLGym's malformed-edit observation
    assert isolate("```\nedit 1:2\nx = 1\n```", ThoughtActionParser()) == "edit 1:2\nx = 1"
    # and an isolator may leave inserts alone
    assert CodeBlockIsolator(unterminated=())("```\ninsert 3\nx\n```") == "insert 3\nx"
