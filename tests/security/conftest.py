"""Fixtures of the red-team suite (helpers are in ``helpers.py``)."""

from __future__ import annotations

import os

import pytest

from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.local import sandbox as sandbox_mod
from mlgym_registry.specs import TaskSpec

from .helpers import SECRET_VARIABLES, mini_prisoners_spec, open_backend


@pytest.fixture(scope="session", autouse=True)
def driver_secrets():
    """The driver holds secrets in its environment (API keys): no sandboxed process may ever see them."""
    saved = {name: os.environ.get(name) for name in SECRET_VARIABLES}
    os.environ.update(SECRET_VARIABLES)
    try:
        yield dict(SECRET_VARIABLES)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def require_sandbox():
    """The suite tests the bubblewrap sandbox; on a host where it cannot start the backend refuses to run at all."""
    try:
        sandbox_mod.check()
    except sandbox_mod.SandboxUnavailable as exc:
        pytest.skip(f"the bubblewrap sandbox cannot start on this host: {exc}")


@pytest.fixture(scope="session")
def mini_spec(tmp_path_factory) -> TaskSpec:
    """``miniPrisonersDilemma`` (see ``helpers.mini_prisoners_spec``)."""
    return mini_prisoners_spec(tmp_path_factory.mktemp("mini_pd"))


@pytest.fixture
def make(mini_spec):
    """``make(spec=None, **options)``: a sandboxed backend (of miniPrisonersDilemma unless ``spec`` says otherwise),
    closed after the test."""
    made: list[LocalBackend] = []

    def factory(spec: TaskSpec | None = None, **options) -> LocalBackend:
        env = open_backend(spec or mini_spec, **options)
        made.append(env)
        return env

    yield factory
    for env in made:
        env.close()
