"""Every parser is linear in its reply and never raises out of ``env.step``.

The ``tool_calls`` parser used to raise ``RecursionError`` on a reply nested 50,000 deep (the episode died) and its
block regex ``<tool_call>\\s*(.*?)\\s*</tool_call>`` was cubic in blank space (2,000 spaces: 22 s). Here: the exact
repros, the kit's hostile-input check (``testing.check_parser_hostile``, run by ``check_parser``) on every built-in
parser and on throwaway broken ones, ``bounded_json``'s pre-scan, and hostile replies through a real env, which
steps and records a format error whichever parser failed on them.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
import warnings

import pytest

from mlgym_registry import FormatError, registry
from mlgym_registry.bounded_json import MAX_JSON_DEPTH, JSONTooDeep, nests_deeper
from mlgym_registry.bounded_json import loads as bounded_loads
from mlgym_registry.components.output_checks import ParserFailedWarning
from mlgym_registry.components.parsers import (
    AnswerOrCommandParser,
    IdentityParser,
    StrictThoughtActionParser,
    ThoughtActionParser,
    XMLThoughtActionParser,
)
from mlgym_registry.components.tool_calling import ToolCallParser, encode_call, read_calls, structured_messages
from mlgym_registry.errors import ComponentRaisedError
from mlgym_registry.testing import (
    HOSTILE_REPLIES,
    ConformanceError,
    HostileReply,
    check_parser,
    check_parser_hostile,
)

BUILT_IN = (ThoughtActionParser, StrictThoughtActionParser, XMLThoughtActionParser, IdentityParser,
            AnswerOrCommandParser, ToolCallParser)


def cpu_seconds(call, *args):
    """What ``call(*args)`` returned (or raised) and the CPU time it took."""
    start = time.thread_time()
    try:
        result = call(*args)
    except Exception as exc:  # noqa: BLE001 - the tests look at what it raised
        result = exc
    return result, time.thread_time() - start


# -- the exact repros ------------------------------------------------------------------------------------------------
DEEP = 50_000


@pytest.mark.parametrize("reply", [
    "<tool_call>" + "[" * DEEP + "</tool_call>",
    "<tool_call>" + "[" * DEEP + "]" * DEEP + "</tool_call>",
    "<tool_call>" + '{"a": ' * DEEP + "1" + "}" * DEEP + "</tool_call>",
    '<tool_call>{"name": "bash", "arguments": "' + "[" * DEEP + '"}</tool_call>',  # the arguments' JSON string
    '<tool_call>{"name": "bash", "arguments": {"command": "ls"}, "x": ' + "[" * DEEP + "]" * DEEP + "}</tool_call>",
], ids=["unclosed", "closed", "objects", "arguments-string", "beside-the-call"])
def test_a_tool_call_nested_50000_deep_is_a_format_error(reply):
    result, seconds = cpu_seconds(ToolCallParser(), reply)
    assert isinstance(result, FormatError), result
    assert "nested deeper than 128 levels" in str(result) and len(str(result)) < 500
    assert seconds < 1.0  # a few ms: the depth is measured before decoding


@pytest.mark.parametrize("spaces", [2_000, 100_000])
@pytest.mark.parametrize("shape", ["<tool_call>{}", "<tool_call>{}x", "<tool_call>{}</tool_call>",
                                   "x{}</tool_call>"])
def test_blank_space_after_a_tool_call_tag_is_read_at_once(spaces, shape):
    reply = shape.format(" " * spaces)
    result, seconds = cpu_seconds(ToolCallParser(), reply)
    assert isinstance(result, FormatError), result  # no call in it, or an empty one
    assert seconds < 1.0  # was 22 s for 2,000 spaces (cubic), and years for 10^5


def test_blank_space_around_a_real_call_is_still_stripped():
    call = '{"name": "bash", "arguments": {"command": "ls -a"}}'
    reply = "thought " + "<tool_call>" + " \n" * 50_000 + call + "\t" * 50_000 + "</tool_call>" + "  after"
    (thought, action), seconds = cpu_seconds(ToolCallParser(), reply)
    assert (thought, action) == ("thought   after", "ls -a") and seconds < 1.0


def test_json_past_the_int_digit_limit_is_a_format_error_not_a_value_error():
    for reply in ('<tool_call>{"name": "bash", "arguments": ' + "1" * 5000 + "}</tool_call>",
                  '<tool_call>{"name": "bash", "arguments": "' + "1" * 5000 + '"}</tool_call>',
                  encode_call("goto", {"line_number": "9" * 5000}),
                  encode_call("goto", {"line_number": "\u00b2"})):  # isdigit() but not int()-able
        with pytest.raises(FormatError):
            ToolCallParser()(reply)
    assert ToolCallParser()(encode_call("goto", {"line_number": "\u0663"}))[1] == "goto 3"  # a decimal digit


def test_error_messages_quote_a_hostile_reply_cut_short():
    for reply in (encode_call("x" * 1_000_000, {}), encode_call("bash", {f"k{i}": 1 for i in range(100_000)}),
                  encode_call("open", {"path": ["x"] * 100_000}), "<tool_call>" + "x" * 1_000_000 + "</tool_call>"):
        with pytest.raises(FormatError) as raised:
            ToolCallParser()(reply)
        assert len(str(raised.value)) < 600, str(raised.value)[:100]


def test_the_blocks_and_the_thought_are_what_the_regex_gave():
    """``_blocks`` (str.find) against the regex it replaced, on random mixes of tags, blank space and text."""
    old = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
    pieces = ["<tool_call>", "</tool_call>", " ", "\n", "\u3000", '{"name": "bash"}', "x", "<tool_call", "call>"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
        try:
            thought, calls = read_calls(text)
        except FormatError:
            blocks = old.findall(text)
            assert any(block != '{"name": "bash"}' for block in blocks), text
            continue
        assert thought == old.sub("", text).strip(), text
        assert len(calls) == len(old.findall(text)), text


def test_structured_messages_survive_hostile_arguments():
    deep = "[" * DEEP
    messages = [{"role": "assistant", "content": encode_call("bash", deep)},
                {"role": "tool", "content": "out"},
                {"role": "assistant", "content": encode_call("bash", "1" * 5000)}]
    out = structured_messages(messages)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == deep  # shown as it was made
    assert out[2]["tool_calls"][0]["function"]["arguments"] == "1" * 5000


def test_a_raised_recursion_limit_no_longer_crashes_the_process():
    """Under ``sys.setrecursionlimit(10**6)`` json.loads overflows the C stack on deep input (a segfault, exit -11):
    the parser measures the nesting first and never hands it to json.loads."""
    code = ("import sys; sys.setrecursionlimit(10**6)\n"
            "from mlgym_registry.components.tool_calling import ToolCallParser\n"
            "from mlgym_registry.errors import FormatError\n"
            "try:\n    ToolCallParser()('<tool_call>' + '[' * 300000 + '</tool_call>')\n"
            "except FormatError as exc:\n    print('FormatError:', exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "FormatError: A tool call is not valid JSON (JSON nested deeper than 128 levels)" in result.stdout


# -- bounded_json --------------------------------------------------------------------------------------------------
def _random_json(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.2:
        return rng.choice([1, "a[b{c", 'q"]}\\', None, 2.5, "\\\"[[", ""])
    if rng.random() < 0.5:
        return [_random_json(rng, depth - 1) for _ in range(rng.randrange(3))]
    return {f"k{i}[{{": _random_json(rng, depth - 1) for i in range(rng.randrange(3))}


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(item) for item in value.values()), default=0)
    return 0


def test_the_pre_scan_measures_the_depth_of_valid_json_exactly():
    rng = random.Random(1)
    for _ in range(500):
        value = _random_json(rng, 8)
        text = json.dumps(value)
        depth = _depth(value)
        for bound in range(max(depth - 1, 0), depth + 1):
            assert nests_deeper(text, bound) == (depth > bound), (text, bound)
        if depth <= 4:
            assert bounded_loads(text, max_depth=4) == value


def test_bounded_loads_refuses_deep_text_before_decoding_it():
    assert bounded_loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    for text in ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "{" * 10**6, "[" * 10**6,
                 ('{"a": ' * 200 + "1" + "}" * 200).encode()):
        with pytest.raises(JSONTooDeep):
            bounded_loads(text)
    assert bounded_loads('["' + "[" * 10**5 + '"]') == ["[" * 10**5]  # brackets in a string do not count
    assert bounded_loads('["\\"[[[["]', max_depth=1) == ['"[[[[']  # nor after an escaped quote
    with pytest.raises(ValueError):
        bounded_loads('"' + '\\"' * 10**5)  # unclosed, full of escaped quotes: one linear pass, then invalid


# -- the kit's hostile-input check ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda cls: cls.__name__)
def test_every_built_in_parser_passes_the_hostile_check(cls):
    check_parser_hostile(cls())


def test_the_hostile_set_covers_the_classes_of_the_issue():
    names = " | ".join(family.name for family in HOSTILE_REPLIES)
    for part in ("'[' nested", "'{' nested", "'(' nested", "'<' nested", "code fences nested", "<command> tags nested",
                 "<tool_call> tags nested", "spaces", "<tool_call> openers", "fence openers", "NUL bytes",
                 "lone surrogates", "a mix of", "digits"):
        assert part in names, part
    assert any(family.megabyte for family in HOSTILE_REPLIES)
    assert 97 <= len(HostileReply("x", "ab", "c", "<", "m", ">").make(100)) <= 100
    spaces = next(f for f in HOSTILE_REPLIES if f.name == "spaces after an unclosed <tool_call>")
    assert spaces.make(100_000) == "<tool_call>" + " " * (100_000 - len("<tool_call>"))


_OLD_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def backtracking_parser(response: str) -> tuple[str, str]:
    """The old tool_calls block regex: cubic in blank space after an unclosed tag."""
    blocks = _OLD_BLOCK.findall(response)
    if not blocks:
        raise FormatError("no tool call")
    return "", blocks[-1]


def recursive_parser(response: str) -> tuple[str, str]:
    """Reads nested brackets by recursion: RecursionError on deep nesting."""

    def group(index: int) -> int:
        while index < len(response):
            if response[index] == "[":
                index = group(index + 1)
            elif response[index] == "]":
                return index + 1
            else:
                index += 1
        return index

    group(0)
    if "```" not in response:
        raise FormatError("no block")
    return ThoughtActionParser()(response)


def pairing_parser(response: str) -> tuple[str, str]:
    """Pairs every opening tag with every later closing tag (a nested loop over the tags): quadratic in the tags."""
    opens = [match.end() for match in re.finditer("<tool_call>", response)]
    closes = [match.start() for match in re.finditer("</tool_call>", response)] or [len(response)]
    found = None
    for start in opens:
        for end in closes:
            if end > start:
                found = (start, end)
    if found is None or found[1] == len(response):
        raise FormatError("no tool call")
    return "", response[found[0]:found[1]]


def digits_parser(response: str) -> tuple[str, str]:
    """JSON with json.loads, catching JSONDecodeError only: ValueError on 5,000 digits (deep nesting is refused)."""
    if response.count("[") + response.count("{") > 100:
        raise FormatError("too many brackets")
    try:
        data = json.loads(response)
    except json.JSONDecodeError:
        raise FormatError("not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("command"), str):
        raise FormatError("no command")
    return "", data["command"]


def _family(name: str) -> tuple[HostileReply, ...]:
    return tuple(family for family in HOSTILE_REPLIES if family.name == name)


def test_the_kit_fails_a_backtracking_regex_with_the_ratio():
    with pytest.raises(ConformanceError) as raised:
        check_parser_hostile(backtracking_parser, _family("spaces then text after an unclosed <tool_call>"))
    message = str(raised.value)
    assert message.startswith("parser backtracking_parser: took ")
    assert "(spaces then text after an unclosed <tool_call>)" in message
    assert re.search(r"\d+x the reply took \d+x the time \(at most \d+x passes\); a parser must run in time linear",
                     message), message
    assert "\\s*(.*?)\\s*" in message


def test_the_kit_fails_a_quadratic_loop():
    with pytest.raises(ConformanceError, match=r"pairing_parser: took .* \(<tool_call> tags nested\).* time linear"):
        check_parser_hostile(pairing_parser, _family("<tool_call> tags nested"))


def test_check_parser_itself_fails_a_recursive_parser():
    """Through the entry point plugin authors call: the ordinary checks pass, the hostile ones do not."""
    with pytest.raises(ConformanceError) as raised:
        check_parser(recursive_parser)
    message = str(raised.value)
    assert message.startswith("parser recursive_parser: raised RecursionError: maximum recursion depth exceeded")
    assert "on a hostile reply ('[' nested" in message
    assert "must return (thought, action) or raise mlgym_registry.errors.FormatError on every reply" in message
    assert "mlgym_registry.bounded_json.loads" in message


def test_check_parser_itself_fails_a_value_error_on_too_many_digits():
    with pytest.raises(ConformanceError, match=r"digits_parser: raised ValueError: Exceeds the limit .* \(digits as "
                                               r"a JSON command"):
        check_parser(digits_parser, well_formed={'{"command": "ls -a"}': "ls -a"})


def test_a_linear_parser_that_is_slow_passes():
    """A character loop in Python: slow (tens of ms at 10^5 characters) but linear, so not failed for its speed."""

    def char_loop(response: str) -> tuple[str, str]:
        depth = 0
        for char in response:
            depth += char == "["
        raise FormatError(f"nothing here ({depth})")

    check_parser_hostile(char_loop, _family("'[' nested") + _family("spaces") + _family("a long discussion before "
                                                                                           "a command"))


# -- through a real env ----------------------------------------------------------------------------------------------
HOSTILE_STEPS = (
    "<tool_call>" + "[" * DEEP + "</tool_call>",
    "<tool_call>" + " " * 100_000 + "x",
    "<tool_call>" * 20_000,
    "\x00" * 10_000 + "\ud800" * 10_000,
    "```\n" * 50_000,
)


@pytest.fixture(scope="module")
def tool_env():
    from mlgym_registry import BackendUnavailable

    try:
        env = registry.make("prisonersDilemma", parser="tool_calls", template="tool_calling", reward_wrong_format=-0.5,
                            max_format_errors=None, batch_size=())  # no exit_format after 3 in a row
        td = env.reset()
    except BackendUnavailable as exc:
        pytest.skip(f"local backend unavailable here: {exc}")
    yield env, td
    env.close()


def step(env, td, response):
    td["text", "response"] = response
    td = env.step(td)
    return td["next"], env.step_mdp(td)


def test_hostile_replies_through_a_real_env_are_format_errors(tool_env):
    env, td = tool_env
    for reply in HOSTILE_STEPS:
        start = time.thread_time()
        nxt, td = step(env, td, reply)
        assert time.thread_time() - start < 10  # well under a second: linear parsing of at most 100 KB
        assert nxt["retry"].item() is True, reply[:40]
        assert nxt["reward"].item() == -0.5  # the format penalty, as for any format error
    nxt, td = step(env, td, encode_call("bash", {"command": "ls"}))
    assert nxt["retry"].item() is False and "strategy.py" in nxt["observation"]  # the episode went on


def nesting_sensitive_parser(response: str) -> tuple[str, str]:
    """A third party's parser that reads fenced blocks but recurses on brackets (RecursionError on deep input)."""
    return recursive_parser(response)


