"""Parsers carry their format: ``format_instructions`` in the system prompt, ``format_action`` for responses, and
the scripted policy that writes in the env's parser's format."""

from __future__ import annotations

import pytest

from mlgym_registry import ComponentOutputError, FormatError, registry
from mlgym_registry.components.parsers import (
    IdentityParser,
    StrictThoughtActionParser,
    ThoughtActionParser,
    XMLThoughtActionParser,
)
from mlgym_registry.components.templates import GENERIC_FORMAT_INSTRUCTIONS, load_agent_yaml
from mlgym_registry.episodes.episode import run_episode
from mlgym_registry.policies import make_policy
from mlgym_registry.policies.scripted import ScriptedPolicy, in_format
from mlgym_registry.records.trajectories import load_traj
from mlgym_registry.testing import ConformanceError, check_isolator, check_parser

TAGGED = "xml_thought_action"
BUILT_IN = {"thought_action": ThoughtActionParser, "mlgym_thought_action": StrictThoughtActionParser,
            TAGGED: XMLThoughtActionParser, "identity": IdentityParser}
FENCED_RULE = "Exactly one command, in a fenced code block"
TAGGED_RULE = "between a line holding the tag <command>"


def system_and_task(**overrides) -> tuple[str, str]:
    """The system and task messages of a fresh prisonersDilemma env made with ``overrides``."""
    env = registry.make("prisonersDilemma", batch_size=(), **overrides)
    try:
        td = env.reset()
        history = td["history", "prompt"]
        assert history.role[:2] == ["system", "user"]
        return history.content[0], history.content[1]
    finally:
        env.close()


@pytest.fixture
def parser_name():
    """Registers parsers for one test under fresh names and removes them afterwards."""
    names: list[str] = []

    def register(name: str, parser: object) -> str:
        registry.register("parser", name, parser)
        names.append(name)
        return name

    yield register
    for name in names:
        registry.unregister("parser", name)


# -- the system prompt follows the parser ---------------------------------------------------------------------------
def test_default_prompt_asks_for_a_fenced_block():
    system, task = system_and_task()
    assert ThoughtActionParser.format_instructions.strip() in system
    assert FENCED_RULE in system and "```\nls -a\n```" in system
    assert "<command>" not in system
    assert "{format_instructions}" not in system
    assert "fenced code block" not in task
    assert "Reply in the format described in the system message" in task


def test_tagged_parser_prompt_asks_for_command_tags():
    system, task = system_and_task(parser=TAGGED)
    assert XMLThoughtActionParser.format_instructions.strip() in system
    assert TAGGED_RULE in system and "<command>\nls -a\n</command>" in system
    assert FENCED_RULE not in system and "```" not in system
    assert "fenced code block" not in task


@pytest.mark.parametrize("name", ["mlgym_thought_action", "identity"])
def test_each_built_in_parser_puts_its_own_instructions_in_the_prompt(name):
    system, _ = system_and_task(parser=name)
    assert BUILT_IN[name].format_instructions.strip() in system
    if name == "identity":
        assert FENCED_RULE not in system and "nothing else" in system
    else:
        assert "only one code block" in system


def test_parser_without_instructions_gets_the_generic_text(parser_name):
    def bare(response: str) -> tuple[str, str]:
        if not response.strip():
            raise FormatError("empty response")
        return "", response

    name = parser_name("pf_no_instructions", bare)
    system, _ = system_and_task(parser=name)
    assert GENERIC_FORMAT_INSTRUCTIONS in system
    assert FENCED_RULE not in system and "<command>" not in system


def test_parser_with_only_format_action_is_shown_by_its_example(parser_name):
    class Angle:
        def __call__(self, response: str) -> tuple[str, str]:
            start, end = response.rfind("<<"), response.rfind(">>")
            if start < 0 or end < start:
                raise FormatError("no <<command>>")
            return response[:start], response[start + 2:end]

        def format_action(self, action: str) -> str:
            return f"<<{action}>>"

    system, _ = system_and_task(parser=parser_name("pf_angle", Angle()))
    assert "<<ls -a>>" in system
    assert GENERIC_FORMAT_INSTRUCTIONS not in system


