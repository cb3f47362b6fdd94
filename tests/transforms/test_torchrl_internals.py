"""The TorchRL, tensordict and CPython internals the package relies on (``transforms/torchrl_internals.py``) still
exist and behave as assumed, on the versions installed; those versions are the tested ones, and pyproject.toml
allows none past them."""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata
from pathlib import Path

import pytest

from mlgym_registry.transforms import torchrl_internals
from mlgym_registry.transforms.torchrl_internals import INTERNALS, TESTED, History, problems

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


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
    from mlgym_registry.transforms.history import History as ChainHistory

    assert ChainHistory is History  # one import of it in the package


def test_a_changed_internal_is_named_with_what_relies_on_it(monkeypatch):
    import multiprocessing.queues

    def _feed(buffer, notempty, write, *rest):  # a CPython whose feeder writes without a local named send_bytes
        return write

    monkeypatch.setattr(multiprocessing.queues.Queue, "_feed", staticmethod(_feed))
    found = problems()
    assert len(found) == 1
    assert found[0].startswith("multiprocessing.queues:Queue._feed has no local 'send_bytes' any more (relied on by "
                               "pool_wire._queue_destination")


@pytest.mark.parametrize("package", sorted(TESTED))
def test_the_installed_versions_are_the_tested_ones_and_pyproject_allows_none_past_them(package):
    installed = metadata.version(package)
    assert installed.split(".")[:2] == TESTED[package].split(".")[:2], (
        f"{package} {installed} is installed, the package is tested with {TESTED[package]}: run the suite, then update "
        f"TESTED in {torchrl_internals.__file__} and the bound in pyproject.toml")
    major, minor = (int(part) for part in TESTED[package].split(".")[:2])
    requirement = re.search(rf'"{package}(>=[^"]*)"', PYPROJECT.read_text())
    assert requirement is not None and f"<{major}.{minor + 1}" in requirement.group(1), requirement
