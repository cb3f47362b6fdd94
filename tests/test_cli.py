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