def always_raising_parser(response: str) -> tuple[str, str]:
    raise ValueError("cannot read anything")


def test_a_third_party_parser_that_raises_on_a_hostile_reply_gives_a_format_error_and_a_warning():
    registry.register("parser", "nesting_sensitive", nesting_sensitive_parser)
    env = registry.make("prisonersDilemma", parser="nesting_sensitive", reward_wrong_format=-0.5, batch_size=())
    try:
        td = env.reset()
        with pytest.warns(ParserFailedWarning) as caught:
            nxt, td = step(env, td, "DISCUSSION\n" + "[" * DEEP + "\n```\nls -a\n```")
        assert nxt["retry"].item() is True and nxt["reward"].item() == -0.5
        assert nxt["message"].startswith("Your reply could not be used") or "could not be read" in str(nxt["message"])
        message = str(caught[0].message)
        for part in ("parser 'nesting_sensitive' (registered in this process", "raised RecursionError",
                     "on a reply of 50,", "`mlgym-registry check --kind parser nesting_sensitive`",
                     "The reply was taken as a format error"):
            assert part in message, part
        nxt, td = step(env, td, "DISCUSSION\nlook\n```\nls -a\n```")
        assert nxt["retry"].item() is False and "strategy.py" in nxt["observation"]
    finally:
        env.close()
        registry.unregister("parser", "nesting_sensitive")


