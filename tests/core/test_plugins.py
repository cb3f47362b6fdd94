"""Plugin discovery through entry points: the example plugin, broken plugins, strict mode, allow/block lists."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from importlib import metadata

import pytest
from conftest import run_cli, run_python
from outside_data import REPO

from mlgym_registry import DuplicateNameError, PluginLoadError, Registry, hookimpl

EXAMPLE = REPO / "plugins" / "mlgym-registry-example"

GOOD_PLUGIN = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("last_line", "{module}:last_line", description="The last line is the action.")

def last_line(response):
    return response, response.strip().splitlines()[-1]
"""

BROKEN_ON_IMPORT = """
raise ImportError("this plugin needs a package that is not installed")
"""

BROKEN_IN_HOOK = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("half_registered", "os:getcwd")
    raise RuntimeError("hook blew up")
"""

DUPLICATE = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("thought_action", "os:getcwd")
"""

REPLACING = """
from mlgym_registry import hookimpl

@hookimpl
def register_parsers(register):
    register("thought_action", "{module}:mine", replace=True)

def mine(response):
    return "", response
"""


@pytest.fixture(scope="session")
def example_installed():
    """The example distribution, installed into this environment (as `make test` does) if it is not yet."""
    try:
        metadata.distribution("mlgym-registry-example")
    except metadata.PackageNotFoundError:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(EXAMPLE)],
            check=True,
        )
    return metadata.distribution("mlgym-registry-example")


def test_example_plugin_is_discovered_listed_and_usable(example_installed):
    result = run_cli("list", "--json")
    assert result.returncode == 0, result.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(result.stdout)}
    assert rows[("parser", "json_command")]["distribution"] == "mlgym-registry-example"
    assert rows[("reward", "relative_improvement")]["distribution"] == "mlgym-registry-example"
    assert rows[("parser", "thought_action")]["distribution"] == "mlgym-registry"

    reg = Registry()
    parser = reg.get("parser", "json_command")
    assert parser('{"thought": "look", "command": "ls -a"}') == ("look", "ls -a")
    plugins = {p["name"]: p for p in reg.plugins()}
    assert plugins["example"]["distribution"] == "mlgym-registry-example"
    assert plugins["example"]["hooks"] == ["register_parsers", "register_reward_assigners"]
    assert plugins["example"]["entry_point"] == "example = mlgym_registry_example.plugin"
    assert plugins["mlgym_registry.components.plugin"]["builtin"] is True


def test_broken_plugin_is_reported_and_the_rest_still_load(fake_site):
    fake_site.add("good-plugin", "good_plugin", GOOD_PLUGIN.format(module="good_plugin"))
    fake_site.add("broken-plugin", "broken_plugin", BROKEN_ON_IMPORT, entry_point="broken")
    reg = Registry()
    with pytest.warns(RuntimeWarning, match="broken-plugin"):
        names = reg.names("parser")
    assert "last_line" in names and "thought_action" in names
    errors = reg.load_errors()
    assert len(errors) == 1 and isinstance(errors[0], PluginLoadError)
    assert errors[0].distribution == "broken-plugin"
    assert errors[0].entry_point == "broken = broken_plugin"
    assert "ImportError: this plugin needs a package that is not installed" in str(errors[0])
    assert "MLGYM_REGISTRY_BLOCK_PLUGINS=broken-plugin" in str(errors[0])


def test_broken_plugin_in_the_cli(fake_site):
    fake_site.add("broken-plugin", "broken_plugin", BROKEN_ON_IMPORT, entry_point="broken")
    listing = run_cli("list", "--kind", "parser", env=fake_site.env())
    assert listing.returncode == 0
    assert "thought_action" in listing.stdout
    assert "broken-plugin" in listing.stderr  # the warning
    shown = run_cli("plugins", "--json", env=fake_site.env())
    broken = [p for p in json.loads(shown.stdout) if p["distribution"] == "broken-plugin"]
    assert broken and "this plugin needs a package" in broken[0]["error"]
    assert run_cli("plugins", "--strict", env=fake_site.env()).returncode == 1


def test_strict_mode_raises(fake_site, monkeypatch):
    fake_site.add("broken-plugin", "broken_plugin", BROKEN_ON_IMPORT, entry_point="broken")
    monkeypatch.setenv("MLGYM_REGISTRY_STRICT", "1")
    with pytest.raises(PluginLoadError, match="broken-plugin"):
        Registry().names("parser")
    result = run_cli("list", env=fake_site.env(MLGYM_REGISTRY_STRICT="1"))
    assert result.returncode != 0
    assert "broken-plugin" in result.stderr


