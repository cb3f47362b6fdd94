"""Every code block in docs/ runs.

- ```python blocks run in order, in one namespace per page, in a temporary working directory;
- ```bash blocks: each line is an `mlgym-registry` command, run as `python -m mlgym_registry.cli ARGS` in a process of
  its own that must exit 0 (forked from a server that has imported torch and TorchRL once, see `cli_commands.py`);
- ```yaml blocks must parse; a task (a mapping with an `id`) must load with `load_task_yaml`, and its text is
  available to the page's later Python blocks as `TASK_YAML`;
- ```toml blocks must parse;
- a block preceded by `<!-- docs-test: skip REASON -->` is not run (for blocks that need a person);
- any other fenced block fails the test, so nothing in the docs goes unchecked.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path

import cli_commands
import pytest
import yaml
from cli_commands import CommandServer

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


@pytest.fixture(scope="session")
def commands() -> CommandServer:
    """The test process's command server (``cli_commands.py``), shared with ``run_cli``."""
    return cli_commands.shared()


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
