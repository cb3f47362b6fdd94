"""`registry.make()` checks its options up front: a bad type or range is a clear error at make(), not at reset."""

from __future__ import annotations

import math
import re

import pytest

from mlgym_registry import InvalidOverrideError, hookimpl, registry
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.episodes.episode import run_episode
from mlgym_registry.options import InvalidOptionError, UnknownOptionError, positive_number
from mlgym_registry.policies import make_policy

LOCAL = " (an option of backend 'local')"
"""How an error names an option the local backend owns."""

BAD_OPTIONS = [
    ({"max_steps": "5"}, "max_steps must be an integer >= 1, got '5' (str)"),
    ({"max_steps": 0}, "max_steps must be an integer >= 1, got 0 (int)"),
    ({"max_steps": True}, "max_steps must be an integer >= 1, got True (bool)"),
    ({"command_timeout": "abc"}, f"command_timeout{LOCAL} must be a number > 0, got 'abc' (str)"),
    ({"command_timeout": -1}, f"command_timeout{LOCAL} must be a number > 0, got -1 (int)"),
    ({"command_timeout": math.nan}, f"command_timeout{LOCAL} must be a number > 0, got nan (float)"),
    ({"long_timeout": 0}, f"long_timeout{LOCAL} must be a number > 0 or None, got 0 (int)"),
    ({"memory_limit_mb": 0}, f"memory_limit_mb{LOCAL} must be an integer >= 1 or None, got 0 (int)"),
    ({"cpu_seconds": 1.5}, f"cpu_seconds{LOCAL} must be an integer >= 1 or None, got 1.5 (float)"),
    ({"max_processes": -3}, f"max_processes{LOCAL} must be an integer >= 1 or None, got -3 (int)"),
    ({"max_output_chars": None}, f"max_output_chars{LOCAL} must be an integer >= 1, got None (NoneType)"),
    ({"seed": -1}, f"seed{LOCAL} must be an integer >= 0 or None, got -1 (int)"),
    ({"seed": "1"}, f"seed{LOCAL} must be an integer >= 0 or None, got '1' (str)"),
    ({"network": "yes"}, f"network{LOCAL} must be a bool (True or False), got 'yes' (str)"),
    ({"network": 1}, f"network{LOCAL} must be a bool (True or False), got 1 (int)"),
    ({"reward_wrong_format": "-1"}, "reward_wrong_format (a chain option) must be a number or None, got '-1' (str)"),
    ({"backend_options": {"command_timeout": 0}}, f"command_timeout{LOCAL} must be a number > 0, got 0 (int)"),
    ({"backend_options": ["command_timeout"]},
     "backend_options must be a dict of option names to values, got ['command_timeout'] (list)"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_a_bad_option_is_refused_at_make_naming_the_option_and_its_range(options, message):
    with pytest.raises(InvalidOptionError) as caught:
        registry.make("prisonersDilemma", **options)
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


def test_good_options_build_an_env():
    env = registry.make("prisonersDilemma", max_steps=5, command_timeout=2.5, long_timeout=None, memory_limit_mb=None,
                        cpu_seconds=30, max_processes=None, max_output_chars=1000, seed=0, network=False,
                        reward_wrong_format=-1)
    try:
        assert env.base_env.task.spec.max_steps == 5
        assert env.base_env.task.backend_options["command_timeout"] == 2.5
    finally:
        env.close()


def test_an_unknown_backend_option_is_refused_with_a_suggestion():
    with pytest.raises(UnknownOptionError) as caught:
        registry.make("prisonersDilemma", backend_options={"command_timeot": 5, "xyzzy": 1})
    message = str(caught.value)
    assert message.startswith("unknown backend option(s) 'command_timeot' (did you mean 'command_timeout'?), 'xyzzy' "
                              "for backend 'local'; it takes: ")  # sorted
    assert "long_timeout" in message
    with pytest.raises(InvalidOverrideError, match="unknown override"):  # a keyword make() itself does not know
        registry.make("prisonersDilemma", xyzzy=1)


def test_options_in_the_spec_are_checked_too():
    spec = registry.spec("prisonersDilemma")
    with pytest.raises(InvalidOptionError, match="^" + re.escape(f"long_timeout{LOCAL} must be a number > 0 or None")):
        registry.make(spec.replace(backend_options={"long_timeout": -5}))
    with pytest.raises(InvalidOptionError, match=r"^max_steps must be an integer >= 1, got 0 \(int\)$"):
        registry.make(spec.replace(max_steps=0))
    with pytest.raises(InvalidOptionError, match=r"^training_timeout must be a number > 0 or None, got 0 \(int\)$"):
        registry.make(spec.replace(training_timeout=0))
    with pytest.raises(UnknownOptionError, match="unknown backend option\\(s\\) 'xyzzy' for backend 'local'"):
        registry.resolve(spec.replace(backend_options={"xyzzy": 1}))


def test_a_refused_make_builds_nothing_and_changes_nothing():
    made = []

    def counting_backend(spec, *, command_timeout: float = 1.0):
        made.append(spec)
        raise AssertionError("the backend must not be made")

    counting_backend.option_rules = {"command_timeout": positive_number()}
    registry.register("backend", "counting", counting_backend)
    try:
        before = registry.spec("prisonersDilemma").to_dict()
        names = {kind: registry.names(kind) for kind in ("task", "backend", "parser")}
        with pytest.raises(InvalidOptionError,
                           match=r"^command_timeout \(an option of backend 'counting'\) must be a number > 0"):
            registry.make("prisonersDilemma", backend="counting", command_timeout=0)
        with pytest.raises(UnknownOptionError, match="for backend 'counting'; it takes: command_timeout$"):
            registry.make("prisonersDilemma", backend="counting", backend_options={"long_timeout": 5})
        assert made == []
        assert registry.spec("prisonersDilemma").to_dict() == before
        assert {kind: registry.names(kind) for kind in names} == names
    finally:
        registry.unregister("backend", "counting")


class ContainerBackend(LocalBackend):
    """A third party's backend whose options share names with the local backend's but not their rules: a container
    engine for ``sandbox`` and memory in GiB fractions. It records what it got and runs on the local backend."""

    received: list[dict] = []

    def __init__(self, spec, *, sandbox: str = "docker", memory_limit_mb: float = 0.5, seed: str | None = None):
        type(self).received.append({"sandbox": sandbox, "memory_limit_mb": memory_limit_mb, "seed": seed})
        super().__init__(spec)


class ContainerPlugin:
    @hookimpl
    def register_backends(self, register):
        register("containers", ContainerBackend, description="a test's third-party backend")


def test_a_third_party_backend_owns_its_options_even_when_they_share_our_names():
    ContainerBackend.received.clear()
    ContainerBackend.option_rules = {}  # the local backend's rules are not its own
    registry.add_plugin(ContainerPlugin(), name="containers-plugin", distribution="mlgym-registry-containers")
    try:
        env = registry.make("prisonersDilemma", backend="containers", sandbox="docker", memory_limit_mb=0.5,
                            seed="abc")
        try:
            env.reset()
        finally:
            env.close()
        assert ContainerBackend.received == [{"sandbox": "docker", "memory_limit_mb": 0.5, "seed": "abc"}]
        # the local backend still refuses those values, by its own rules
        with pytest.raises(InvalidOptionError, match=r"^sandbox \(an option of backend 'local'\) must be"):
            registry.make("prisonersDilemma", sandbox="docker")
    finally:
        registry.remove_plugin("containers-plugin")


def test_run_episode_refuses_a_bad_seed_before_touching_the_env():
    env = registry.make("prisonersDilemma")
    try:
        with pytest.raises(InvalidOptionError, match=r"^seed must be an integer >= 0 or None, got 'abc' \(str\)$"):
            run_episode(env, make_policy("scripted", task_id="prisonersDilemma"), seed="abc")
        assert not env.base_env.has_backend  # no reset happened
    finally:
        env.close()
