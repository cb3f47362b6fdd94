"""Shared test helpers: fake plugin distributions written to a temporary site folder."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cli_commands
import cpu_accounts
import pytest
from mlgym_fixtures import engine, mlgym_checkout, no_mlgym  # noqa: F401 - fixtures for every test module
from outside_data import RECORDED

# pytest-xdist runs more workers than this machine has cores (make test); torch's thread pool in each of them (and
# in the processes they start: spawned env workers, Ray actors) would then fight over the cores. One thread each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# seeded runs derive their evaluators' seeds with an installation key (mlgym_registry.seeding): give the whole session
# (its subprocesses and workers too) one of its own, so that tests never create a key in the user's config folder. The
# same key every session: a seeded test then plays the same episodes on every run and machine, so a rerun of a failed
# suite gives the same verdict (a random key made a test's outcome depend on the draw)
os.environ.setdefault("MLGYM_REGISTRY_SEED_KEY", hashlib.sha256(b"mlgym-registry's test sessions").hexdigest())


def write(path: Path, text: str) -> Path:
    """Write ``text`` (dedented) to ``path``, making its folders: a file of a fake MLGym checkout or task."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def fresh_registry():
    """A new ``Registry`` with its plugins loaded (it reads ``MLGYM_ROOT`` as it is now)."""
    from mlgym_registry import Registry

    reg = Registry()
    reg.names("task")
    return reg


def load_bench_script(name: str):
    """The script ``bench/<name>`` as a module, registered in ``sys.modules`` (where its dataclasses look)."""
    path = Path(__file__).resolve().parents[1] / "bench" / name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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


SUBPROCESS_CEILING = 600.0
"""Seconds a test's fresh interpreter or command may take before it counts as hung: a ceiling far above what a loaded
2-core machine takes (a 3-step run took 180 s on a shared one at load 30), not a timing."""


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = SUBPROCESS_CEILING) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=timeout
    )


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = SUBPROCESS_CEILING) -> subprocess.CompletedProcess:
    """Run ``mlgym-registry ARGS`` as a user would, in a process of its own: forked from this test process's command
    server, which has imported torch and TorchRL once, or a fresh interpreter where that would differ (see
    ``cli_commands.py``). A test of what only a fresh interpreter shows starts one itself."""
    return cli_commands.run_cli(args, env, timeout)


@pytest.fixture(scope="session", autouse=True)
def command_server(tmp_path_factory):
    """The command server ``run_cli`` forks commands from: it starts with the first command and ends with the
    session."""
    cli_commands.configure(tmp_path_factory.mktemp("cli-commands"))
    yield
    cli_commands.close_shared()


def xdist_worker() -> str | None:
    """This process's pytest-xdist worker id (``gw0``...), or None in a session without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER")


@pytest.fixture(scope="session", autouse=True)
def background_replays(request, tmp_path_factory):
    """Replays of the recorded MLGym runs that ``test_replay.py`` checks, started when the session starts and run in
    the background at the lowest priority (see ``background_replays.py``); ``{}`` when no such test is selected.

    With pytest-xdist the controller has started them (``pytest_xdist_node_collection_finished`` below) in the folder
    the workers share, where their outcomes appear; a worker only reads them."""
    import background_replays as replays

    # a test parametrized over no recorded runs holds no path (outside_data.recorded_run_params)
    paths = [item.callspec.params["path"] for item in request.session.items
             if getattr(item, "originalname", None) == replays.TEST_NAME
             and isinstance(item.callspec.params.get("path"), Path)]
    if not paths:
        yield {}
        return
    if xdist_worker() is None:
        root = tmp_path_factory.mktemp("replays")
    else:
        root = tmp_path_factory.getbasetemp().parent / "replays"  # the session's folder, above each worker's own
    pool, runs = replays.start(paths, root)
    yield runs
    if pool is not None:
        # a worker that had to start them (see background_replays.py) waits for the others' tests too, unless the
        # session stops early
        stopping = xdist_worker() is None or bool(request.session.shouldstop or request.session.shouldfail)
        pool.shutdown(wait=True, cancel_futures=stopping)


REPLAY_POOL = pytest.StashKey[object]()


def pytest_xdist_node_collection_finished(node, ids):
    """In the xdist controller, once the first worker has collected the tests: start the background replays their
    replay tests check, in the session's folder above each worker's own (``background_replays.py``)."""
    config = node.config
    if REPLAY_POOL in config.stash:
        return
    import background_replays as replays

    config.stash[REPLAY_POOL] = None
    paths = replays.selected(ids, RECORDED)
    if paths:
        root = config._tmp_path_factory.getbasetemp() / "replays"  # the workers' folders are basetemp/popen-gwN
        config.stash[REPLAY_POOL], _ = replays.start(paths, root)


REPLAYS_CPU = pytest.StashKey[float]()
"""The background replays' CPU seconds, once their pool has ended (for the time table)."""


