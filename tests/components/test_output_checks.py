"""Checked component outputs (``output_checks``): a component that breaks its contract is named, with its
distribution, the bad value and the contract, where the chain calls it; good components run unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from standin import Script, StandinBackend

from mlgym_registry import ComponentOutputError, FormatError, MLGymRegistryError, TaskSpec, hookimpl, registry
from mlgym_registry.components import output_checks
from mlgym_registry.components.template_set import TemplateSet
from mlgym_registry.episodes.episode import run_episode

DIST = "bad-components-dist"
SPEC = TaskSpec(id="checkedGame", description="A task for output checks.", baseline_scores=[{"Score": 1.0}],
                max_steps=10)
RESPONSE = "DISCUSSION\nList the files.\n```\nls\n```\n"


def mutate_score(observation, info, spec):
    info["score"].append({"Score": 9.0})
    return 0.0


def add_key(observation, info, spec):
    info["seen"] = True
    return 0.0


def edit_metric(observation, info, spec):
    if info["score"]:
        info["score"][-1]["Score"] = 100.0
    return 0.0


BAD_REWARDS = {
    "nan_reward": (lambda o, i, s: float("nan"), "returned nan"),
    "inf_reward": (lambda o, i, s: np.float64("inf"), "returned np.float64(inf)"),
    "list_reward": (lambda o, i, s: [1.0], "returned [1.0]"),
    "tensor_reward": (lambda o, i, s: torch.tensor([1.0, 2.0]), "returned tensor([1., 2.])"),
    "bool_reward": (lambda o, i, s: True, "returned True"),
    "none_reward": (lambda o, i, s: None, "returned None"),
}
GOOD_REWARDS = {
    "int_reward": (lambda o, i, s: 2, 2.0),
    "numpy_reward": (lambda o, i, s: np.float32(0.5), 0.5),
    "tensor0d_reward": (lambda o, i, s: torch.tensor(0.25), 0.25),
    "tensor1_reward": (lambda o, i, s: torch.tensor([0.75]), 0.75),
}
MUTATING_REWARDS = {"mutate_score": mutate_score, "add_key": add_key}


class BadComponents:
    @hookimpl
    def register_reward_assigners(self, register):
        for name, (reward, _) in {**BAD_REWARDS, **GOOD_REWARDS}.items():
            register(name, reward)
        for name, reward in MUTATING_REWARDS.items():
            register(name, reward)
        register("edit_metric", edit_metric)

    @hookimpl
    def register_parsers(self, register):
        register("string_parser", lambda response: "ls")
        register("none_action_parser", lambda response: (response, None))
        register("triple_parser", lambda response: ("a", "b", "c"))

    @hookimpl
    def register_action_isolators(self, register):
        register("none_isolator", lambda response, parser: None)

    @hookimpl
    def register_templates(self, register):
        register("none_system_template", TemplateSet(name="broken", system_template=None, task_template="Do it."))

    @hookimpl
    def register_backends(self, register):
        register("checks_standin", lambda spec, **kw: StandinBackend(spec, scores=[{"Score": 1.5}]))


@pytest.fixture(scope="module", autouse=True)
def plugin():
    info = registry.add_plugin(BadComponents(), name="output-checks-test", distribution=DIST)
    assert info.error is None, info.error
    yield
    registry.remove_plugin("output-checks-test")


def make(**overrides):
    return registry.make(SPEC, backend="checks_standin", batch_size=(), **overrides)


def step(env, response=RESPONSE, td=None):
    td = env.reset() if td is None else td
    td.set(env.base_env.layout.response, response)
    return env.step(td)


def assert_names(error: ComponentOutputError, label: str, name: str, contract: str, value: str | None = None):
    message = str(error)
    assert message.startswith(f"{label} {name!r} (from {DIST})"), message
    assert contract in message, message
    if value is not None:
        assert value in message, message
    assert isinstance(error, MLGymRegistryError) and not isinstance(error, FormatError)


@pytest.mark.parametrize("name", sorted(BAD_REWARDS))
def test_bad_reward_values_are_named(name):
    env = make(reward=name)
    with pytest.raises(ComponentOutputError) as caught:
        step(env)
    assert_names(caught.value, "reward assigner", name, "a reward assigner must return a finite float",
                 BAD_REWARDS[name][1])
    assert caught.value.kind == "reward" and caught.value.name == name


@pytest.mark.parametrize("name", sorted(GOOD_REWARDS))
def test_numbers_tensors_of_one_value_are_rewards(name):
    env = make(reward=name)
    reward = step(env)["next", env.base_env.layout.reward]
    assert float(reward) == pytest.approx(GOOD_REWARDS[name][1])


@pytest.mark.parametrize("name, change", [("mutate_score", "info['score']"), ("add_key", "info['seen']")])
def test_reward_changing_info_is_named(name, change):
    env = make(reward=name)
    with pytest.raises(ComponentOutputError) as caught:
        step(env)
    assert_names(caught.value, "reward assigner", name, "must not change the info it is given", change)


def test_reward_editing_a_score_dict_is_named():
    env = make(reward="edit_metric")
    td = env.step_mdp(step(env))  # ls: the score list is still empty
    with pytest.raises(ComponentOutputError) as caught:
        step(env, "DISCUSSION\nScore it.\n```\nvalidate\n```\n", td)
    assert_names(caught.value, "reward assigner", "edit_metric", "must not change", "info['score'][0]['Score']")


@pytest.mark.parametrize("name, value", [("string_parser", "returned 'ls'"),
                                         ("none_action_parser", "returned a pair whose action is None"),
                                         ("triple_parser", "returned ('a', 'b', 'c')")])
def test_bad_parser_outputs_are_named(name, value):
    env = make(parser=name)
    with pytest.raises(ComponentOutputError) as caught:
        step(env)
    assert_names(caught.value, "parser", name, "a parser must return a pair (thought, action) of two strings", value)


def test_bad_isolator_output_is_named():
    env = make(isolator="none_isolator")
    with pytest.raises(ComponentOutputError) as caught:
        step(env)
    assert_names(caught.value, "action isolator", "none_isolator", "an action isolator must return the action as a "
                 "string", "returned None")


def test_bad_template_is_named_at_reset():
    env = make(template="none_system_template")
    with pytest.raises(ComponentOutputError) as caught:
        env.reset()
    assert_names(caught.value, "template set", "none_system_template", "must be strings", "None as its system_template")


def test_format_error_stays_a_retry():
    env = make()
    td = step(env, "no code block here")
    assert bool(td["next", env.base_env.layout.retry])
    assert not env.base_env.backend.actions


def test_builtin_components_are_named_as_built_in():
    env = make(reward="nan_reward")
    task = env.base_env.task
    assert output_checks.origin("parser", task.spec.parser, task) == "from mlgym-registry, built in"
    in_process = output_checks.fail("reward", task, "returned 1", "contract")
    assert str(in_process).startswith(f"reward assigner 'nan_reward' (from {DIST})")


def episode(enabled: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(output_checks, "ENABLED", enabled)
    env = make(reward_wrong_format=-0.5)
    responses = [RESPONSE, "no block", "DISCUSSION\nScore.\n```\nvalidate\n```\n",
                 "DISCUSSION\nDone.\n```\nsubmit\n```\n"]
    result = run_episode(env, Script(responses))
    turns = [(t.thought, t.action, t.observation, t.reward, t.done, t.format_error) for t in result.turns]
    backend = env.base_env.backend
    actions = list(backend.actions)
    env.close()
    return turns, result.info.get("score"), result.info.get("exit_status"), actions


def test_default_components_play_an_episode_unchanged(monkeypatch):
    checked = episode(True, monkeypatch)
    unchecked = episode(False, monkeypatch)
    assert checked == unchecked
    turns, score, status, actions = checked
    assert len(turns) == 4 and turns[1][-1] is True and turns[-1][4] is True
    assert actions == ["ls", "validate", "submit"] and score
