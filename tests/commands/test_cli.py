"""The `mlgym-registry` command: list, info, plugins; exit codes and errors on stderr."""

from __future__ import annotations

import json

from conftest import run_cli


def test_list_shows_name_kind_distribution_and_description():
    result = run_cli("list", "--kind", "backend")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    local = next(line for line in lines if line.startswith("local "))
    assert local.split()[:3] == ["local", "backend", "mlgym-registry"]
    assert "container-free" in local


def test_list_json_has_every_kind():
    rows = json.loads(run_cli("list", "--json").stdout)
    assert {"backend", "parser", "template", "reward", "isolator"} <= {r["kind"] for r in rows}
    assert all({"name", "kind", "distribution", "description", "ref"} <= set(r) for r in rows)


def test_info_of_a_component():
    result = run_cli("info", "thought_action", "--kind", "parser", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ref"] == "mlgym_registry.components.parsers:ThoughtActionParser"
    assert data["distribution"] == "mlgym-registry"


def test_unknown_name_exits_2_with_a_suggestion_on_stderr():
    result = run_cli("info", "thought_actoin", "--kind", "parser")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "unknown parser 'thought_actoin'. Did you mean 'thought_action'" in result.stderr


def test_bad_usage_exits_2():
    result = run_cli("list", "--kind", "nonsense")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_plugins_lists_the_built_ins_with_their_hooks():
    result = run_cli("plugins")
    assert result.returncode == 0
    assert "mlgym_registry.components.plugin  [mlgym-registry]  register_parsers, register_templates" in result.stdout


def test_info_without_kind_finds_the_component_the_name_means():
    result = run_cli("info", "thought_action", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kind"] == "parser"


def test_version_and_a_plain_help_listing_every_command():
    from mlgym_registry import __version__

    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"mlgym-registry {__version__}"
    help_text = run_cli("--help").stdout
    for command in ("list", "info", "plugins", "run", "replay", "check", "report", "bench", "prepare"):
        assert f"\n    {command} " in help_text, command
    assert "{" not in help_text and "``" not in help_text


def test_run_and_info_take_a_task_file_and_write_files_readable_as_the_umask_says(tmp_path):
    from pathlib import Path

    import mlgym_registry

    task_file = Path(mlgym_registry.__file__).parent / "tasks" / "prisonersDilemma.yaml"
    info = run_cli("info", str(task_file), "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["task"]["id"] == "prisonersDilemma"
    out = tmp_path / "run"
    result = run_cli("run", str(task_file), "--policy", "scripted", "--max-steps", "2", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    from mlgym_registry.records.trajectories import current_umask

    for name in ("prisonersDilemma.traj", "results.json"):  # the command inherits this process's umask
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~current_umask()


def test_the_scripted_policy_says_when_it_has_no_plan_for_the_task(tmp_path):
    result = run_cli("run", "capitals", "--policy", "scripted", "--out", str(tmp_path / "run"), "--quiet")
    assert result.returncode == 0, result.stderr
    assert "the scripted policy has no plan for task 'capitals'" in result.stderr
    assert "prisonersDilemma" in result.stderr  # where it does have one


PLUGIN_TASKS = """\
from pathlib import Path

from mlgym_registry import hookimpl

HERE = Path(__file__).parent


@hookimpl
def register_tasks(register):
    register("summedTask", str(HERE / "summed.yaml"))  # no description: the file's summary is the one
    register("namedTask", str(HERE / "named.yaml"))  # no summary either: its name is
    register("brokenTask", str(HERE / "broken.yaml"))  # unreadable: listed without a description
"""


def test_list_describes_plugin_tasks_registered_without_a_description_from_their_files(fake_site):
    fake_site.add("two-tasks", "two_tasks_plugin", PLUGIN_TASKS)
    (fake_site.path / "summed.yaml").write_text("id: summedTask\nname: Summed\nsummary: One line from the file\n")
    (fake_site.path / "named.yaml").write_text("id: namedTask\nname: A named task\n")
    (fake_site.path / "broken.yaml").write_text("id: [unclosed\n")
    result = run_cli("list", "--kind", "task", env=fake_site.env())
    assert result.returncode == 0, result.stderr
    described = {line.split()[0]: line.split(maxsplit=3)[3] if len(line.split()) > 3 else ""
                 for line in result.stdout.splitlines()}
    assert described["summedTask"] == "One line from the file"
    assert described["namedTask"] == "A named task"
    assert described["brokenTask"] == ""
    rows = {row["name"]: row for row in json.loads(run_cli("list", "--json", env=fake_site.env()).stdout)}
    assert rows["summedTask"]["description"] == "One line from the file"


def test_info_labels_the_integrity_audit_once(tmp_path):
    import os

    env = {**os.environ, "MLGYM_REGISTRY_CACHE": str(tmp_path / "cache")}
    shown = run_cli("info", "prisonersDilemma", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "integrity: not audited" in shown.stdout.splitlines()
    assert "integrity: integrity" not in shown.stdout
    assert json.loads(run_cli("info", "prisonersDilemma", "--json", env=env).stdout)["integrity"] == "not audited"