def pytest_sessionfinish(session):
    pool = session.config.stash.get(REPLAY_POOL, None)
    if pool is not None:  # every worker has ended, and with it every test waiting for a replay
        # ending the pool waits for its processes, which waited for theirs: their CPU time is counted here
        session.config.stash[REPLAYS_CPU] = cpu_accounts.measured(
            lambda: pool.shutdown(wait=True, cancel_futures=True))


# ---- scheduling under pytest-xdist (make test: -n N --dist loadgroup) and where the time went --------------------

def uses_module_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture set up once per module (a Ray runtime, a model, a served endpoint...)."""
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return False
    return any(defs and defs[-1].scope == "module" for defs in definitions.name2fixturedefs.values())


def uses_shared_server(item: pytest.Item) -> bool:
    """Whether ``item`` uses the session's ``served`` (a module may define a ``served`` of its own instead)."""
    definitions = getattr(item, "_fixtureinfo", None)
    defs = definitions.name2fixturedefs.get("served") if definitions is not None else None
    return bool(defs) and defs[-1].scope == "session"


def is_replay_check(item: pytest.Item) -> bool:
    """The tests that read the background replays' outcomes (they wait for them, so they run last)."""
    import background_replays as replays

    return getattr(item, "originalname", None) in replays.CHECKS


@pytest.hookimpl(tryfirst=True)  # before xdist appends the group names to the test ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (the order of a session without workers is left as it is):

    - the tests of a module that share a module-scoped fixture run in one worker (an ``xdist_group`` per module), so
      that the fixture (a Ray runtime, a model, a server) starts once, not once in each worker they are spread over;
      the tests of every module that use the session's ``served`` model server run in one worker too;
    - those groups and the ``slow`` tests are handed out first, so that no long test starts when the others are done;
    - the tests that check the background replays come last, when the replays had the whole session to run (without
      workers they stay where they are: the replays run in the test process then, and the tests after
      ``test_replay.py`` that check the processes they leave find none of the replays')."""
    if xdist_worker() is None:
        return
    for item in items:
        if is_replay_check(item):
            continue
        if uses_shared_server(item):
            item.add_marker(pytest.mark.xdist_group(SERVED_GROUP))
        elif uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))

    def rank(item: pytest.Item) -> int:
        if is_replay_check(item):
            return 2
        if item.get_closest_marker("xdist_group") or item.get_closest_marker("slow"):
            return 0
        return 1

    items[:] = sorted(items, key=rank)  # stable: each rank keeps the collection order


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """In a worker: warn when pytest-xdist did not put the ``xdist_group`` tests together (it marks them by a
    ``@group`` suffix on their ids; a pytest that ignores the suffix spreads each group over every worker, and the
    fixtures and Ray runtimes the groups share start once per worker)."""
    if xdist_worker() is None or not session.config.getvalue("loadgroup"):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]]
    if lost:
        session.config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"{len(lost)} tests of an xdist_group (the first: {lost[0]}) were not grouped: this pytest-xdist does not "
            f"work with this pytest (see the test extra's pin in pyproject.toml); the suite runs, but slower"), 2)


