"""Issue 24, items 1-8: what stopped or misled a plugin author who built a distribution from the docs alone. Each
test goes through the public API or the command line, with small plugin distributions installed in a fake site
folder (``fake_site``), and checks that the message names the component, its distribution and the fix."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import yaml
from conftest import run_cli
from outside_data import REPO

from mlgym_registry import Registry, registry
from mlgym_registry.errors import ComponentRaisedError, PluginLoadError, UnknownNameError
from mlgym_registry.evaluation.evaluator_runs import compare_baseline
from mlgym_registry.plugins import PluginLoadWarning
from mlgym_registry.specs import TaskFieldWarning, load_task_yaml
from mlgym_registry.testing import ConformanceError, check_reward_assigner, check_task

TASKS = REPO / "src" / "mlgym_registry" / "tasks"

TEMPLATES_PLUGIN = """
from mlgym_registry import hookimpl
from mlgym_registry.components.template_set import TemplateSet


@hookimpl
def register_templates(register):
    register("retrying", "templates_plugin:retrying")
    register("wandering", "templates_plugin:wandering")


def retrying():
    return TemplateSet(name="retrying", system_template="Shell.\\n{command_docs}\\n{format_instructions}",
                       task_template="{description} (in {working_dir})", next_step_template="{observation}",
                       format_error_template='No command was run: {error}. Reply as {"command": "ls"}.')


def wandering():
    return TemplateSet(name="wandering", system_template="You are in {working_dir}.\\n{command_docs}",
                       task_template="{description}", next_step_template="{observation}")
"""

KEYED_REWARD = """
from mlgym_registry import hookimpl


@hookimpl
def register_reward_assigners(register):
    register("keyed", "keyed_plugin:keyed")


def keyed(observation, info, spec):
    if info["exit_status"] == "submitted":
        return float(info["scores"][-1]["Score"])   # the author's typo: the key is "score"
    return 0.0
"""

TYPO_PLUGIN = """
from mlgym_registry import hookimpl


@hookimpl
def register_parsers(register):
    register("typo_attribute", "typo_components:JsonParsr")
    register("typo_module", "typo_componets:JsonParser")
"""

TYPO_COMPONENTS = """
class JsonParser:
    def __call__(self, response):
        return "", response
"""

CLASH_PLUGIN = """
from mlgym_registry import hookimpl


@hookimpl
def register_parsers(register):
    register("thought_action", "clash_plugin:mine")
    register("clash_own", "clash_plugin:mine")


def mine(response):
    return "", response
