"""Every code block in docs/ runs.

- ```python blocks run in order, in one namespace per page, in a temporary working directory;
- ```bash blocks: each line is an `mlgym-registry` command, run as `python -m mlgym_registry.cli ARGS` in a process of
  its own that must exit 0 (forked from a server that has imported torch and TorchRL once, see `cli_server.py`);
- ```yaml blocks must parse; a task (a mapping with an `id`) must load with `load_task_yaml`, and its text is
  available to the page's later Python blocks as `TASK_YAML`;
- ```toml blocks must parse;
- a block preceded by `<!-- docs-test: skip REASON -->` is not run (for blocks that need a person);
- any other fenced block fails the test, so nothing in the docs goes unchecked.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from mlgym_registry import load_task_yaml

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(DOCS.glob("*.md"))
BLOCK = re.compile(r"(?P<skip><!-- docs-test: skip [^>]+-->\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```$",
                   re.MULTILINE | re.DOTALL)
# episodes in worker processes and on Ray; training
SLOW_PAGES = {"quickstart.md", "training.md", "scaling.md", "evaluation.md", "serving.md", "verifiers.md"}
RAY_PAGES = {"scaling.md"}  # start Ray runtimes
EXTRA_PAGES = {"verifiers.md": "verifiers", "trl.md": "trl"}
"""Pages whose examples need an optional extra's module: run where it is installed, skipped where it is not."""


def page_param(page: Path):
    marks = [pytest.mark.slow] if page.name in SLOW_PAGES else []
    marks += [pytest.mark.ray] if page.name in RAY_PAGES else []
    return pytest.param(page, marks=marks)


def blocks(page: Path) -> list[tuple[str, str, bool]]:
    return [(m["lang"], m["code"], bool(m["skip"])) for m in BLOCK.finditer(page.read_text())]


EPISODE_COMMANDS = {"run", "replay", "bench", "report"}
"""Sub-commands that play episodes (``report``: the noise band), whose processes import torch and TorchRL: the command
server imports them before the first of these (the others, ``list``, ``show``..., never need them)."""

COMMAND_CEILING = 600.0
"""Seconds a command may take before it counts as hung (not a timing: see tests/conftest.py's SUBPROCESS_CEILING)."""


class CommandServer:
    """Runs ``mlgym-registry`` command lines through ``cli_server.py``, started on the first one and kept for the
    session: each command is ``mlgym_registry.cli`` run as ``__main__`` in a process forked from it, with the test's
    working folder and environment; its output goes to files in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.server: subprocess.Popen | None = None
        self.count = 0

    def run(self, words: list[str], cwd: Path) -> tuple[int, str, str]:
        """``(exit status, stdout, stderr)`` of ``mlgym-registry WORDS`` run in ``cwd``."""
        command = next((word for word in words if not word.startswith("-")), None)
        self.count += 1
        stdout, stderr = (self.folder / f"{self.count}.{name}" for name in ("out", "err"))
        self._send({"argv": words, "cwd": str(cwd), "env": dict(os.environ), "stdout": str(stdout),
                    "stderr": str(stderr), "preload": command in EPISODE_COMMANDS})
        pid = self._receive(COMMAND_CEILING)["pid"]
        try:
            code = self._receive(COMMAND_CEILING)["exit"]
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._receive(COMMAND_CEILING)
            raise
        return code, stdout.read_text(errors="replace"), stderr.read_text(errors="replace")

    def _send(self, request: dict) -> None:
        if self.server is None or self.server.poll() is not None:
            with (self.folder / "server.log").open("ab") as log:
                self.server = subprocess.Popen(
                    [sys.executable, str(Path(__file__).with_name("cli_server.py"))], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, bufsize=0,
                )
        data = memoryview(json.dumps(request).encode() + b"\n")
        while data:  # a raw pipe may take part of it at a time
            data = data[self.server.stdin.write(data):]

    def _receive(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("mlgym-registry", timeout)
        line = self.server.stdout.readline()
        if not line:
            log = (self.folder / "server.log").read_text(errors="replace")
            raise RuntimeError(f"the command server ended (exit status {self.server.wait()}):\n{log}")
        return json.loads(line)

    def close(self) -> None:
        if self.server is not None:
            self.server.stdin.close()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()


@pytest.fixture(scope="session")
def commands(tmp_path_factory):
    server = CommandServer(tmp_path_factory.mktemp("docs-commands"))
    yield server
    server.close()


def run_shell(code: str, cwd: Path, commands: CommandServer) -> None:
    for line in code.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        assert words[0] == "mlgym-registry", f"shell blocks may only hold mlgym-registry commands, got {line!r}"
        returncode, stdout, stderr = commands.run(words[1:], cwd)
        assert returncode == 0, f"{line!r} failed:\n{stdout}\n{stderr}"


def test_every_page_the_readme_links_exists():
    readme = (DOCS.parent / "README.md").read_text()
    linked = set(re.findall(r"docs/(\w+\.md)", readme))
    assert linked and linked <= {page.name for page in PAGES}


@pytest.mark.parametrize("page", [page_param(p) for p in PAGES], ids=lambda p: p.name)
def test_code_blocks_run(page, tmp_path, monkeypatch, commands):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # what the examples make in the temp folder goes with the test's
    monkeypatch.setattr(tempfile, "tempdir", None)
    if page.name in EXTRA_PAGES:
        pytest.importorskip(EXTRA_PAGES[page.name], reason=f"{page.name} needs the {EXTRA_PAGES[page.name]} extra")
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    found = blocks(page)
    assert found, f"{page.name} has no code block"
    for index, (lang, code, skip) in enumerate(found):
        where = f"{page.name}, block {index + 1} ({lang or 'no language'})"
        if skip:
            continue
        if lang == "python":
            exec(compile(code, where, "exec"), namespace)  # noqa: S102 - running the docs is the point
        elif lang == "bash":
            run_shell(code, tmp_path, commands)
        elif lang == "yaml":
            data = yaml.safe_load(code)
            if isinstance(data, dict) and "id" in data:
                path = tmp_path / f"{data['id']}.yaml"
                path.write_text(code)
                assert load_task_yaml(path).id == data["id"]
                namespace["TASK_YAML"] = code
        elif lang == "toml":
            tomllib.loads(code)
        else:
            pytest.fail(f"{where}: a block the docs test cannot run; give it a language it runs or a skip comment")
