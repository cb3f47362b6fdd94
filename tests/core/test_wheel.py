"""The wheel a package index would get: the license file, the metadata that makes it findable, and the README's
install line."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import mlgym_registry

ROOT = Path(__file__).resolve().parents[2]


def readme_install_lines() -> list[list[str]]:
    """The commands of the README's install block, split into words."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Install\n.*?```bash\n(.*?)```", readme, re.DOTALL)
    assert block, "README.md has no bash block under '## Install'"
    return [shlex.split(line.partition("#")[0]) for line in block[1].splitlines() if line.partition("#")[0].strip()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel the README's build line makes, from a copy of the source tree (so the build leaves nothing in the
    checkout); offline: the venv's own setuptools builds it (``--no-build-isolation``)."""
    build, _ = readme_install_lines()
    assert build[:3] == ["python", "-m", "pip"] and build[-1] == "."
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run([sys.executable, *build[1:], "--no-build-isolation", "-q"], cwd=source,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (path,) = (source / "dist").glob("mlgym_registry-*.whl")
    return path


@pytest.mark.slow
def test_the_wheel_holds_the_license_and_the_metadata_an_index_shows(wheel):
    version = mlgym_registry.__version__
    assert wheel.name == f"mlgym_registry-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"mlgym_registry-{version}.dist-info"
        assert archive.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "Copyright (c) 2026 the mlgym-registry developers" in license_text
    assert metadata["License-Expression"] == "MIT" and metadata["License-File"] == "LICENSE"
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())
    classifiers = metadata.get_all("Classifier")
    assert {"Programming Language :: Python :: 3.10", "Operating System :: POSIX :: Linux"} <= set(classifiers)
    assert not [c for c in classifiers if c.startswith("License ::")]  # the license expression says it (PEP 639)
    assert metadata["Requires-Python"] == ">=3.10" and metadata["Description-Content-Type"] == "text/markdown"
    # the task data ships too (a wheel without it could not make a task)
    assert "mlgym_registry/tasks/prisonersDilemma.yaml" in names


@pytest.mark.slow
def test_the_readme_install_line_installs_the_wheel_that_imports(wheel, tmp_path):
    _, install = readme_install_lines()
    assert install[:2] == ["pip", "install"] and install[2] == "dist/mlgym_registry-*.whl"
    # the line as printed, with the dependencies left to the running venv (no network here)
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           *[str(p) for p in wheel.parent.glob(install[2].removeprefix("dist/"))]],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    probe = "import mlgym_registry as m; print(m.__file__); print(sorted(m.registry.names('task')))"
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    where, tasks = shown.stdout.splitlines()
    assert where.startswith(str(target)) and "prisonersDilemma" in tasks
