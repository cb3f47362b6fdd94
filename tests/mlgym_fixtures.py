"""Fixtures for tests of the ``mlgym`` backend: no MLGym importable and a container engine double on PATH
(``no_mlgym``, ``engine``), and the stand-in MLGym checkout "installed" (``mlgym_checkout``). Import them into a test
module to use them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from engine_double import EngineDouble
from standin import write_standin_mlgym


def _forget_mlgym() -> None:
    for name in [n for n in sys.modules if n == "mlgym" or n.startswith("mlgym.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


_ENGINES: dict[Path, EngineDouble] = {}


@pytest.fixture
def no_mlgym(monkeypatch, tmp_path):
    """No mlgym importable; a docker double on PATH (the only thing there) and its Engine API at DOCKER_HOST.

    Test modules import this fixture and ``mlgym_checkout`` from here: they get the engine double with them."""
    double = _ENGINES[tmp_path] = EngineDouble(tmp_path / "engine").start()
    for key, value in double.environment().items():
        monkeypatch.setenv(key, value)
    _forget_mlgym()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / "mlgym").exists()])
    yield tmp_path
    _forget_mlgym()
    double.stop()
    del _ENGINES[tmp_path]


@pytest.fixture
def engine(no_mlgym) -> EngineDouble:
    """The engine double of ``no_mlgym``."""
    return _ENGINES[no_mlgym]


@pytest.fixture
def mlgym_checkout(no_mlgym, monkeypatch):
    """The stand-in MLGym checkout, "installed" (on sys.path)."""
    root = write_standin_mlgym(no_mlgym / "MLGym")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield root
    import gymnasium as gym

    for key in [k for k in gym.registry if k.startswith("mlgym/")]:
        del gym.registry[key]
