"""Template sets: mlgym_default's placeholders and status block, and MLGym agent YAML files loaded by path."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import string
import textwrap

import pytest

from mlgym_registry import registry
from mlgym_registry.components.parsers import StrictThoughtActionParser, ThoughtActionParser
from mlgym_registry.components.template_set import TemplateSet
from mlgym_registry.components.templates import (
    STATUS_BLOCK,
    TEMPLATE_FIELDS,
    AgentConfigError,
    format_error_message,
    load_agent_yaml,
    mlgym_default,
    template_from_path,
)
from mlgym_registry.specs import TaskSpec

STATUS_FIELDS = {"current_step", "remaining_steps", "open_file", "working_dir"}
# TorchRL's reward parser reads these from the last message (interface formats).
TORCHRL_PATTERNS = {
    "current_step": r"\(Current Step: (\d+),",
    "remaining_steps": r"Remaining Steps: (\d+)\)",
    "open_file": r"\(Open file: (.*)\)",
    "current_directory": r"\(Current directory: (.*)\)",
}


def fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def format_args(observation: str | None = None, *, step: int = 0, max_steps: int = 50,
                open_file: str = "n/a", working_dir: str = "/home/agent/workspace") -> dict:
    """What the chain formats a template with: task fields, tool variables, the state JSON, steps, observation."""
    task = TaskSpec(id="prisonersDilemma", description="Play the iterated prisoner's dilemma {well}.",
                    training_timeout=1800, baseline_scores=[{"Score": 2.37}])
    state = json.loads(json.dumps({"open_file": open_file, "working_dir": working_dir}))
    return {
        **dataclasses.asdict(task),
        "command_docs": "open:\n  docstring: opens a file\n  signature: open \"<path>\" [<line_number>]\n",
        "WINDOW": "1000", "OVERLAP": "2", "CURRENT_LINE": "0", "CURRENT_FILE": "",
        "format_instructions": ThoughtActionParser.format_instructions.rstrip(),  # the default parser's
        **state,
        "current_step": step,
        "remaining_steps": max_steps - step,
        "observation": observation if observation is not None else "",
    }


# -- mlgym_default ------------------------------------------------------------------------------------------------
def test_status_block_is_mlgym_interface_format():
    assert STATUS_BLOCK == (
        "(Current Step: {current_step}, Remaining Steps: {remaining_steps})\n"
        "(Open file: {open_file})\n"
        "(Current directory: {working_dir})\n"
        "bash-$"
    )


def test_default_placeholders():
    t = mlgym_default()
    assert t.name == "mlgym_default"
    # {format_instructions}: how to reply in the task's parser's format, so that the prompt follows the parser
    assert fields(t.system_template) == {"WINDOW", "command_docs", "training_timeout", "format_instructions"}
    assert fields(t.task_template) == {"description"} | STATUS_FIELDS
    assert fields(t.next_step_template) == {"observation"} | STATUS_FIELDS
    assert fields(t.next_step_no_output_template) == STATUS_FIELDS
    assert fields(t.demonstration_template) == {"demonstration"}
    assert t.strategy_template is None
    assert t.format_error_template is None


def test_turn_templates_end_with_the_status_block():
    t = mlgym_default()
    for template in (t.task_template, t.next_step_template, t.next_step_no_output_template):
        assert template.endswith("\n" + STATUS_BLOCK)
    assert t.next_step_template == "{observation}\n" + STATUS_BLOCK


def test_system_template_renders_and_explains_the_format():
    text = mlgym_default().system_template.format(**format_args())
    assert "signature: open \"<path>\" [<line_number>]" in text
    assert re.search(r"\b1000\s+lines", text) and re.search(r"\b1800\s+seconds", text)
    for word in ("DISCUSSION", "validate", "submit", "one command", "Interactive"):
        assert word in text
    # Its own example reply is a valid reply for both fenced parsers.
    example = text[text.index("DISCUSSION\n"):]
    assert StrictThoughtActionParser()(example)[1] == "ls -a\n"
    assert ThoughtActionParser()(example)[1] == "ls -a\n"


def test_task_message_with_a_realistic_state():
    text = mlgym_default().task_template.format(**format_args())
    # Braces inside the task description are not placeholders: they come through untouched.
    assert "Play the iterated prisoner's dilemma {well}." in text
    assert text.endswith(
        "(Current Step: 0, Remaining Steps: 50)\n(Open file: n/a)\n(Current directory: /home/agent/workspace)\nbash-$"
    )


def test_next_step_messages_parse_with_torchrl_patterns():
    t = mlgym_default()
    args = format_args("File updated.", step=7, open_file="/tmp/ws/strategy.py", working_dir="/tmp/ws")
    for template in (t.next_step_template, t.next_step_no_output_template):
        text = template.format(**args)
        parsed = {key: re.search(pattern, text).group(1) for key, pattern in TORCHRL_PATTERNS.items()}
        assert parsed == {"current_step": "7", "remaining_steps": "43", "open_file": "/tmp/ws/strategy.py",
                          "current_directory": "/tmp/ws"}
    assert t.next_step_template.format(**args).startswith("File updated.\n(Current Step: 7,")
    assert "printed nothing" in t.next_step_no_output_template.format(**args)


def test_observation_with_braces_is_not_reformatted():
    text = mlgym_default().next_step_template.format(**format_args("{'Score': 2.5} and {placeholder}"))
    assert text.startswith("{'Score': 2.5} and {placeholder}\n")


def test_registered_default_template():
    t = registry.get("template", "mlgym_default")
    assert isinstance(t, TemplateSet)
    assert t == mlgym_default()


# -- format error messages ------------------------------------------------------------------------------------------
def test_format_error_message_sources():
    parser = StrictThoughtActionParser()
    assert format_error_message(mlgym_default(), parser) == parser.format_error_message
    custom = dataclasses.replace(mlgym_default(), format_error_template="Use one fenced block, please.")
    assert format_error_message(custom, parser) == "Use one fenced block, please."
    assert "expected format" in format_error_message(mlgym_default(), lambda response: ("", response))


# -- MLGym agent YAML -----------------------------------------------------------------------------------------------
AGENT_YAML = """\
system_template: |-
  You work in a shell. The viewer shows {WINDOW} lines.
  {command_docs}
  Jobs stop after {training_timeout} seconds.
