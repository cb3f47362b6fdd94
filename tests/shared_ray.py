"""One local Ray runtime for the test modules that need nothing special of it (``shared_ray``).

Starting a runtime costs seconds of CPU (tens of seconds of wall time on a loaded 2-core machine, where Ray's fixed
30 s raylet wait can even make it start twice) and a few hundred MB for as long as it runs. So
``tests/interop/torchrl/test_ray_collectors.py``, ``tests/scale/test_engine_records.py`` and
``tests/scale/test_ray_episodes.py`` share one: the runtime ``ray_session(num_cpus=2)`` starts, as a user's local
run gets it (loopback only, its own temporary folder, its workers at normal priority).

A module whose tests use it marks itself ``pytest.mark.xdist_group(RAY_GROUP)`` and keeps no module-scoped fixture
(``tests/conftest.py`` would give it a group of its own): under pytest-xdist one worker runs all of these tests in a
row, and the runtime starts once. The first test that uses it starts it; it is stopped as soon as the next test to run
in this process is not of the group, so it neither lingers through that worker's other tests nor leaves them its
environment variables (its token, its loopback switch). In a session without workers, where other modules run between
these modules, it starts again for the next module that uses it.

Its workers have one more folder on their ``PYTHONPATH`` (never on this process's ``sys.path``): empty, but while a test
installs a distribution there (``SharedRay.installed_on_workers``), as on a worker node with an install of its own.
The tests that use the runtime end what they start in it (actors, placement groups) and change nothing else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RAY_GROUP = "ray"
"""The xdist_group of every test module that uses ``shared_ray``: one worker runs them all, so it starts once."""


class SharedRay:
    """The shared runtime: started by the first test that uses it, stopped after the last of the group's tests in a
    row (``StopAfterGroup``)."""

    def __init__(self, worker_site: Path):
        self.worker_site = worker_site
        """A folder on the workers' ``PYTHONPATH`` only: see ``installed_on_workers``."""
        self.starts = 0
        self._stack: contextlib.ExitStack | None = None
        self._session: Any = None

    @property
    def session(self):
        """The running runtime's ``RaySession`` (``ray_session``'s)."""
        assert self._stack is not None, "the shared Ray runtime is not running: use the shared_ray fixture"
        return self._session

    def start(self) -> None:
        """Start the runtime, unless it is running."""
        if self._stack is not None:
            return
        from mlgym_registry.scale.ray_runtime import ray_session

        stack = contextlib.ExitStack()
        # the workers inherit the environment the runtime starts with: the folder is on PYTHONPATH for the start only,
        # so that no other process this one starts sees it
        with _prepended("PYTHONPATH", str(self.worker_site)):
            self._session = stack.enter_context(ray_session(num_cpus=2))
        self._stack = stack
        self.starts += 1

    def stop(self) -> None:
        """Stop the runtime and every process it started, if it is running."""
        stack, self._stack, self._session = self._stack, None, None
        if stack is not None:
            stack.close()

    @contextlib.contextmanager
    def installed_on_workers(self, dist: str, module: str, source: str, entry_point: str = "plugin") -> Iterator[None]:
        """A distribution ``dist`` whose ``mlgym_registry`` entry point ``entry_point`` is ``module`` (with the code
        ``source``), installed where the runtime's workers look during the block, then removed: a worker started in
        the block (every actor has a process of its own) loads it with the other plugins."""
        code = self.worker_site / f"{module}.py"
        info = self.worker_site / f"{dist.replace('-', '_')}-0.1.dist-info"
        code.write_text(textwrap.dedent(source))
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[mlgym_registry]\n{entry_point} = {module}\n")
        try:
            yield
        finally:
            shutil.rmtree(info)
            code.unlink()


def in_ray_group(item: pytest.Item) -> bool:
    """Whether ``item`` is one of the tests marked ``xdist_group(RAY_GROUP)``."""
    mark = item.get_closest_marker("xdist_group")
    return mark is not None and (mark.args[0] if mark.args else mark.kwargs.get("name")) == RAY_GROUP


class StopAfterGroup:
    """A plugin that stops the shared runtime after a test when the next test this process runs is not of the group
    (or there is none)."""

    def __init__(self, shared: SharedRay):
        self.shared = shared

    @pytest.hookimpl(trylast=True)  # after the test's own teardown
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if nextitem is None or not in_ray_group(nextitem):
            self.shared.stop()


_SHARED: SharedRay | None = None
"""This process's one ``SharedRay``. Not a session-scoped fixture's value: each module that imports a fixture gets a
definition (and a value) of its own, so a session-scoped one would start a runtime per module all the same."""


def shared_runtime(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> SharedRay:
    """This process's ``SharedRay``, made on first use with the plugin that stops it (``StopAfterGroup``), and a
    clean-up that stops it when the session ends whatever happened."""
    global _SHARED
    if _SHARED is None:
        shared = SharedRay(tmp_path_factory.mktemp("ray-worker-site"))
        config.pluginmanager.register(StopAfterGroup(shared), "mlgym-registry-shared-ray")
        config.add_cleanup(shared.stop)
        _SHARED = shared
    return _SHARED


@pytest.fixture
def shared_ray(request, tmp_path_factory) -> SharedRay:
    """The shared local Ray runtime (``ray_session(num_cpus=2)``), running for this test; ``.session`` is its
    ``RaySession``."""
    pytest.importorskip("ray")
    shared = shared_runtime(request.config, tmp_path_factory)
    shared.start()
    return shared


@contextlib.contextmanager
def _prepended(name: str, path: str) -> Iterator[None]:
    """``path`` first in the environment variable ``name`` (a search path) for the block."""
    saved = os.environ.get(name)
    os.environ[name] = os.pathsep.join(filter(None, [path, saved]))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
