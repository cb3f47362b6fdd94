"""The registry's public API: names, get, register, spec, did-you-mean, duplicates, overrides."""

from __future__ import annotations

import json
import threading
import warnings

import pytest
from conftest import run_python

from mlgym_registry import (
    FormatError,
    InvalidOverrideError,
    Registry,
    TaskSpec,
    UnknownNameError,
    load_task_yaml,
    registry,
)
from mlgym_registry.plugins import PluginReplaceWarning
from mlgym_registry.specs import KINDS

TASK_YAML = """\
id: tinyTask
name: A tiny task
description: Write a strategy.
task_entrypoint: PythonSubmissionTasks
training_timeout: 60
starter_code:
  - data/tiny/strategy.py
baseline_paths: [evaluate.py]
evaluation_paths: [evaluate.py]
evaluation_read_only: true
baseline_scores:
  - Score: 1.5
max_steps: 7
tags: [games]
priority_metric: Score
"""


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "tasks" / "tinyTask.yaml"
    path.parent.mkdir()
    path.write_text(TASK_YAML)
    return path


def test_every_kind_lists_the_built_in_components():
    assert {"thought_action", "mlgym_thought_action", "xml_thought_action", "identity"} <= set(registry.names("parser"))
    assert "mlgym_default" in registry.names("template")
    assert "mlgym_score_delta" in registry.names("reward")
    assert "code_block" in registry.names("isolator")
    assert {"local", "mlgym"} <= set(registry.names("backend"))
    assert registry.names("parser") == sorted(registry.names("parser"))


def test_unknown_kind_is_an_error_that_lists_the_kinds():
    with pytest.raises(UnknownNameError) as info:
        registry.names("parsers")
    assert "Did you mean 'parser'?" in str(info.value)


def test_unknown_name_suggests_the_closest_match():
    with pytest.raises(UnknownNameError) as info:
        registry.get("parser", "thought_acton")
    error = info.value
    assert isinstance(error, KeyError)
    assert error.kind == "parser" and error.name == "thought_acton"
    assert error.suggestions[0] == "thought_action"
    assert "Did you mean 'thought_action'" in str(error)


def test_unknown_name_in_an_empty_namespace_says_so():
    with pytest.raises(UnknownNameError, match="namespace 'nowhere/'"):
        registry.spec("nowhere/prisonersDilemma")


def test_register_get_and_unregister_an_object():
    reg = Registry(load_plugins=False)

    def shout(response: str) -> tuple[str, str]:
        """Everything is the action, in capitals."""
        return "", response.upper()

    reg.register("parser", "shout", shout)
    assert reg.names("parser") == ["shout"]
    assert reg.get("parser", "shout")("ls") == ("", "LS")
    info = reg.entry("parser", "shout").info()
    assert info.description == "Everything is the action, in capitals."
    assert info.ref is None  # a local function cannot be imported back by name in a worker
    reg.unregister("parser", "shout")
    assert reg.names("parser") == []


def test_lazy_reference_is_imported_on_first_use_only():
    reg = Registry(load_plugins=False)
    reg.register("parser", "lazy", "mlgym_registry_tests_missing_module:Parser")
    assert reg.names("parser") == ["lazy"]  # listing does not import it
    with pytest.raises(ModuleNotFoundError):
        reg.get("parser", "lazy")


def test_classes_are_built_fresh_for_each_env_but_get_is_cached():
    reg = Registry(load_plugins=False)

    class Counter:
        def __call__(self, observation, info, spec):
            return 0.0

    reg.register("reward", "counter", Counter)
    assert reg.get("reward", "counter") is reg.get("reward", "counter")
    assert isinstance(reg.build("reward", "counter"), Counter)
    assert reg.build("reward", "counter") is not reg.build("reward", "counter")


