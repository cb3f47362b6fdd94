"""The conformance kit passes every built-in component and the example plugin, and explains what is wrong with
broken ones."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from mlgym_registry import FormatError, hookimpl, registry
from mlgym_registry.components.template_set import TemplateSet
from mlgym_registry.testing import (
    ConformanceError,
    check_isolator,
    check_parser,
    check_reward_assigner,
    check_task,
    check_template,
    registered_plugin,  # noqa: F401 - the fixture under test
)


@pytest.mark.parametrize("kind, check", [
    ("parser", check_parser),
    ("reward", check_reward_assigner),
    ("template", check_template),
    ("isolator", check_isolator),
])
def test_every_registered_component_conforms(kind, check):
    names = registry.names(kind)
    assert names, f"no {kind} registered"
    for name in names:
        check(registry.get(kind, name))


def test_the_example_plugin_conforms():
    pytest.importorskip("mlgym_registry_example", reason="plugins/mlgym-registry-example is not installed")
    from mlgym_registry_example.components import JsonCommandParser, RelativeImprovementReward

    check_parser(JsonCommandParser(), malformed=("no json here",))
    check_reward_assigner(RelativeImprovementReward(), registry.spec("prisonersDilemma"))
    assert "json_command" in registry.names("parser")


def raises_value_error(response: str) -> tuple[str, str]:
    """Broken: signals a missing action with ValueError instead of FormatError."""
    if "```" not in response:
        raise ValueError("no block")
    return "", response.split("```")[1].strip()


def returns_only_the_action(response: str):
    """Broken: returns the action alone, not (thought, action)."""
    return response.split("```\n")[1].split("\n```")[0] if "```\n" in response else response


def accepts_everything(response: str) -> tuple[str, str]:
    """Broken for its declared format: never raises."""
    return "", "ls -a"


@pytest.mark.parametrize("parser, message", [
    (raises_value_error, "raised ValueError.*must raise mlgym_registry.errors.FormatError"),
    (returns_only_the_action, "must return a \\(thought, action\\) tuple of two strings"),
])
def test_broken_parsers_fail_with_the_reason(parser, message):
    with pytest.raises(ConformanceError, match=message):
        check_parser(parser)


def test_malformed_responses_must_raise():
    with pytest.raises(ConformanceError, match="accepted the malformed response 'prose'"):
        check_parser(accepts_everything, malformed=("prose",))


def test_expected_actions_are_checked():
    with pytest.raises(ConformanceError, match="expected the action 'pwd'"):
        check_parser(accepts_everything, well_formed={"```\npwd\n```": "pwd"})


class StringReward:
    """Broken: returns the score as text."""

    def __call__(self, observation, info, spec):
        return "0.5"


class MutatingReward:
    """Broken: pops the scores out of info."""

    def __call__(self, observation, info, spec):
        return float(len(info["score"] and [info["score"].pop()]))


class KeyErrorReward:
    """Broken: assumes a validate observation on every step."""

    def __call__(self, observation, info, spec):
        return float(observation.split("Evaluation Score: ")[1].strip("{}").split(": ")[1])


class LatestScoreReward:
    """Broken: reads the latest score on every step that ends the episode, as if every ending were scored."""

    def __call__(self, observation, info, spec):
        if info["exit_status"]:
            return float(info["score"][-1]["Score"]) - spec.baseline["Score"]
        return 0.0


@pytest.mark.parametrize("reward, message", [
    (LatestScoreReward(), "raised IndexError.*on a failed submit \\(invalid_submission, no score\\)"),
    (StringReward(), "returned '0.5' \\(str\\).*finite float"),
    (MutatingReward(), "changed the info dict on a validate observation"),
    (KeyErrorReward(), "raised IndexError.*on a plain observation"),
    (lambda o, i, s: float("nan"), "returned nan"),
])
def test_broken_reward_assigners_fail_with_the_reason(reward, message):
    with pytest.raises(ConformanceError, match=message):
        check_reward_assigner(reward)


def test_broken_templates_and_isolators():
    with pytest.raises(ConformanceError, match="register a TemplateSet"):
        check_template(lambda: {"system_template": "x"})
    with pytest.raises(ConformanceError, match="unknown placeholder \\{model_name\\}"):
        check_template(TemplateSet("t", "{model_name}", "{description}", "{observation}"))
    with pytest.raises(ConformanceError, match="does not show \\{observation\\}"):
        check_template(TemplateSet("t", "sys", "{description}", "Step {current_step}"))

    def unguarded(response, parser):
        return parser(response)[1].strip()

    with pytest.raises(ConformanceError, match="bash -n rejects"):
        check_isolator(unguarded)

    def never_fails(response, parser):
        try:
            return parser(response)[1]
        except FormatError:
            return ""

    with pytest.raises(ConformanceError, match="holds no command; it must raise FormatError"):
        check_isolator(never_fails)


def test_registered_plugin_fixture_adds_and_removes(registered_plugin):  # noqa: F811 - pytest injects it
    plugin = types.SimpleNamespace(__name__="kit_test_plugin")

    @hookimpl
    def register_parsers(register):
        register("kit_test_parser", accepts_everything)

    plugin.register_parsers = register_parsers
    registered_plugin(plugin)
    assert registry.get("parser", "kit_test_parser") is accepts_everything


def test_plugins_from_the_fixture_are_gone_after_the_test():
    assert "kit_test_parser" not in registry.names("parser")


def test_check_task_passes_our_suite_and_reports_a_wrong_baseline(tmp_path):
    report = check_task("prisonersDilemma", runs=2)
    assert report.ok and len(report.runs) == 2 and "Score" in report.runs[0].metrics
    wrong = registry.spec("prisonersDilemma").replace(baseline_scores=[{"Score": 9.0}])
    with pytest.raises(ConformanceError, match="baseline does not match: Score: recorded 9"):
        check_task(wrong, runs=2)


def test_check_task_reports_missing_files(tmp_path):
    spec = registry.spec("blotto").replace(root=str(tmp_path))
    report = check_task(spec, raise_on_failure=False)
    assert not report.ok and "starter files missing" in report.problems[0]
    assert not report.runs


def test_check_task_loads_a_yaml_path():
    path = Path(registry.spec("battleOfSexes").source)
    report = check_task(path, runs=2)
    assert report.ok and report.spec.id == "battleOfSexes"


def test_the_local_backend_conforms():
    from mlgym_registry.testing import check_backend

    check_backend(registry.get("backend", "local"), "prisonersDilemma")


@pytest.mark.parametrize("task", ["prisonersDilemma", "battleOfSexes", "blotto"])
def test_every_task_of_our_suite_checks_out(task):
    report = check_task(task, runs=2)
    assert report.ok and report.notes[0].startswith("Score: recorded")


def test_a_backend_that_leaves_its_workspace_fails():
    from mlgym_registry.testing import check_backend

    local = registry.get("backend", "local")
    made = []

    class Leaky:
        """Broken: close() does nothing, so the workspace and the shell stay behind."""

        def __init__(self, spec, **options):
            self.inner = local(spec, **options)
            made.append(self.inner)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def close(self):
            pass

    try:
        with pytest.raises(ConformanceError, match="close\\(\\) left the workspace"):
            check_backend(Leaky, "prisonersDilemma")
    finally:
        for backend in made:
            backend.close()
