"""What the package takes from the machine: the folder it keeps what it makes in."""

from __future__ import annotations

from mlgym_registry.integrity.report import results_folder
from mlgym_registry.machine import cache_root
from mlgym_registry.preparation.datasets import default_data_folder
from mlgym_registry.preparation.virtualenvs import environments_folder
from mlgym_registry.tasks.suite import cache_dir


def test_everything_the_package_keeps_is_under_one_cache_folder(monkeypatch, tmp_path):
    """Prepared data, environments, generated task data and integrity reports: one folder by default, each part
    moved by its own variable."""
    for variable in ("MLGYM_REGISTRY_ENVS", "MLGYM_REGISTRY_CACHE", "MLGYM_REGISTRY_DATA"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "mlgym-registry"
    assert cache_root() == root
    assert (default_data_folder(), environments_folder(), cache_dir()) == (root / "data", root / "envs", root)
    assert results_folder().parent == root
    monkeypatch.setenv("MLGYM_REGISTRY_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere" and results_folder().parent == tmp_path / "elsewhere"
    assert environments_folder() == root / "envs"

