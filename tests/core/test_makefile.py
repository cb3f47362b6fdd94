"""The Makefile's installs: `make demo` installs the package alone (no test tools) and shows pip's progress, `make
test` (and `make venv`, which CI runs) installs everything the suite needs. Read from `make -n` on a fresh venv path, so
nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def planned(target: str, tmp_path: Path) -> list[str]:
    """The commands ``make TARGET`` would run for a clone without a venv (``make -n``)."""
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("make")]


def installs(commands: list[str]) -> list[str]:
    return [command for command in commands if " -m pip install " in command]


def test_make_demo_installs_the_package_alone_and_shows_progress(tmp_path):
    commands = planned("demo", tmp_path)
    pip = installs(commands)
    assert any("torch==" in command for command in pip)
    package = [command for command in pip if command.endswith(" -e .")]
    assert len(package) == 1 and "--quiet" not in package[0]  # the long install shows its progress
    assert not [command for command in pip if "[test" in command or "plugins/" in command or "openenv" in command]
    assert any(command.startswith("echo ") and "make demo: installing" in command for command in commands)
    assert commands[-1].split()[0].endswith("/venv/bin/mlgym-registry") and "run prisonersDilemma" in commands[-1]


@pytest.mark.parametrize("target", ["venv", "test"])
def test_make_venv_and_test_keep_their_own_installs(target, tmp_path):
    commands = planned(target, tmp_path)
    pip = installs(commands)
    # the full install stamps the demo's too: the demo then installs nothing more
    assert any(c.startswith("touch ") and ".installed-package" in c and ".installed " in c + " " for c in commands)
    assert any("-e '.[test,verifiers]' -e plugins/mlgym-registry-example" in command for command in pip)
    assert any("--no-deps openenv==" in command for command in pip)
    assert any("torch==" in command for command in pip)


def test_after_make_venv_the_demo_installs_nothing_more(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    for stamp in (".installed", ".installed-package"):  # what the venv recipe touches
        (venv / stamp).touch()
    assert not installs(planned("demo", tmp_path))
    assert not installs(planned("test", tmp_path))