def test_an_in_process_register_replaces_a_taken_name_with_a_warning_naming_both():
    reg = Registry(load_plugins=False)
    reg.register("reward", "zero", lambda o, i, s: 0.0)
    with pytest.warns(PluginReplaceWarning, match="register\\(\\) replaces reward 'zero' of"):
        reg.register("reward", "zero", lambda o, i, s: 1.0)
    assert reg.get("reward", "zero")("", {}, None) == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # replace=True says it is meant: no warning
        reg.register("reward", "zero", lambda o, i, s: 2.0, replace=True)
    assert reg.get("reward", "zero")("", {}, None) == 2.0


def test_a_script_registering_a_name_the_package_later_added_keeps_working():
    """A user's ``register("template", "short", ...)`` from before the package had a built-in ``short``: the user's
    template wins, with a warning naming the built-in plugin."""
    reg = Registry()
    assert "short" in reg.names("template") and reg.entry("template", "short").distribution == "mlgym-registry"
    mine = reg.get("template", "mlgym_default")
    with pytest.warns(PluginReplaceWarning, match="template 'short' of built-in plugin"):
        reg.register("template", "short", mine)
    assert reg.get("template", "short") is mine and reg.entry("template", "short").distribution is None


def test_task_from_yaml_in_mlgym_shape(task_file):
    reg = Registry(load_plugins=False)
    reg.register("task", "tinyTask", str(task_file), description="tiny")
    spec = reg.spec("tinyTask")
    assert spec.id == "tinyTask" and spec.name == "A tiny task"
    assert spec.max_steps == 7 and spec.training_timeout == 60
    assert spec.baseline == {"Score": 1.5}
    assert spec.root == str(task_file.parent.resolve())
    assert spec.resolve_path(spec.starter_code[0]) == task_file.parent.resolve() / "data/tiny/strategy.py"
    assert spec.extra == {"priority_metric": "Score"}
    assert spec.gym_id == "mlgym/tinyTask"
    # each get returns a copy: callers cannot change the registered spec
    spec.max_steps = 99
    assert reg.spec("tinyTask").max_steps == 7


def test_bad_task_files_name_the_file(tmp_path):
    missing_id = tmp_path / "bad.yaml"
    missing_id.write_text("name: no id here\n")
    with pytest.raises(ValueError, match="bad.yaml.*no 'id'"):
        load_task_yaml(missing_id)
    not_yaml = tmp_path / "worse.yaml"
    not_yaml.write_text("id: [unclosed\n")
    with pytest.raises(ValueError, match="worse.yaml.*not valid YAML"):
        load_task_yaml(not_yaml)
    with pytest.raises(ValueError, match="does not exist"):
        load_task_yaml(tmp_path / "nope.yaml")


def test_spec_fills_lazy_component_references(task_file):
    spec = registry.spec(load_task_yaml(task_file))
    assert spec.components["parser"] == "mlgym_registry.components.parsers:ThoughtActionParser"
    assert spec.components["backend"] == "mlgym_registry.backends.local:LocalBackend"
    assert set(spec.components) == {"backend", "parser", "template", "reward", "isolator", "history"}
    assert spec.components["history"] == "mlgym_registry.components.history_processors:FullHistory"