class TimeTable:
    """Where the time went, printed at the end of the session: per test file, its seconds (setup, call and teardown
    of its tests, in whichever worker they ran) and its CPU seconds (``cpu_accounts``), the files that took the most
    CPU first; then the wall time, and the CPU time of the tests, of the background replays and of the machine."""

    def __init__(self, config: pytest.Config, workers: int):
        self.config = config
        self.workers = workers
        self.per_file: dict[str, float] = {}
        self.cpu_per_file: dict[str, float] = {}
        self.session_end_cpu = 0.0
        self.started = time.monotonic()
        self.machine_at_start = cpu_accounts.machine_cpu()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        self.per_file[path] = self.per_file.get(path, 0.0) + report.duration
        self.cpu_per_file[path] = self.cpu_per_file.get(path, 0.0) + cpu_accounts.report_cpu(report)
        self.session_end_cpu += cpu_accounts.report_cpu(report, cpu_accounts.SESSION_END_PROPERTY)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.per_file:
            return
        wall = time.monotonic() - self.started
        busy = sum(self.per_file.values())
        cpu = sum(self.cpu_per_file.values())
        ranked = sorted(self.per_file, key=lambda path: (self.cpu_per_file[path], self.per_file[path]), reverse=True)
        write = terminalreporter.write_line
        terminalreporter.section("time per test file")
        for path in ranked[:TOP_FILES]:
            write(f"{self.per_file[path]:8.1f} s {self.cpu_per_file[path]:7.1f} CPU-s  {path}")
        if len(ranked) > TOP_FILES:
            rest = ranked[TOP_FILES:]
            write(f"{sum(self.per_file[p] for p in rest):8.1f} s {sum(self.cpu_per_file[p] for p in rest):7.1f} "
                  f"CPU-s  the other {len(rest)} files")
        write(f"tests: {busy:.0f} s in all; session: {wall:.0f} s of wall time with {self.workers} worker(s), "
              f"{busy / max(wall, 1e-9):.1f} tests running at a time on average")
        write(self.cpu_line(cpu))

    def cpu_line(self, tests_cpu: float) -> str:
        """The session's CPU time: the tests', the session's end's, the background replays' and the machine's, and
        how busy its cores were (when they all were, the wall time is the CPU time over the cores, and more workers
        cannot shorten it)."""
        parts = [f"CPU: tests {tests_cpu:.0f} CPU-s (their workers and the processes each waited for)",
                 f"the session's end {self.session_end_cpu:.0f} (its fixtures and what they started)"]
        replays = self.config.stash.get(REPLAYS_CPU, None)
        if replays is not None:
            parts.append(f"background replays {replays:.0f}")
        now = cpu_accounts.machine_cpu()
        if now is not None and self.machine_at_start is not None:
            busy = now.busy - self.machine_at_start.busy
            total = now.total - self.machine_at_start.total
            parts.append(f"the machine {busy:.0f} of its {os.cpu_count()} cores' {total:.0f} "
                         f"({100 * busy / max(total, 1e-9):.0f}% busy)")
        return ", ".join(parts)


TOP_FILES = 15


def pytest_configure(config):
    config.pluginmanager.register(cpu_accounts.CpuPerReport(), "mlgym-registry-cpu-per-report")
    if xdist_worker() is None:  # the controller (or a session without workers) gets every test's report
        workers = getattr(config.option, "numprocesses", None) or 1
        config.pluginmanager.register(TimeTable(config, workers), "mlgym-registry-time-table")


@pytest.fixture(scope="module")
def task_cache(tmp_path_factory):
    """A private cache folder (``MLGYM_REGISTRY_CACHE``) for the task data a test module generates, with no MLGym
    checkout in view."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLGYM_REGISTRY_CACHE", str(folder))
        patch.delenv("MLGYM_ROOT", raising=False)
        yield folder


SERVED_GROUP = "served"
"""The xdist_group of every test that uses ``served``: one worker runs them all, so the server starts once."""


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """``transformers serve`` over the tiny model (``TinyServer`` of ``model_server``), one for the session (for every
    test of every module that uses it: starting one costs a fresh interpreter loading transformers and the model).
    Its users count their own requests (``chat_requests()`` before and after) and change nothing in it."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from model_server import TinyServer

    server = TinyServer(tmp_path_factory.mktemp("serve"))
    try:
        yield server.wait()
    finally:
        server.stop()
