"""Every isolator is linear in its reply and never raises out of ``env.step``; a conversation is shown whatever its
parser raises.

``guard_multiline_input`` used to look for a terminator line to the end of the reply after every ``edit``/``insert``
line (10^5 characters of ``edit 1:2`` lines: 4.6 s; a megabyte: minutes), and an isolator that raised anything but
``FormatError`` ended the episode. Here: the old functions, copied as the reference, against the new ones on random
mixes; the kit's hostile-input check (``testing.check_isolator_hostile``, run by ``check_isolator``) on the built-in
isolator with every built-in parser, on the exact repro and on a throwaway quadratic isolator; a raising isolator
through a real env; and ``format_conversation``/``show`` with a parser that raises ``RecursionError``.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Iterable, Mapping

import pytest

from mlgym_registry import registry
from mlgym_registry.cli import main as cli_main
from mlgym_registry.components.isolators import (
    MULTILINE_COMMAND_ENDINGS,
    CodeBlockIsolator,
    guard_multiline_input,
    malformed_message,
    unterminated_command,
)
from mlgym_registry.components.output_checks import IsolatorFailedOnReply, IsolatorFailedWarning, ParserFailedWarning
from mlgym_registry.components.parsers import (
    AnswerOrCommandParser,
    IdentityParser,
    StrictThoughtActionParser,
    ThoughtActionParser,
    XMLThoughtActionParser,
)
from mlgym_registry.components.tool_calling import ToolCallParser
from mlgym_registry.errors import ComponentRaisedError, FormatError
from mlgym_registry.records.conversation import format_conversation
from mlgym_registry.testing import (
    COMMAND_HOSTILE_REPLIES,
    HOSTILE_REPLIES,
    ISOLATOR_HOSTILE_REPLIES,
    ConformanceError,
    check_isolator,
    check_isolator_hostile,
)

BUILT_IN_PARSERS = (ThoughtActionParser, StrictThoughtActionParser, XMLThoughtActionParser, IdentityParser,
                    AnswerOrCommandParser, ToolCallParser)
DEEP = 50_000


# -- the old functions, as they were before the fix: the reference ---------------------------------------------------
_OLD_HEREDOC = re.compile(r"(?<!<)<<-?(?!<)[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_OLD_BARE_COMMAND = re.compile(r"^\s*(?P<name>\S+)(?:[ \t]+[^\s<>|;&]+)?[ \t]*\r?$")


def old_guard_multiline_input(action: str, endings: Mapping[str, str] = MULTILINE_COMMAND_ENDINGS) -> str:
    if not endings:
        return action
    command = _old_command_pattern(endings)
    lines = action.split("\n")
    index = 0
    while index < len(lines):
        match = command.match(lines[index])
        if match is None:
            index += 1
            continue
        terminator = endings[match.group(1)]
        end = _old_terminator_line(lines, index + 1, terminator)
        if end is None:
            index += 1
            continue
        if not _old_has_heredoc(lines[index], terminator):
            line = lines[index]
            carriage = "\r" if line.endswith("\r") else ""
            lines[index] = line[: len(line) - len(carriage)] + f" << '{terminator}'" + carriage
        index = end + 1
    return "\n".join(lines)


def old_unterminated_command(action: str, names: Iterable[str] = ("insert",),
                             endings: Mapping[str, str] = MULTILINE_COMMAND_ENDINGS) -> str | None:
    wanted = {name for name in names if name in endings}
    if not wanted:
        return None
    command = _old_command_pattern(endings)
    lines = action.split("\n")
    index = 0
    while index < len(lines):
        match = command.match(lines[index])
        if match is None:
            index = _old_after_heredocs(lines, index)
            continue
        name = match.group(1)
        end = _old_terminator_line(lines, index + 1, endings[name])
        if end is not None:
            index = end + 1
            continue
        bare = _OLD_BARE_COMMAND.match(lines[index])
        if name in wanted and bare is not None and bare.group("name") == name:
            return name
        index += 1
    return None


def _old_after_heredocs(lines: list[str], index: int) -> int:
    for word in _OLD_HEREDOC.findall(lines[index]):
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == word[1]), None)
        if end is None:
            return len(lines)
        index = end
    return index + 1


def _old_command_pattern(endings: Mapping[str, str]) -> re.Pattern[str]:
    names = "|".join(re.escape(name) for name in sorted(endings, key=len, reverse=True))
    return re.compile(rf"^\s*({names})(?=\s|$)")


def _old_terminator_line(lines: list[str], start: int, terminator: str) -> int | None:
    for index in range(start, len(lines)):
        if lines[index].rstrip() == terminator:
            return index
    return None


def _old_has_heredoc(line: str, terminator: str) -> bool:
    return re.search(rf"<<-?\s*(['\"]?){re.escape(terminator)}\1\s*$", line) is not None


def old_isolator(response: str, parser=None) -> str:
    """The quadratic guard as a whole isolator: what a third party might well write."""
    _thought, action = (parser or IdentityParser())(response)
    return old_guard_multiline_input(action).strip()


# -- the new functions give exactly the old results ------------------------------------------------------------------
PIECES = ("edit 1:2", "insert 3", "  edit 5:6", "\tinsert 1", "edit", "insert", "editor 1", "edit\r", "insert 2\r",
          "end_of_edit", "end_of_insert", "end_of_edit  ", "end_of_insert\r", " end_of_edit", "end_of_editx",
          "edit 1:2 << 'end_of_edit'", "insert 2 <<end_of_insert", "edit 3:4 << \"end_of_edit\" ",
          "insert into t values (1)", "cat << EOF", "cat <<- 'EOF' && cat << END", "EOF", " EOF ", "END", "```",
          "```python", "x = 1", "", " ", "write f", "\u3000end_of_edit", "end_of_edit\u3000")
ENDINGS = (MULTILINE_COMMAND_ENDINGS, {"edit": "end_of_edit"}, {"write": "EOF", "edit": "end_of_edit"}, {},
           {"edit": "END", "insert": "END"})


def random_action(rng: random.Random) -> str:
    lines = [rng.choice(PIECES) for _ in range(rng.randrange(14))]
    return rng.choice(("\n", "\n", "\r\n")).join(lines) + rng.choice(("", "\n", "\n\n"))


def test_the_guard_gives_what_the_old_guard_gave_on_random_mixes():
    rng = random.Random(0)
    for _ in range(4000):
        action, endings = random_action(rng), rng.choice(ENDINGS)
        assert guard_multiline_input(action, endings) == old_guard_multiline_input(action, endings), (action, endings)


def test_unterminated_command_gives_what_the_old_one_gave_on_random_mixes():
    rng = random.Random(1)
    for _ in range(4000):
        action, endings = random_action(rng), rng.choice(ENDINGS)
        names = rng.choice((("insert",), ("edit", "insert"), ("write",), ()))
        assert unterminated_command(action, names, endings) == old_unterminated_command(action, names, endings), (
            action, names, endings)


def old_code_block(response: str) -> str:
    """``CodeBlockIsolator`` with the old functions."""
    _thought, action = ThoughtActionParser()(response)
    if old_unterminated_command(action) is not None:
        raise FormatError(malformed_message("insert", "end_of_insert"))
    action = old_guard_multiline_input(action).strip()
    if not action:
        raise FormatError("The code block in the model response is empty.")
    return action


def outcome(isolator, response: str) -> str:
    try:
        return isolator(response)
    except FormatError as exc:
        return f"FormatError: {exc}"


def test_the_isolator_gives_what_it_gave_on_random_fenced_mixes():
    rng = random.Random(2)
    isolate = CodeBlockIsolator()
    for _ in range(2000):
        response = f"DISCUSSION\nx\n```\n{random_action(rng)}\n```"
        assert outcome(isolate, response) == outcome(old_code_block, response), response


# -- the kit's hostile-input check -----------------------------------------------------------------------------------
def _families(*names: str) -> tuple:
    found = tuple(family for family in ISOLATOR_HOSTILE_REPLIES if family.name in names)
    assert len(found) == len(names), names
    return found


@pytest.mark.parametrize("cls", BUILT_IN_PARSERS, ids=lambda cls: cls.__name__)
def test_the_built_in_isolator_passes_the_hostile_check_with_every_built_in_parser(cls):
    check_isolator_hostile(registry.get("isolator", "code_block"), cls())


def test_check_isolator_runs_the_hostile_check_last():
    check_isolator(CodeBlockIsolator())  # the ordinary checks, then ISOLATOR_HOSTILE_REPLIES with thought_action
    assert ISOLATOR_HOSTILE_REPLIES[: len(HOSTILE_REPLIES)] == HOSTILE_REPLIES


def test_the_hostile_set_holds_the_repro_in_every_style():
    names = {family.name for family in COMMAND_HOSTILE_REPLIES}
    for where in ("", " in a fenced block", " in <command> tags", " in a JSON command", " in a tool call"):
        assert {f"edit lines{where}", f"insert lines{where}"} <= names, where
    plain, fenced = _families("edit lines", "edit lines in a fenced block")
    assert plain.megabyte and fenced.megabyte
    assert plain.make(100_000) == "edit 1:2\n" * (100_000 // 9)
    assert plain.make(1_000_000) == "edit 1:2\n" * (1_000_000 // 9)
    assert fenced.make(100_000).startswith("DISCUSSION\nx\n```\nedit 1:2\nedit 1:2\n")
    assert fenced.make(100_000).endswith("edit 1:2\n\n```\n")


@pytest.mark.parametrize(("parser", "family"), [
    (IdentityParser(), "edit lines"),  # the bare reply is the action
    (ThoughtActionParser(), "edit lines in a fenced block"),
], ids=["plain", "fenced"])
def test_the_repro_is_linear_now(parser, family):
    """10^2 to 10^5 characters of ``edit 1:2`` lines, then 10^6, judged by the kit: 4.6 s at 10^5 before (plain),
    6.4 s fenced; minutes at a megabyte."""
    check_isolator_hostile(CodeBlockIsolator(), parser, _families(family))


def test_the_guard_and_the_terminator_check_alone_are_linear():
    families = _families("edit lines", "insert lines", "edit lines and end_of_insert lines", "heredoc openers",
                         "edit lines, then one end_of_edit")

    def guard_only(response, parser):
        return guard_multiline_input(response)

    def terminators_only(response, parser):
        return str(unterminated_command(response, ("edit", "insert")))

    check_isolator_hostile(guard_only, IdentityParser(), families)
    check_isolator_hostile(terminators_only, IdentityParser(), families)


def test_the_kit_fails_the_old_quadratic_guard_with_the_ratio():
    with pytest.raises(ConformanceError) as raised:
        check_isolator_hostile(old_isolator, IdentityParser(), _families("edit lines"))
    message = str(raised.value)
    assert message.startswith("isolator old_isolator (with parser IdentityParser): took "), message
    assert "on a hostile reply of " in message and "(edit lines)" in message
    assert re.search(r"\d+x the reply took \d+x the time \(at most \d+x passes\); an action isolator must run in "
                     r"time linear in the reply", message), message
    assert "a terminator line looked for after every edit/insert line" in message


def read_brackets(text: str) -> None:
    """Reads nested brackets by recursion: RecursionError on deep nesting (what a third party might well write)."""

    def group(index: int) -> int:
        while index < len(text):
            if text[index] == "[":
                index = group(index + 1)
            elif text[index] == "]":
                return index + 1
            else:
                index += 1
        return index

    group(0)


def recursive_isolator(response: str, parser=None) -> str:
    """A third party's isolator that reads brackets by recursion, then does what code_block does."""
    read_brackets(response)
    return CodeBlockIsolator()(response, parser)