"""


def test_1_template_sets_are_checked_against_the_placeholders_the_env_passes(fake_site):
    fake_site.add("templates-plugin", "templates_plugin", TEMPLATES_PLUGIN)
    result = run_cli("check", "--plugin", "templates-plugin", env=fake_site.env())
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^ok +template +retrying$", result.stdout, re.MULTILINE)  # {error} is allowed there
    line = next(line for line in result.stdout.splitlines() if line.startswith("FAIL"))
    assert line.startswith("FAIL template wandering (distribution templates-plugin): template set 'wandering': ")
    assert "system_template uses {working_dir}, which only the turn templates" in line
    assert "makes the env's reset fail. Move it to a turn template or remove it." in line
    assert "TemplateSet" not in line


def _broken_task(tmp_path: Path) -> Path:
    """The built-in prisonersDilemma as an author might misspell it."""
    shutil.copytree(TASKS / "data" / "prisonersDilemma", tmp_path / "data" / "prisonersDilemma")
    data = yaml.safe_load((TASKS / "prisonersDilemma.yaml").read_text())
    data.update(id="brokenDilemma", task_entrypoint="PythonSubmisionTasks", parser="thought_actoin",
                description="  ", starter_cod=["data/prisonersDilemma/strategy.py"], my_note="a free-form extra")
    path = tmp_path / "brokenDilemma.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_2_check_task_reports_misspelt_and_empty_fields(tmp_path):
    path = _broken_task(tmp_path)
    with pytest.warns(TaskFieldWarning) as caught:
        spec = load_task_yaml(path)
    assert [str(w.message) for w in caught] == [
        f"task file {str(path)!r}: unknown key 'starter_cod', kept as a free-form extra; did you mean "
        "'starter_code'? Rename it to 'starter_code' (until then 'starter_code' keeps its default)"]
    assert spec.extra["my_note"] == "a free-form extra"  # not close to a field: kept without a word

    report = check_task(path, runs=1, raise_on_failure=False)
    assert not report.ok
    problems = "\n".join(report.problems)
    assert "task_entrypoint 'PythonSubmisionTasks' is not one of MLGym's task classes" in problems
    assert "Did you mean 'PythonSubmissionTasks'? Fix 'task_entrypoint:' in the task file" in problems
    assert "unknown parser 'thought_actoin'. Did you mean 'thought_action'" in problems
    assert "The task's 'parser:' field names it" in problems
    assert "description is empty: the prompt's TASK DESCRIPTION would show nothing" in problems
    assert any("did you mean 'starter_code'?" in warning for warning in report.warnings)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskFieldWarning)
        with pytest.raises(UnknownNameError) as raised:
            registry.make(str(path))
    assert f"Task {str(path)!r} names parser 'thought_actoin': fix its 'parser:' field" in str(raised.value)


def test_3_a_raising_reward_is_one_line_and_the_traj_keeps_the_submit(fake_site, tmp_path):
    fake_site.add("keyed-plugin", "keyed_plugin", KEYED_REWARD)
    out = tmp_path / "run"
    result = run_cli("run", "prisonersDilemma", "--reward", "keyed", "--out", str(out), "--quiet",
                     env=fake_site.env())
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("mlgym-registry: error:")]
    assert len(error) == 1
    for part in ("reward assigner 'keyed' (from keyed-plugin) raised KeyError: 'scores'",
                 "on a step with exit_status 'submitted', evaluation_status 'ok'",
                 "a reward assigner must return a float for every step, never raise",
                 "`mlgym-registry check --kind reward keyed` runs the conformance kit on it"):
        assert part in error[0]
    traj = json.loads(next(out.glob("*.traj")).read_text())
    assert traj["trajectory"][-1]["action"].strip() == "submit"
    assert traj["info"]["exit_status"] == "submitted"


def test_3_every_component_kind_that_raises_during_a_step_is_named():
    def exploding_parser(response):
        raise ValueError("cannot read this")

    def exploding_history(messages):
        if len(messages) > 2:
            raise RuntimeError("lost count")
        return list(messages)

    for kind, name, component in (("parser", "exploding_parser", exploding_parser),
                                  ("history", "exploding_history", exploding_history)):
        registry.register(kind, name, component)
        env = registry.make("prisonersDilemma", batch_size=(), **{kind: name})
        try:
            td = env.reset()
            td["text", "response"] = "DISCUSSION\nlook\n```\nls -a\n```"
            with pytest.raises(ComponentRaisedError) as raised:
                env.step(td)
        finally:
            env.close()
            registry.unregister(kind, name)
        assert raised.value.kind == kind and raised.value.name == name
        assert str(raised.value).startswith(f"{raised.value.LABELS[kind]} {name!r} (registered in this process")
        assert f"`mlgym-registry check --kind {kind} {name}`" in str(raised.value)


STATUS_TABLE_REWARD_PAYS = {"": 0.0, "submitted": 1.0, "skipped": 0.0, "exit_forfeit": -1.0,
                            "autosubmission (exit_format)": 0.0, "evaluation_format_error (submit)": -1.0}


def status_table_reward(observation, info, spec):
    """Written against the statuses the kit used to show: it raises on every other one."""
    return STATUS_TABLE_REWARD_PAYS[info["exit_status"]]


def test_4_the_reward_check_feeds_every_status_the_env_produces():
    with pytest.raises(ConformanceError) as raised:
        check_reward_assigner(status_table_reward, registry.spec("prisonersDilemma"))
    message = str(raised.value)
    assert message.startswith("reward assigner status_table_reward: raised KeyError: 'submission_not_found (submit)'")
    assert "exit_status='submission_not_found (submit)', evaluation_status='invalid_submission'" in message
    assert "read info['score'][-1] only when info['evaluation_status'] == 'ok'" in message


def test_5_check_with_one_run_of_a_stochastic_evaluator_warns_instead_of_failing():
    result = run_cli("check", "prisonersDilemma", "--runs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING: Score: recorded 2.376" in result.stdout
    assert "one run gives no noise estimate" in result.stdout and "check --runs 3" in result.stdout
    spec = registry.spec("prisonersDilemma")
    single = compare_baseline(spec, [{"Score": 2.5}])
    assert single.reproduced and single.mismatches == [] and len(single.unconfirmed) == 1
    several = compare_baseline(spec, [{"Score": 2.5}, {"Score": 2.5001}])  # with a spread: judged, and wrong
    assert not several.reproduced and several.unconfirmed == []


def test_6_a_crashed_strategy_shows_the_agent_its_own_traceback():
    from mlgym_registry.backends.local import LocalBackend
    from mlgym_registry.records.observation_kinds import observation_kind

    with LocalBackend(registry.spec("prisonersDilemma")) as env:
        env.reset()
        env.install_tools()
        env.communicate("printf 'def row_strategy(history):\\n    moves = {}\\n    return moves[\"next\"]\\n' "
                        "> strategy.py")
        observation, _, done, info = env.step("validate")
    assert not done and info["evaluation_status"] == "agent_error"
    assert observation.startswith("Evaluation failed: your code raised an exception while the evaluator ran it")
    assert f'File "{env.task_workspace}/strategy.py", line 3, in row_strategy' in observation
    assert "KeyError: 'next'" in observation
    assert "harness" not in observation and "json format" not in observation
    assert "Fix your code where the traceback points" in observation
    assert observation_kind(observation) == "validate_error"
    tasks_doc = (REPO / "docs" / "tasks.md").read_text()
    assert "*submission artefact*" in tasks_doc and "`<workspace>/target.py`" in tasks_doc


def test_7_messages_name_the_fix(fake_site):
    fake_site.add("typo-plugin", "typo_plugin", TYPO_PLUGIN)
    (fake_site.path / "typo_components.py").write_text(TYPO_COMPONENTS)
    fake_site.add("entry-typo", "entry_typo_plugin", "", entry_point="plugin")
    info = fake_site.path / "entry_typo-0.1.dist-info" / "entry_points.txt"
    info.write_text("[mlgym_registry]\nplugin = entry_typo_plugn\n")  # the misspelt entry point
    fake_site.add("clash-plugin", "clash_plugin", CLASH_PLUGIN)

    reg = Registry()
    with pytest.warns(PluginLoadWarning) as caught:
        parsers = reg.names("parser")
    # a built-in name is refused alone: the plugin's other components load
    assert "clash_own" in parsers and reg.entry("parser", "thought_action").distribution == "mlgym-registry"
    clash = next(str(w.message) for w in caught.list if "clash-plugin" in str(w.message))
    assert clash.startswith("distribution 'clash-plugin' registers parser 'thought_action', a name the built-in plugin")
    assert "Rename yours: register('clash_plugin_thought_action', ...) in the plugin's register_parsers hook" in clash
    assert "replace=True" in clash and "ninstall" not in clash
    entry = next(e for e in reg.load_errors() if isinstance(e, PluginLoadError))
    assert entry.distribution == "entry-typo"
    assert "ModuleNotFoundError" in str(entry)
    assert "pyproject.toml ([project.entry-points.mlgym_registry])" in str(entry)
    assert "reinstall the distribution" in str(entry)

    result = run_cli("check", "--plugin", "typo-plugin", env=fake_site.env())
    assert result.returncode == 1
    lines = {line.split()[2]: line for line in result.stdout.splitlines() if line.startswith("FAIL")}
    assert "(distribution typo-plugin)" in lines["typo_attribute"]
    assert "Fix the registration string 'typo_components:JsonParsr'" in lines["typo_attribute"]
    assert "did you mean 'typo_components:JsonParser'?" in lines["typo_attribute"]
    assert "Fix the registration string 'typo_componets:JsonParser'" in lines["typo_module"]
    assert "did you mean 'typo_components'?" in lines["typo_module"]
    assert "Fix that module" not in result.stdout and "fix that module" not in result.stdout
    result = run_cli("check", "--plugin", "clash-plugin", env=fake_site.env())
    assert re.search(r"^ok +parser +clash_own$", result.stdout, re.MULTILINE)
    assert "FAIL plugin   plugin (distribution clash-plugin): distribution 'clash-plugin' registers parser" in \
        result.stdout


def test_8_the_authors_guide_covers_history_processors_and_the_kit():
    guide = (REPO / "docs" / "plugins.md").read_text()
    for part in ("### History processors", "check_history_processor(processor)", "register_history_processors",
                 "a class is instantiated with no arguments", "a function, or any other object, is used as it is",
                 "`summary`", "testing.template_fields()"):
        assert part in guide, part
    assert "TASK_YAML" not in (REPO / "docs" / "tasks.md").read_text()  # the page's code runs outside the docs test
