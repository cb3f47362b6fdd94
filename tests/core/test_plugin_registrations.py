"""Plugin registrations as users meet them: strict-mode reloads, dropped registrations, the ``registered_plugin``
fixture with an installed plugin, ``info`` output, ``replace=True`` warnings, clean CLI warnings, the validate message
and lazy references checked by ``plugins --strict``."""

from __future__ import annotations

import sys
import textwrap
import warnings

import pytest
from test_plugins import REPLACING

from mlgym_registry import DuplicateNameError, PluginLoadError, Registry, UnknownNameError, cli
from mlgym_registry.entries import ComponentImportError
from mlgym_registry.plugins import PluginLoadWarning, PluginReplaceWarning
from mlgym_registry.testing import _registered_plugin

BROKEN_ON_IMPORT = 'raise ImportError("this plugin needs a package that is not installed")\n'

GOOD = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("last_line", "{module}:last_line")

def last_line(response):
    return response, response.strip().splitlines()[-1]
"""

HALF_TAKEN = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("own_before", "os:getcwd")
    register("thought_action", "os:getcwd")
    register("own_after", "os:getcwd")

@hookimpl
def register_reward_assigners(register):
    register("own_reward", "os:getcwd")
"""


LAZY_SYNTAX_ERROR = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("broken_lazy", "lazy_components:Parser")
"""


def _no_plugin_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, (PluginLoadWarning, PluginReplaceWarning))]


def test_strict_mode_raises_the_load_error_again_not_a_false_duplicate(fake_site, monkeypatch):
    fake_site.add("broken-plugin", "broken_plugin", BROKEN_ON_IMPORT, entry_point="broken")
    monkeypatch.setenv("MLGYM_REGISTRY_STRICT", "1")
    reg = Registry()
    for _ in range(2):
        with pytest.raises(PluginLoadError, match="broken-plugin"):
            reg.names("parser")
    monkeypatch.delenv("MLGYM_REGISTRY_STRICT")
    with pytest.warns(PluginLoadWarning):
        assert "thought_action" in reg.names("parser")  # the next load, not strict, works


HALF_FAILED = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("own_before", "os:getcwd")
    raise RuntimeError("the hook failed half-way")

@hookimpl
def register_reward_assigners(register):
    register("own_reward", "os:getcwd")
"""


def test_a_failing_plugin_leaves_none_of_its_names(fake_site):
    # (a plugin that only takes a built-in name loses that name alone: test_plugin_authors.py)
    fake_site.add("half-failed", "half_failed", HALF_FAILED)
    reg = Registry()
    with pytest.warns(PluginLoadWarning, match="half-failed"):
        parsers = reg.names("parser")
    assert "own_before" not in parsers
    assert "own_reward" not in reg.names("reward")
    with pytest.raises(UnknownNameError):
        reg.get("parser", "own_before")
    info = next(p for p in reg.plugins() if p["distribution"] == "half-failed")
    assert "RuntimeError" in info["error"]
    assert reg.plugin_info(sys.modules["half_failed"]) is None  # nor do its hooks stay in the plugin manager


def test_registered_plugin_fixture_accepts_a_plugin_installed_from_its_entry_point(fake_site):
    fake_site.add("good-plugin", "good_plugin", GOOD.format(module="good_plugin"))
    reg = Registry()
    assert "last_line" in reg.names("parser")  # loaded from the entry point
    import good_plugin

    fixture = _registered_plugin()
    add = next(fixture)
    info = add(good_plugin, registry=reg)
    assert info.error is None and info.distribution == "good-plugin"
    assert "last_line" in reg.names("parser")
    fixture.close()  # the test ends: the installed plugin stays
    assert "last_line" in reg.names("parser")
    assert [p["error"] for p in reg.plugins()] == [None] * len(reg.plugins())


def test_info_prints_scalars_on_one_line_and_names_the_task_distribution(capsys):
    assert cli.main(["info", "thought_action", "--kind", "parser"]) == 0
    out = capsys.readouterr().out
    assert "kind: parser\n" in out and "name: thought_action\n" in out
    assert "distribution: mlgym-registry\n" in out
    assert "  : " not in out
    assert cli.main(["info", "prisonersDilemma"]) == 0
    out = capsys.readouterr().out
    registration = out.split("registration:\n", 1)[1]
    assert registration.startswith("  kind: task\n  name: prisonersDilemma\n")
    assert "  distribution: mlgym-registry\n" in registration


def test_replace_warns_once_naming_both_and_shows_in_plugins_and_info(fake_site, monkeypatch, capsys):
    fake_site.add("replacing-plugin", "replacing_plugin", REPLACING.format(module="replacing_plugin"))
    reg = Registry()
    with pytest.warns(PluginReplaceWarning) as caught:
        reg.names("parser")
        reg.names("parser")
    messages = _no_plugin_warnings(caught.list)
    assert len(messages) == 1
    assert "distribution 'replacing-plugin'" in messages[0] and "parser 'thought_action'" in messages[0]
    assert "built-in plugin 'mlgym_registry.components.plugin'" in messages[0]
    info = next(p for p in reg.plugins() if p["distribution"] == "replacing-plugin")
    assert info["replaces"] == messages
    monkeypatch.setattr(cli, "registry", reg)
    assert cli.main(["plugins"]) == 0
    assert f"  replaces: {messages[0]}" in capsys.readouterr().out
    assert cli.main(["info", "thought_action", "--kind", "parser"]) == 0
    out = capsys.readouterr().out
    assert "distribution: replacing-plugin" in out and "mlgym_registry.components.plugin" in out


