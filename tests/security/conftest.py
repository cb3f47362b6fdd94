"""Fixtures of the red-team suite (helpers are in ``helpers.py``)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

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


@pytest.fixture
def small_disk():
    """A 96 MB file system of its own (an in-memory one, mounted here), where envs can fill the disk they share."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    folder = Path(tempfile.mkdtemp(prefix="mlgr-small-disk-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0755", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a small file system here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.rmdir()