task_template: |-
  Task: {description}
  (Current Step: {current_step}, Remaining Steps: {remaining_steps})
  (Open file: {open_file})
  (Current directory: {working_dir})
  bash-$
next_step_template: |-
  {observation}
  (Current Step: {current_step}, Remaining Steps: {remaining_steps})
  (Open file: {open_file})
  (Current directory: {working_dir})
  bash-$
strategy_template: Think before you act.
format_error_template: Wrong format; use one fenced block.
output_parser: MLGymThoughtActionParser
history_processor: Last5Observations
tools:
  env_variables:
    WINDOW: 1000
  command_files:
    - tools/defaults.sh
"""


@pytest.fixture
def agent_yaml(tmp_path):
    path = tmp_path / "my_agent.yaml"
    path.write_text(AGENT_YAML)
    return path


def test_load_agent_yaml(agent_yaml):
    t = load_agent_yaml(agent_yaml)
    assert t.name == "my_agent"
    assert t.system_template.startswith("You work in a shell. The viewer shows {WINDOW} lines.\n")
    assert fields(t.task_template) == {"description"} | STATUS_FIELDS
    assert t.strategy_template == "Think before you act."
    assert t.format_error_template == "Wrong format; use one fenced block."
    assert t.next_step_no_output_template is None and t.demonstration_template is None
    # MLGym's fallbacks: no next_step_no_output_template -> next_step_template.
    assert t.next_step_no_output == t.next_step_template
    text = t.next_step.format(**format_args("ok", step=3))
    assert text == "ok\n(Current Step: 3, Remaining Steps: 47)\n(Open file: n/a)\n" \
                   "(Current directory: /home/agent/workspace)\nbash-$"
    assert load_agent_yaml(agent_yaml, name="other").name == "other"


def test_template_fields_match_the_dataclass():
    assert set(TEMPLATE_FIELDS) == {f.name for f in dataclasses.fields(TemplateSet)} - {"name"}


def test_minimal_agent_yaml_falls_back_to_task_template(tmp_path):
    path = tmp_path / "tiny.yml"
    path.write_text("system_template: hi\ntask_template: 'do {description}'\n")
    t = load_agent_yaml(path)
    assert (t.name, t.next_step, t.next_step_no_output) == ("tiny", "do {description}", "do {description}")


@pytest.mark.parametrize(
    "content, message",
    [
        ("- a list\n", "must hold a mapping"),
        ("task_template: x\n", "no system_template"),
        ("system_template: x\n", "no task_template"),
        ("system_template: x\ntask_template: y\nnext_step_template: [1, 2]\n", "next_step_template must be a string"),
        ("system_template: 'x\n", "not valid YAML"),
    ],
)
def test_bad_agent_yaml(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(AgentConfigError, match=message):
        load_agent_yaml(path)


def test_missing_agent_yaml(tmp_path):
    with pytest.raises(AgentConfigError, match="does not exist"):
        load_agent_yaml(tmp_path / "nope.yaml")


def test_register_agent_yaml_with_a_lambda(agent_yaml):
    registry.register("template", "test_mine_lambda", lambda: load_agent_yaml(agent_yaml))
    try:
        assert registry.get("template", "test_mine_lambda") == load_agent_yaml(agent_yaml)
    finally:
        registry.unregister("template", "test_mine_lambda")


def test_template_from_path_is_lazy_picklable_and_cwd_proof(agent_yaml, tmp_path, monkeypatch):
    monkeypatch.chdir(agent_yaml.parent)
    factory = template_from_path(agent_yaml.name)
    monkeypatch.chdir(tmp_path.parent)
    restored = pickle.loads(pickle.dumps(factory))
    assert restored() == factory() == load_agent_yaml(agent_yaml)
    registry.register("template", "test_mine_path", factory)
    try:
        assert registry.get("template", "test_mine_path").name == "my_agent"
    finally:
        registry.unregister("template", "test_mine_path")
    # Lazy: nothing is read until the factory is called.
    missing = template_from_path(os.fspath(tmp_path / "later.yaml"))
    (tmp_path / "later.yaml").write_text(textwrap.dedent(AGENT_YAML))
    assert missing().name == "later"