def test_cli_prints_one_clean_line_per_load_failure(fake_site, monkeypatch, capsys):
    fake_site.add("broken-plugin", "broken_plugin", BROKEN_ON_IMPORT, entry_point="broken")
    monkeypatch.setattr(cli, "registry", Registry())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["list", "--kind", "parser"]) == 0
    assert _no_plugin_warnings(caught) == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("mlgym-registry: warning: Error loading plugin 'broken' from distribution 'broken-plugin' "
                          "(entry point 'broken = broken_plugin'): ImportError: this plugin needs a package")
    assert "MLGYM_REGISTRY_BLOCK_PLUGINS=broken-plugin" in err
    assert "RuntimeWarning" not in err and ".py:" not in err


def test_validate_names_no_artefact_a_task_does_not_have(tmp_path):
    from mlgym_registry.backends.local import LocalBackend
    from mlgym_registry.records.observation_kinds import observation_kind
    from mlgym_registry.specs import TaskSpec

    source = tmp_path / "task_src"
    source.mkdir()
    (source / "solution.py").write_text("ANSWER = 1\n")
    (source / "evaluate.py").write_text('import json\nprint(json.dumps({"Score": 1.0}))\n')
    spec = TaskSpec(id="noTarget", name="No target", description="Solve it.", task_entrypoint="PythonSubmissionTasks",
                    training_timeout=60, starter_code=["solution.py", "evaluate.py"], evaluation_paths=["evaluate.py"],
                    baseline_scores=[{"Score": 0.5}], max_steps=5, root=str(source))
    with LocalBackend(spec) as env:
        env.reset()
        env.install_tools()
        obs, _, done, info = env.step("validate")
    assert not done and info["score"] == [{"Score": 1.0}]
    assert "target.py" not in obs and "submission artefact" not in obs
    assert obs == "Baseline Score: {'Score': 0.5}\nEvaluation Score: {'Score': 1.0}"
    assert observation_kind(obs) == "validate_score"  # replay reports still count it as a scored validate


def test_lazy_reference_with_a_syntax_error_fails_strict_plugins_and_make(fake_site, monkeypatch, capsys):
    fake_site.add("lazy-plugin", "lazy_plugin", LAZY_SYNTAX_ERROR)
    (fake_site.path / "lazy_components.py").write_text(textwrap.dedent("class Parser(:\n    pass\n"))
    reg = Registry()
    errors = reg.import_errors()
    assert len(errors) == 1 and isinstance(errors[0], ComponentImportError)
    message = str(errors[0])
    for part in ("parser 'broken_lazy'", "distribution 'lazy-plugin'", "module 'lazy_components'", "SyntaxError"):
        assert part in message

    monkeypatch.setattr(cli, "registry", reg)
    assert cli.main(["plugins"]) == 0  # not strict: the references are not imported
    capsys.readouterr()
    assert cli.main(["plugins", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "  ERROR: cannot import parser 'broken_lazy' registered by distribution 'lazy-plugin'" in out

    with pytest.raises(ComponentImportError) as raised:
        reg.make("prisonersDilemma", parser="broken_lazy")
    assert not isinstance(raised.value, SyntaxError)
    assert "parser 'broken_lazy'" in str(raised.value) and "lazy_components" in str(raised.value)
    assert "lazy-plugin" in str(raised.value)
    assert (raised.value.kind, raised.value.component, raised.value.distribution) == ("parser", "broken_lazy",
                                                                                      "lazy-plugin")
    assert raised.value.module == "lazy_components" and isinstance(raised.value.cause, SyntaxError)


def test_duplicate_in_strict_mode_stores_nothing(fake_site, monkeypatch):
    fake_site.add("half-taken", "half_taken", HALF_TAKEN)
    monkeypatch.setenv("MLGYM_REGISTRY_STRICT", "1")
    reg = Registry()
    for _ in range(2):
        with pytest.raises(DuplicateNameError, match="half-taken"):
            reg.names("parser")


@pytest.mark.parametrize(("raised", "shown"), [
    ('ImportError("needs numpy.")', "ImportError: needs numpy. Fix or uninstall"),
    ('RuntimeError("no GPU!")', "RuntimeError: no GPU! Fix or uninstall"),
    ('ValueError("which config?")', "ValueError: which config? Fix or uninstall"),
    ('ImportError("needs numpy")', "ImportError: needs numpy. Fix or uninstall"),
    ('ImportError("needs numpy.  ")', "ImportError: needs numpy. Fix or uninstall"),
    ("RuntimeError()", "RuntimeError. Fix or uninstall"),
])
def test_load_error_ends_the_cause_with_exactly_one_full_stop(fake_site, monkeypatch, raised, shown):
    fake_site.add("stop-plugin", "stop_plugin", f"raise {raised}\n", entry_point="stop")
    monkeypatch.setenv("MLGYM_REGISTRY_STRICT", "1")
    with pytest.raises(PluginLoadError) as caught:
        Registry().names("parser")
    message = str(caught.value)
    assert message == ("Error loading plugin 'stop' from distribution 'stop-plugin' (entry point 'stop = "
                       f"stop_plugin'): {shown} that distribution, or block it with "
                       "MLGYM_REGISTRY_BLOCK_PLUGINS=stop-plugin.")
    assert ".." not in message and ". ." not in message