def test_the_kit_fails_an_isolator_that_raises_on_a_hostile_reply():
    with pytest.raises(ConformanceError) as raised:
        check_isolator(recursive_isolator)  # the ordinary checks pass, the hostile ones do not
    message = str(raised.value)
    assert message.startswith("isolator recursive_isolator (with parser ThoughtActionParser): raised RecursionError")
    assert "on a hostile reply ('[' nested" in message
    assert "an action isolator must return the action or raise mlgym_registry.errors.FormatError on every reply" in (
        message)


def test_the_kit_fails_an_isolator_that_returns_no_string_on_a_hostile_reply():
    def none_on_long(response, parser):
        return None if len(response) > 5_000 else CodeBlockIsolator()(response, parser)

    with pytest.raises(ConformanceError, match=r"returned NoneType for a hostile reply \(edit lines in a fenced "
                                               r"block, 9,\d{3} characters\)"):
        check_isolator_hostile(none_on_long, ThoughtActionParser(), _families("edit lines in a fenced block"))


# -- through a real env ----------------------------------------------------------------------------------------------
def step(env, td, response):
    td["text", "response"] = response
    td = env.step(td)
    return td["next"], env.step_mdp(td)


@pytest.fixture
def isolator_env(request):
    """An env of prisonersDilemma whose isolator is ``request.param`` (a function), registered for the test."""
    from mlgym_registry import BackendUnavailable

    name = request.param.__name__
    registry.register("isolator", name, request.param)
    try:
        env = registry.make("prisonersDilemma", isolator=name, reward_wrong_format=-0.5, max_format_errors=None,
                            batch_size=())
    except BackendUnavailable as exc:
        registry.unregister("isolator", name)
        pytest.skip(f"local backend unavailable here: {exc}")
    try:
        yield env, env.reset()
    finally:
        env.close()
        registry.unregister("isolator", name)