def test_instructions_that_are_not_a_str_name_the_parser(parser_name):
    class Broken(ThoughtActionParser):
        format_instructions = ["Reply with a fenced block."]

    name = parser_name("pf_broken_instructions", Broken())
    env = registry.make("prisonersDilemma", parser=name)
    try:
        with pytest.raises(ComponentOutputError) as caught:
            env.reset()
    finally:
        env.close()
    message = str(caught.value)
    assert "pf_broken_instructions" in message and "format_instructions" in message
    assert "must be a string" in message


def test_mlgym_agent_yaml_keeps_its_own_text(tmp_path):
    path = tmp_path / "my_agent.yaml"
    path.write_text(
        "system_template: |-\n"
        "  SETUP. Window {WINDOW}. Wrap your command in triple backticks.\n"
        "  {command_docs}\n"
        "task_template: |-\n"
        "  TASK: {description}\n"
        "  (Open file: {open_file}) (Current directory: {working_dir})\n"
        "next_step_template: |-\n"
        "  {observation}\n"
    )
    registry.register("template", "pf_agent_yaml", lambda: load_agent_yaml(path))
    try:
        system, task = system_and_task(template="pf_agent_yaml", parser=TAGGED)
    finally:
        registry.unregister("template", "pf_agent_yaml")
    assert system.startswith("SETUP. Window ") and "Wrap your command in triple backticks." in system
    assert "<command>" not in system  # the YAML has no {format_instructions}: its own text stays as written
    assert task.startswith("TASK: ") and "Prisoner's Dilemma" in task


# -- format_action --------------------------------------------------------------------------------------------------
COMMANDS = ("ls -a", "validate", 'open "strategy.py"', "python train.py --epochs 3 > log.txt 2>&1",
            "edit 1:2\ndef f(x):\n    return (x, 'a')\nend_of_edit", "echo '<tag>' && cat a.txt\n")


@pytest.mark.parametrize("name", sorted(BUILT_IN))
@pytest.mark.parametrize("command", COMMANDS)
def test_format_action_round_trips(name, command):
    parser = registry.get("parser", name)
    assert type(parser) is BUILT_IN[name]
    response = parser.format_action(command)
    assert isinstance(response, str)
    action = parser(response)[1]
    assert action.strip() == command.strip()
    if name in ("thought_action", "mlgym_thought_action"):
        assert action == command.rstrip("\n") + "\n"  # a fenced block's action keeps one trailing newline
    elif name == TAGGED:
        assert action == command.strip()
    else:
        assert action == command


def test_format_action_examples():
    assert ThoughtActionParser().format_action("ls -a") == "```\nls -a\n```"
    assert XMLThoughtActionParser().format_action("ls -a") == "<command>\nls -a\n</command>"
    assert IdentityParser().format_action("ls -a") == "ls -a"


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_built_in_parsers_pass_the_kit_with_their_own_format(name):
    parser = registry.get("parser", name)
    assert isinstance(parser.format_instructions, str) and parser.format_instructions.strip()
    assert isinstance(parser.format_error_message, str) and "{" not in parser.format_error_message
    check_parser(parser)
    check_isolator(registry.get("isolator", "code_block"), parser)


def test_instructions_and_retry_text_share_the_rule():
    for cls, rule in ((ThoughtActionParser, FENCED_RULE), (StrictThoughtActionParser, FENCED_RULE),
                      (XMLThoughtActionParser, TAGGED_RULE)):
        assert rule in cls.format_instructions and rule in cls.format_error_message
    assert "only one code block" in StrictThoughtActionParser.format_instructions
    for text in (IdentityParser.format_instructions, IdentityParser.format_error_message):
        assert "nothing else" in text


def test_kit_accepts_a_parser_that_declares_neither():
    def bare(response: str) -> tuple[str, str]:
        if not response.strip():
            raise FormatError("empty response")
        return "", response

    check_parser(bare)