def test_spec_json_round_trip_through_a_subprocess(task_file):
    spec = registry.spec(load_task_yaml(task_file))
    assert TaskSpec.from_json(spec.to_json()) == spec
    result = run_python(
        f"""
        import json, sys
        from mlgym_registry import TaskSpec, registry
        spec = TaskSpec.from_dict(json.loads({json.dumps(spec.to_json())}))
        again = registry.spec(spec.to_dict())
        print(json.dumps({{"spec": spec.to_dict(), "again": again.to_dict()}}))
        """
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["spec"] == spec.to_dict()
    assert data["again"] == spec.to_dict()


def test_worker_without_the_registration_rebuilds_components_from_refs(task_file):
    # an in-process parser registered by reference is importable in a worker that never registered it
    reg = Registry(load_plugins=False)
    reg.register("parser", "identity_by_ref", "mlgym_registry.components.parsers:IdentityParser")
    reg.register("task", "tiny", str(task_file))
    spec = reg.spec("tiny").replace(parser="identity_by_ref")
    spec = reg._with_component_refs(spec)
    assert spec.components["parser"] == "mlgym_registry.components.parsers:IdentityParser"
    fresh = Registry(load_plugins=False)
    pytest.importorskip("mlgym_registry.components.parsers")
    parser = fresh.component(spec, "parser")
    assert parser("ls -a") == ("ls -a", "ls -a")


def test_unknown_override_keys_are_an_error_listing_the_valid_ones(task_file):
    pytest.importorskip("mlgym_registry.transforms.chain")
    with pytest.raises(InvalidOverrideError) as info:
        registry.make(load_task_yaml(task_file), max_step=3)
    message = str(info.value)
    assert "'max_step' (did you mean 'max_steps'?)" in message
    assert "reward_wrong_format" in message and "command_timeout" in message


def test_make_takes_a_name_or_tasks_not_both():
    with pytest.raises(TypeError, match="not both"):
        registry.make("a", tasks=["b"])
    with pytest.raises(TypeError, match="not neither"):
        registry.make()


def test_errors_are_part_of_the_public_api():
    assert issubclass(FormatError, ValueError)
    assert set(KINDS) == {"task", "backend", "parser", "template", "reward", "isolator", "history", "canary"}


AGENT_YAML = """\
system_template: "You work in a shell. Tools:\\n{command_docs}"
task_template: "Task: {description}\\n(Current Step: {current_step}, Remaining Steps: {remaining_steps})"
next_step_template: "{observation}"
"""


def test_a_template_can_be_named_by_the_path_of_an_agent_yaml(task_file, tmp_path):
    agent = tmp_path / "my_agent.yaml"
    agent.write_text(AGENT_YAML)
    spec = registry.spec(load_task_yaml(task_file)).replace(template=str(agent))
    # a fresh registry (as in a worker process) rebuilds it from the path alone
    templates = Registry().component(spec, "template")
    assert templates.name == "my_agent"
    assert templates.system_template.startswith("You work in a shell.")
    assert templates.next_step_template == "{observation}"


def test_threads_that_make_envs_at_once_each_find_the_plugins_loaded():
    """The first uses of a fresh registry from several threads at once (an ``AsyncEnvPool`` worker hosting many envs
    builds them in threads): each waits for the plugins to load, instead of finding none registered yet."""
    reg = Registry()
    start = threading.Barrier(8)
    found: list[object] = []

    def look_up() -> None:
        start.wait()
        try:
            found.append(reg.get("backend", "local"))
        except Exception as exc:  # noqa: BLE001 - the failure is what the test reports
            found.append(exc)

    threads = [threading.Thread(target=look_up) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [type(item).__name__ for item in found if isinstance(item, Exception)] == []
    assert len(found) == 8 and len({id(item) for item in found}) == 1


def test_a_task_file_given_as_a_path_works_like_its_string_and_a_missing_one_is_named(task_file, tmp_path):
    from pathlib import Path

    from mlgym_registry import InvalidTaskError

    by_path, by_text = registry.spec(task_file), registry.spec(str(task_file))
    assert by_path.id == by_text.id == "tinyTask" and by_path.max_steps == by_text.max_steps == 7
    assert by_path.registered_as == str(task_file)
    assert registry.spec(Path("capitals")).id == "capitals"  # a Path naming a registered task is that task
    for missing in (tmp_path / "missing.yaml", str(tmp_path / "missing.yml"), Path("missing.yaml")):
        with pytest.raises(InvalidTaskError, match=r"task file '.*missing\.ya?ml' does not exist.*registered task"):
            registry.make(missing)
    with pytest.raises(InvalidTaskError, match="is a folder, not a task file"):
        registry.make(tmp_path)