@pytest.mark.parametrize("isolator_env", [recursive_isolator], indirect=True)
def test_an_isolator_that_raises_on_a_hostile_reply_gives_a_format_error_and_the_episode_goes_on(isolator_env):
    env, td = isolator_env
    with pytest.warns(IsolatorFailedWarning) as caught:
        nxt, td = step(env, td, "DISCUSSION\n" + "[" * DEEP + "\n```\nls -a\n```")
    assert nxt["retry"].item() is True and nxt["reward"].item() == -0.5
    assert str(nxt["message"]).startswith("Your reply could not be used")  # the task's format-error template
    message = str(caught[0].message)
    for part in ("action isolator 'recursive_isolator' (registered in this process", "raised RecursionError",
                 "on a reply of 50,", "`mlgym-registry check --kind isolator recursive_isolator`",
                 "The reply was taken as a format error (the episode goes on)"):
        assert part in message, part
    nxt, td = step(env, td, "DISCUSSION\nlook\n```\nls -a\n```")
    assert nxt["retry"].item() is False and "strategy.py" in nxt["observation"]


def always_raising_isolator(response: str, parser=None) -> str:
    raise ValueError("cannot isolate anything")


@pytest.mark.parametrize("isolator_env", [always_raising_isolator], indirect=True)
def test_an_isolator_that_handles_nothing_still_fails_the_step(isolator_env):
    env, td = isolator_env
    td["text", "response"] = "DISCUSSION\nlook\n```\nls -a\n```"
    with warnings.catch_warnings():
        warnings.simplefilter("error", IsolatorFailedWarning)  # broken, not beaten by the reply: no warning
        with pytest.raises(ComponentRaisedError, match="action isolator 'always_raising_isolator' .* raised "
                                                       "ValueError: cannot isolate anything"):
            env.step(td)


