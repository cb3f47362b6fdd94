"""``mlgym-registry check --plugin DIST`` and ``check --kind KIND NAME``: a distribution's components, each imported
and run through the conformance kit; and the kit's isolator check in a parser's own format."""

from __future__ import annotations

import re

import pytest
from conftest import run_cli
from test_plugins import example_installed  # noqa: F401 - the fixture that installs the example distribution

from mlgym_registry import FormatError, Registry
from mlgym_registry.components.isolators import CodeBlockIsolator
from mlgym_registry.components.parsers import XMLThoughtActionParser
from mlgym_registry.testing import ConformanceError, check_component, check_isolator, check_plugin

TAGGED_PLUGIN = """
from mlgym_registry import FormatError, hookimpl
from mlgym_registry.components.isolators import guard_multiline_input


@hookimpl
def register_parsers(register):
    register("tagged", "tagged_plugin:TaggedParser", description="The action is between <cmd> and </cmd>.")


@hookimpl
def register_action_isolators(register):
    register("tag_guard", "tagged_plugin:tag_guard")


class TaggedParser:
    def format_action(self, action):
        return f"Let me do this.\\n<cmd>{action}</cmd>"

    def __call__(self, response):
        start, end = response.rfind("<cmd>"), response.rfind("</cmd>")
        if start < 0 or end < start:
            raise FormatError("no <cmd>...</cmd> in the response")
        return response[:start], response[start + 5:end]


def tag_guard(response, parser):
    return guard_multiline_input(parser(response)[1]).strip()
"""

BROKEN_PLUGIN = """
from mlgym_registry import hookimpl


@hookimpl
def register_parsers(register):
    register("stringy", "broken_plugin:stringy")


@hookimpl
def register_reward_assigners(register):
    register("shaped", "broken_components:ShapedReward")


def stringy(response):
    return "ls -a"
"""

SYNTAX_ERROR = """
class ShapedReward:
    def __call__(self, observation, info, spec)
        return 0.0
"""


@pytest.fixture
def plugins(fake_site):
    """Two fake distributions: ``tagged-plugin`` (a sound parser and isolator) and ``broken-plugin``."""
    fake_site.add("tagged-plugin", "tagged_plugin", TAGGED_PLUGIN)
    fake_site.add("broken-plugin", "broken_plugin", BROKEN_PLUGIN)
    (fake_site.path / "broken_components.py").write_text(SYNTAX_ERROR)
    return fake_site


def test_the_example_plugin_passes(example_installed):  # noqa: F811 - the imported fixture
    result = run_cli("check", "--plugin", "mlgym-registry-example")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^ok +parser +json_command$", result.stdout, re.MULTILINE)
    assert re.search(r"^ok +reward +relative_improvement$", result.stdout, re.MULTILINE)


def test_a_broken_distribution_fails_one_line_per_component(plugins):
    result = run_cli("check", "--plugin", "broken-plugin", env=plugins.env())
    assert result.returncode == 1, result.stdout + result.stderr
    lines = {line.split()[2].rstrip(":"): line for line in result.stdout.splitlines() if line.startswith("FAIL")}
    assert "cannot import module 'broken_components'" in lines["shaped"]
    assert "SyntaxError" in lines["shaped"]
    assert "Traceback" not in result.stderr
    assert "returned 'ls -a'" in lines["stringy"] and "(thought, action) tuple" in lines["stringy"]


def test_the_kit_runs_in_process(plugins):
    registry = Registry()
    results = {r.name: r for r in check_plugin("tagged_plugin", registry=registry)}  # the name as pip spells it
    assert {r.kind for r in results.values()} == {"parser", "isolator"}
    assert all(r.ok for r in results.values()), results
    single = check_component("reward", "shaped", registry=registry)
    assert single.status == "FAIL" and single.distribution == "broken-plugin"


def test_an_unknown_distribution_is_a_usage_error(plugins):
    result = run_cli("check", "--plugin", "taged-plugin", env=plugins.env())
    assert result.returncode == 2
    assert result.stderr.count("mlgym-registry: error:") == 1
    assert "unknown distribution 'taged-plugin'" in result.stderr and "Did you mean 'tagged-plugin'" in result.stderr


def test_one_component_with_kind_and_a_pointer_to_kind(plugins):
    result = run_cli("check", "--kind", "parser", "tagged", env=plugins.env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^ok +parser +tagged$", result.stdout, re.MULTILINE)
    result = run_cli("check", "tagged", env=plugins.env())
    assert result.returncode == 2
    assert "'tagged' is not a task but a parser" in result.stderr
    assert "mlgym-registry check --kind parser tagged" in result.stderr


class _TildeParser:
    """A parser no common style fits: the action follows ``~~``."""

    def __call__(self, response):
        if "~~" not in response:
            raise FormatError("no ~~")
        thought, _, action = response.partition("~~")
        return thought, action


def test_the_isolator_check_speaks_the_parser_format():
    isolator = CodeBlockIsolator()
    check_isolator(isolator, XMLThoughtActionParser())  # responses built in the <command> style
    parser = _TildeParser()
    with pytest.raises(ConformanceError, match="pass responses="):
        check_isolator(isolator, parser)
    check_isolator(isolator, parser, responses=("~~ls -a", "~~edit 1:2\ndef f(x):\n    return (x, 'a')\nend_of_edit"))
    with pytest.raises(ConformanceError, match="expected the action 'ls -a'"):
        check_isolator(isolator, parser, responses=("~~ls", "~~edit 1:2\nend_of_edit"))


def test_a_plugin_that_fails_to_load_is_a_failure(fake_site):
    fake_site.add("unloadable-plugin", "unloadable_plugin", "raise ImportError('needs a missing package')\n")
    result = run_cli("check", "--plugin", "unloadable-plugin", env=fake_site.env())
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^FAIL plugin +plugin \(distribution unloadable-plugin\): .*needs a missing package",
                     result.stdout, re.MULTILINE)
