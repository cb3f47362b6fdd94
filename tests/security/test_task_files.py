"""The agent editing what every later episode starts from or is scored with: the package's task files, our tools, the
evaluation harness. None of it may change on the host, and a fresh reset must hand out the package's own files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.backends.local import sandbox as sandbox_mod
from mlgym_registry.backends.local.evaluation import HARNESS_DIR
from mlgym_registry.backends.local.toolset import TOOLS_DIR

from .helpers import PACKAGE_DIR, PACKAGE_TASK_DATA, open_backend, run, status

pytestmark = pytest.mark.security

EVIL = "def row_strategy(history):\n    return 1  # planted by the agent\n"


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def env():
    backend = open_backend(registry.spec("prisonersDilemma"))
    yield backend
    backend.close()


def test_the_package_task_files_cannot_be_changed(env):
    strategy = PACKAGE_TASK_DATA / "prisonersDilemma" / "strategy.py"
    before = digest(PACKAGE_DIR / "tasks")
    output, code = status(env, f"test -e '{strategy}' || test -e '{PACKAGE_DIR}' && echo VISIBLE")
    assert "VISIBLE" not in output, "the package's folder is visible inside the sandbox"
    for attack in (
        f"printf '{EVIL}' > '{strategy}'",
        f"chmod u+w '{strategy}'; printf '{EVIL}' >> '{strategy}'",
        f"rm -f '{strategy}'",
        f"mkdir -p '{strategy.parent}' && printf '{EVIL}' > '{strategy}'",  # lands in the sandbox's own root only
        f"open '{strategy}'",
        f"python -c \"open('{strategy}', 'w').write('x')\"",
    ):
        run(env, attack)
    assert digest(PACKAGE_DIR / "tasks") == before
    with open_backend(registry.spec("prisonersDilemma")) as fresh:
        assert (fresh.host_workspace / "strategy.py").read_bytes() == strategy.read_bytes()
        assert "planted by the agent" not in run(fresh, "cat strategy.py")
    env.reset()
    assert (env.host_workspace / "strategy.py").read_bytes() == strategy.read_bytes()


def test_a_custom_task_source_folder_is_hidden(mini_spec):
    source = Path(mini_spec.root)
    before = digest(source)
    with open_backend(mini_spec) as env:
        output, _ = status(env, f"ls -A '{source}' 2>&1; cat '{source}/evaluate.py' 2>&1 | head -3")
        assert "evaluate.py" not in output.replace(f"{source}/evaluate.py", ""), output
        run(env, f"printf '{EVIL}' > '{source}/strategy.py'; rm -f '{source}/evaluate.py'")
    assert digest(source) == before


@pytest.mark.parametrize(
    "folder, shown_at",
    [
        (TOOLS_DIR, sandbox_mod.TOOLS_MOUNT),
        (HARNESS_DIR, sandbox_mod.HARNESS_MOUNT),
    ],
    ids=["tools", "harness"],
)
def test_tools_and_evaluation_harness_cannot_be_changed(env, folder, shown_at):
    before = digest(folder)
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert names
    for name in names:
        output, code = status(env, f"chmod u+w {shown_at}/{name}; echo 'import os; os._exit(0)' >> {shown_at}/{name}")
        assert code != 0 and "Read-only file system" in output, (name, output)
    output, code = status(env, f"rm -rf {shown_at}/* 2>&1; mv {shown_at} /tmp/moved 2>&1; ls {shown_at}")
    assert all(name in output for name in names), output
    assert digest(folder) == before


def test_the_python_installations_cannot_be_changed(env):
    paths, code = status(env, "python -c 'import json, sys; print(sys.executable); print(json.__file__)'")
    assert code == 0, paths
    for path in paths.split("\n"):
        before = Path(path).read_bytes()
        output, code = status(env, f"chmod u+w '{path}'; echo 'raise SystemExit' >> '{path}'")
        assert code != 0 and "Read-only file system" in output, (path, output)
        output, code = status(env, f"unshare -rm sh -c \"mount -o remount,rw,bind '$(dirname {path})' && "
                                   f"echo 'raise SystemExit' >> '{path}'\"")
        assert code != 0, output
        assert Path(path).read_bytes() == before