def test_the_format_error_carries_the_isolator_error():
    class Task:
        isolator = staticmethod(recursive_isolator)
        parser = ThoughtActionParser()

    from mlgym_registry.components.output_checks import call_isolator

    with pytest.warns(IsolatorFailedWarning), pytest.raises(IsolatorFailedOnReply) as raised:
        call_isolator(Task(), "[" * DEEP, Task.parser)
    assert str(raised.value) == ("The reply could not be used: the action isolator failed on it (RecursionError). "
                                 "Write a plain reply in the format asked for.")
    error = raised.value.component_error
    assert isinstance(error, ComponentRaisedError) and isinstance(error.cause, RecursionError)
    assert error.kind == "isolator"


# -- showing a conversation whose parser raises ----------------------------------------------------------------------
def recursive_parser(response: str) -> tuple[str, str]:
    """A third party's parser that reads brackets by recursion, then reads fenced blocks as thought_action does."""
    read_brackets(response)
    return ThoughtActionParser()(response)


@pytest.fixture
def recursive_parser_name():
    registry.register("parser", "recursive_display", recursive_parser)
    yield "recursive_display"
    registry.unregister("parser", "recursive_display")


def test_a_conversation_is_shown_as_text_when_its_parser_raises(recursive_parser_name):
    deep = "DISCUSSION\n" + "[" * DEEP + "\n```\nls -a\n```"
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": deep}, {"role": "user", "content": "obs"},
                {"role": "assistant", "content": "DISCUSSION\nlook\n```\nls -a\n```"}]
    text = format_conversation(messages, parser=recursive_parser_name)
    assert f"=== assistant (shown as text: the parser raised RecursionError) ===\n{deep}\n" in text
    assert "=== assistant ===\n--- thought ---\nDISCUSSION\nlook\n--- action ---\nls -a" in text
    odd = format_conversation([{"role": "assistant", "content": "x"}], parser=lambda response: None)
    assert odd == "=== assistant (shown as text: the parser returned no (thought, action) pair) ===\nx\n"


def test_show_prints_a_traj_whose_reply_made_the_parser_raise(recursive_parser_name, tmp_path, capsys):
    from mlgym_registry.episodes.episode import run_episode
    from mlgym_registry.policies.base import Policy
    from mlgym_registry.records.trajectories import TrajectoryWriter

    deep = "DISCUSSION\n" + "[" * DEEP + "\n```\nls -a\n```"

    class Replies(Policy):
        def __init__(self):
            self.replies = [deep, "DISCUSSION\nlook\n```\nls -a\n```", "DISCUSSION\ndone\n```\nsubmit\n```"]

        def respond(self, messages):
            return self.replies.pop(0)

    env = registry.make("prisonersDilemma", parser=recursive_parser_name, batch_size=())
    try:
        with pytest.warns(ParserFailedWarning):
            result = run_episode(env, Replies(), writer=TrajectoryWriter(tmp_path, "prisonersDilemma"), max_turns=4)
    finally:
        env.close()
    assert [turn.format_error for turn in result.turns] == [True, False, False]
    capsys.readouterr()
    assert cli_main(["show", str(tmp_path / "prisonersDilemma.traj")]) == 0
    shown = capsys.readouterr().out
    assert "=== assistant (step 1) ===\n--- thought ---\nDISCUSSION\n" + "[" * DEEP in shown
    assert "the parser failed on it (RecursionError)" in shown  # the format error the model was told
    assert "=== assistant (step 2) ===" in shown and "=== end ===" in shown