def test_a_parser_that_reads_nothing_still_fails_the_step():
    registry.register("parser", "always_raising", always_raising_parser)
    env = registry.make("prisonersDilemma", parser="always_raising", batch_size=())
    try:
        td = env.reset()
        td["text", "response"] = "DISCUSSION\nlook\n```\nls -a\n```"
        with warnings.catch_warnings():
            warnings.simplefilter("error", ParserFailedWarning)  # broken, not beaten by the reply: no warning
            with pytest.raises(ComponentRaisedError, match="parser 'always_raising' .* raised ValueError"):
                env.step(td)
    finally:
        env.close()
        registry.unregister("parser", "always_raising")


def test_an_episode_records_the_hostile_turns_as_format_errors(tmp_path):
    from mlgym_registry.episodes.episode import run_episode
    from mlgym_registry.policies.base import Policy
    from mlgym_registry.records.trajectories import TrajectoryWriter, load_traj

    class Hostile(Policy):
        def __init__(self):
            self.replies = [*HOSTILE_STEPS[:2], encode_call("bash", {"command": "ls"}), HOSTILE_STEPS[2],
                            encode_call("submit", {})]

        def respond(self, messages):
            return self.replies.pop(0)

    env = registry.make("prisonersDilemma", parser="tool_calls", template="tool_calling", batch_size=())
    try:
        result = run_episode(env, Hostile(), writer=TrajectoryWriter(tmp_path, "prisonersDilemma"), max_turns=6)
    finally:
        env.close()
    assert [turn.format_error for turn in result.turns] == [True, True, False, True, False]
    assert result.turns[-1].action == "submit" and result.finished
    assert "nested deeper than 128 levels" in result.turns[0].observation
    traj = load_traj(tmp_path / "prisonersDilemma.traj")
    assert len(traj.steps) == 5 and traj.steps[0].response == HOSTILE_STEPS[0]
