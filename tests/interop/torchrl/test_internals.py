"""The TorchRL, tensordict and CPython internals the package relies on (``interop/torchrl/internals.py``) still
exist and behave as assumed, on the versions installed; those versions are the tested ones, and pyproject.toml
allows none past them; and nothing outside the interop room reads a stack frame."""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata
from pathlib import Path

import pytest

import mlgym_registry
from mlgym_registry.interop.torchrl import internals
from mlgym_registry.interop.torchrl.internals import INTERNALS, TESTED, problems
from mlgym_registry.transforms.history import History

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
PACKAGE = Path(mlgym_registry.__file__).parent
LIBRARY_HISTORY = re.compile(r"from (tensordict|torchrl)[\w.]* import [^\n]*\bHistory\b")
"""An import of ``History`` from tensordict or TorchRL."""
FRAME_READERS = ("sys._getframe", "f_locals", "f_back", "inspect.stack", "inspect.currentframe")
"""What reading a stack frame looks like in the code."""


@pytest.mark.parametrize("internal", INTERNALS, ids=[internal.name for internal in INTERNALS])
def test_each_internal_still_exists_and_behaves_as_assumed(internal):
    assert internal.check() == "", internal.used_by


def test_all_hold_together():
    assert problems() == []


def test_history_comes_from_tensordict_where_it_lives_else_from_torchrl():
    if importlib.util.find_spec("tensordict.llm") is not None:
        assert History.__module__.startswith("tensordict.llm")
    else:
        from torchrl.data.llm import History as TorchRLHistory

        assert History is TorchRLHistory
    imports = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
               if LIBRARY_HISTORY.search(path.read_text()) and "data" not in path.parts]
    assert imports == ["transforms/history.py"]  # one import of it in the package, the others take it from there


def test_a_changed_internal_is_named_with_what_relies_on_it(monkeypatch):
    import multiprocessing.process

    def run(self):  # a CPython whose processes keep their target under another name
        self._function(*self._args, **self._kwargs)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "run", run)
    found = problems()
    assert len(found) == 1
    assert found[0].startswith("multiprocessing.process:BaseProcess.run no longer uses '_target' (relied on by "
                               "drivers.worker_loop")


def test_no_stack_frame_is_read_outside_the_interop_room():
    """Who calls the env is told it, once (``drivers``), never read from the stack; the two reads TorchRL 0.14 leaves
    no other way to make (``pools.constructing_pool``, ``pools.reading_env_indices``) are the interop room's."""
    readers = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                     if any(reader in path.read_text() for reader in FRAME_READERS)
                     and not {"data", "harness", "tools"} & set(path.parts))
    assert readers == ["interop/torchrl/pools.py"]


@pytest.mark.parametrize("package", sorted(TESTED))
def test_the_installed_versions_are_the_tested_ones_and_pyproject_allows_none_past_them(package):
    installed = metadata.version(package)
    assert installed.split(".")[:2] == TESTED[package].split(".")[:2], (
        f"{package} {installed} is installed, the package is tested with {TESTED[package]}: run the suite, then update "
        f"TESTED in {internals.__file__} and the bound in pyproject.toml")
    major, minor = (int(part) for part in TESTED[package].split(".")[:2])
    requirement = re.search(rf'"{package}(>=[^"]*)"', PYPROJECT.read_text())
    assert requirement is not None and f"<{major}.{minor + 1}" in requirement.group(1), requirement