def test_kit_refuses_instructions_that_are_not_a_str():
    class Listed(XMLThoughtActionParser):
        format_instructions = ("Use <command> tags.",)

    with pytest.raises(ConformanceError, match="format_instructions"):
        check_parser(Listed())


def test_kit_refuses_a_format_action_that_does_not_round_trip():
    class Forgetful(XMLThoughtActionParser):
        def format_action(self, action: str) -> str:
            return "<command>pwd</command>"

    with pytest.raises(ConformanceError, match="format_action"):
        check_parser(Forgetful())


# -- the scripted policy writes in the parser's format ----------------------------------------------------------------
def test_in_format_follows_the_parser():
    assert in_format(ThoughtActionParser(), "Look.", "ls -a") == "DISCUSSION\nLook.\n```\nls -a\n```"
    assert in_format(None, "Look.", "ls -a") == "DISCUSSION\nLook.\n```\nls -a\n```"
    assert in_format(XMLThoughtActionParser(), "Look.", "ls -a") == "DISCUSSION\nLook.\n<command>\nls -a\n</command>"
    assert in_format(IdentityParser(), "Look.", "ls -a") == "ls -a"  # no room for a discussion


def test_scripted_policy_takes_the_parser_by_name_or_from_the_spec():
    assert isinstance(make_policy("scripted", parser=TAGGED).parser, XMLThoughtActionParser)
    policy = ScriptedPolicy(parser="mlgym_registry.components.parsers:IdentityParser")
    assert isinstance(policy.parser, IdentityParser)
    policy.reset(registry.spec("prisonersDilemma").replace(parser=TAGGED))
    assert isinstance(policy.parser, XMLThoughtActionParser)
    assert policy([{"role": "user", "content": "start"}]).endswith("<command>\nls -a\n</command>")


@pytest.mark.parametrize("name", [TAGGED, "identity"])
def test_scripted_episode_has_no_format_error(name):
    env = registry.make("prisonersDilemma", parser=name, batch_size=())
    try:
        result = run_episode(env, make_policy("scripted"), seed=0)
    finally:
        env.close()
    assert result.finished and result.info["exit_status"] == "submitted"
    assert not any(turn.format_error for turn in result.turns)
    assert result.turns[-1].action.strip() == "submit"


def test_cli_scripted_run_with_tagged_parser_submits(tmp_path, capsys):
    from mlgym_registry.cli import main as cli_main

    out = tmp_path / "tagged"
    assert cli_main(["run", "prisonersDilemma", "--policy", "scripted", "--parser", TAGGED, "--seed", "0",
                     "--out", str(out), "--quiet"]) == 0
    trajectory = load_traj(out / "prisonersDilemma.traj")
    assert trajectory.info["exit_status"] == "submitted"
    assert all(step.action.strip() for step in trajectory.steps)  # a format error is a step with an empty action
    assert all("<command>" in step.response and "```" not in step.response for step in trajectory.steps)
    assert trajectory.steps[-1].action.strip() == "submit"


def test_worker_text_policy_writes_in_the_parser_format():
    """``run_parallel``'s workers rebuild the policy from its text, with the parser named by the spec."""
    import pickle

    from mlgym_registry.interop.torchrl.collectors import TextPolicy
    from mlgym_registry.interop.torchrl.env_factory import EnvFactory

    spec = registry.spec("prisonersDilemma").replace(parser=TAGGED, max_steps=4, components={})
    factory = EnvFactory.from_spec(spec)
    module = pickle.loads(pickle.dumps(TextPolicy("scripted", task_id=spec.id, parser=TAGGED)))
    env = factory()
    try:
        td = env.reset()
        for expected in ("ls -a", 'open "strategy.py"'):
            td = module(td)
            assert str(td["text", "response"]).endswith(f"<command>\n{expected}\n</command>")
            td = env.step(td)
            assert not td["next", "retry"].any()  # the chain found the command: no format error
            td = td["next"].exclude("reward", "done", "terminated", "truncated")
    finally:
        env.close()
