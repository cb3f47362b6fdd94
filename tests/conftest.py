"""Shared test helpers: fake plugin distributions written to a temporary site folder."""

from __future__ import annotations

import importlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TRAJECTORIES = SHARED / "mlgym-trajectories"

# seeded runs derive their evaluators' seeds with an installation key (mlgym_registry.seeding): give the whole session
# (its subprocesses and workers too) one of its own, so that tests never create a key in the user's config folder
os.environ.setdefault("MLGYM_REGISTRY_SEED_KEY", secrets.token_hex(32))


def recorded_results(traj: Path) -> Path | None:
    """The results.json of a recorded run: ``<run>.results.json`` beside it, or MLGym's own ``results.json`` in its
    run folder; None when there is neither."""
    for candidate in (traj.with_name(traj.stem + ".results.json"), traj.with_name("results.json")):
        if candidate.is_file():
            return candidate
    return None


class FakeSite:
    """A folder on ``sys.path`` holding installed-looking distributions with ``mlgym_registry`` entry points."""

    def __init__(self, path: Path):
        self.path = path

    def add(self, dist: str, module: str, source: str, entry_point: str = "plugin", version: str = "0.1") -> None:
        """Write ``module.py`` with ``source`` and a dist-info declaring it as an ``mlgym_registry`` entry point."""
        (self.path / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[mlgym_registry]\n{entry_point} = {module}\n")
        importlib.invalidate_caches()

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for a subprocess that should see this site folder."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.path), env.get("PYTHONPATH")]))
        env.update(extra)
        return env


@pytest.fixture
def fake_site(tmp_path, monkeypatch) -> FakeSite:
    """A fake site folder, on ``sys.path`` for this test only; what was imported from it is forgotten afterwards, so
    that a later test's module of the same name is imported afresh."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    yield FakeSite(site)
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(site)):
            del sys.modules[name]


def default_sigint() -> None:
    """For ``Popen(preexec_fn=...)``: Ctrl-C as a terminal delivers it. A suite started in the background by a shell
    runs with SIGINT ignored, and children inherit that, so a test of what Ctrl-C does must undo it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=timeout
    )


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``mlgym-registry ARGS`` as a user would (a fresh process)."""
    return subprocess.run(
        [sys.executable, "-m", "mlgym_registry.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )



@pytest.fixture(scope="session", autouse=True)
def background_replays(request, tmp_path_factory):
    """Replays of the recorded MLGym runs that ``test_replay.py`` checks, started when the session starts and run in
    the background at the lowest priority (see ``background_replays.py``); ``{}`` when no such test is selected."""
    import background_replays as replays

    paths = [item.callspec.params["path"] for item in request.session.items
             if getattr(item, "originalname", None) == replays.TEST_NAME]
    if not paths:
        yield {}
        return
    pool, runs = replays.start(paths, tmp_path_factory)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)