def test_a_hook_that_raises_registers_nothing(fake_site):
    fake_site.add("hooky-plugin", "hooky_plugin", BROKEN_IN_HOOK)
    reg = Registry()
    with pytest.warns(RuntimeWarning, match="hook blew up"):
        names = reg.names("parser")
    assert "half_registered" not in names
    assert reg.load_errors()[0].distribution == "hooky-plugin"


def test_duplicate_across_distributions_names_both(fake_site, monkeypatch):
    fake_site.add("dupe-plugin", "dupe_plugin", DUPLICATE)
    reg = Registry()
    with pytest.warns(RuntimeWarning) as caught:
        entry = reg.entry("parser", "thought_action")
    assert entry.distribution == "mlgym-registry"  # the first provider keeps the name
    message = str(caught[0].message)
    assert "built-in plugin 'mlgym_registry.components.plugin'" in message
    assert "distribution 'dupe-plugin'" in message
    monkeypatch.setenv("MLGYM_REGISTRY_STRICT", "1")
    with pytest.raises(DuplicateNameError, match="dupe-plugin"):
        Registry().names("parser")


def test_a_plugin_may_replace_a_built_in_when_it_asks(fake_site):
    fake_site.add("replacing-plugin", "replacing_plugin", REPLACING.format(module="replacing_plugin"))
    reg = Registry()
    entry = reg.entry("parser", "thought_action")
    assert entry.distribution == "replacing-plugin"
    assert entry.meta["replaces"] == "built-in plugin 'mlgym_registry.components.plugin'"
    assert reg.get("parser", "thought_action")("no fences") == ("", "no fences")


def test_allow_list_and_block_list(fake_site, monkeypatch):
    fake_site.add("good-plugin", "good_plugin", GOOD_PLUGIN.format(module="good_plugin"))
    monkeypatch.setenv("MLGYM_REGISTRY_LOAD_PLUGINS", "")
    assert "last_line" not in Registry().names("parser")
    assert "thought_action" in Registry().names("parser")  # built-ins always load
    monkeypatch.setenv("MLGYM_REGISTRY_LOAD_PLUGINS", "good-plugin")
    assert "last_line" in Registry().names("parser")
    monkeypatch.setenv("MLGYM_REGISTRY_LOAD_PLUGINS", "some-other-plugin")
    assert "last_line" not in Registry().names("parser")
    monkeypatch.delenv("MLGYM_REGISTRY_LOAD_PLUGINS")
    monkeypatch.setenv("MLGYM_REGISTRY_BLOCK_PLUGINS", "good_plugin")  # names are normalised
    assert "last_line" not in Registry().names("parser")
    monkeypatch.setenv("MLGYM_REGISTRY_BLOCK_PLUGINS", "mlgym_registry.tasks.mlgym_source")
    plugins = [p["name"] for p in Registry().plugins()]
    assert "mlgym_registry.tasks.mlgym_source" not in plugins


def test_in_process_plugin_object_can_be_added_and_removed():
    class Plugin:
        @hookimpl
        def register_reward_assigners(self, register):
            register("always_one", lambda observation, info, spec: 1.0)

    reg = Registry()
    info = reg.add_plugin(Plugin(), name="inline")
    assert info.hooks == ["register_reward_assigners"] and info.error is None
    assert reg.get("reward", "always_one")("", {}, None) == 1.0
    reg.remove_plugin("inline")
    assert "always_one" not in reg.names("reward")
    assert "inline" not in [p["name"] for p in reg.plugins()]


@pytest.mark.parametrize(
    "code",
    [
        "from mlgym_registry import registry; registry.names('task'); registry.spec",
        "from mlgym_registry.cli import main; main(['list'])",
        "from mlgym_registry.cli import main; main(['plugins'])",
    ],
)
def test_listing_never_imports_torch(code):
    result = run_python(
        f"""
        import sys, io, contextlib
        with contextlib.redirect_stdout(io.StringIO()):
            {code}
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchrl', 'tensordict'))
        print(heavy)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_no_warnings_from_a_clean_install():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Registry().load_errors() == []
