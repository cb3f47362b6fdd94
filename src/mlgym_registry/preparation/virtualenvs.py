"""Per-task Python environments: virtual environments that have the packages a task needs.

A task declares the packages its agent's code and its evaluator import (``task_packages``). When the interpreter
running this package lacks some of them, ``prepare`` (``mlgym-registry prepare TASK``) builds a virtual environment
that has them, once, in ``environments_folder()``; every task needing the same set on the same Python version shares
it. The local backend then runs the task's shell and evaluator with that environment's interpreter
(``task_python``), and refuses at ``make`` a task whose packages are nowhere (``MissingTaskPackages``).

pip runs with the user's own configuration (``pip.conf``, ``PIP_*`` variables): an index or a wheel folder configured
there is used as is, so environments can be prepared offline.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import MissingTaskPackages, PrepareFailed
from ..machine import cache_root
from ..specs import TaskSpec
from .import_check import check_imports
from .task_packages import missing_requirements, normalise_requirement, requirement_name, task_requirements

ENVS_ENV = "MLGYM_REGISTRY_ENVS"
"""The variable naming the folder prepared environments live in (see ``environments_folder``)."""
READY = "ready"
"""The file written last into a prepared environment: one without it is unfinished and never used."""
PIP_TAIL_LINES = 25
"""How many of pip's last output lines a failed ``prepare`` shows."""

Echo = Callable[[str], object]


# -- where environments live ---------------------------------------------------------------------------------------
def environments_folder() -> Path:
    """The folder of the prepared environments: ``$MLGYM_REGISTRY_ENVS``, else ``envs`` in the package's cache folder
    (``machine.cache_root``), ``~/.cache/mlgym-registry/envs`` by default."""
    explicit = os.environ.get(ENVS_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    return cache_root() / "envs"


def environment_key(requirements: Iterable[str]) -> str:
    """The name of the environment for ``requirements``: this interpreter's Python ``major.minor`` (environments are
    made from it) and a hash of the sorted normalised requirements, e.g. ``py3.11-0123456789ab``."""
    lines = sorted({normalise_requirement(text) for text in requirements})
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    return f"py{sys.version_info.major}.{sys.version_info.minor}-{digest}"


def prepared_python(spec_or_requirements: TaskSpec | Iterable[str]) -> Path | None:
    """The interpreter of the ready prepared environment for a task (or a list of requirements); None when there is
    none (not prepared, or its preparation never finished)."""
    requirements = _requirements_of(spec_or_requirements)
    return _ready_python(environments_folder() / environment_key(requirements))


def _ready_python(entry: Path) -> Path | None:
    folder = entry.resolve()
    python = folder / "bin" / "python"
    if (folder / READY).is_file() and python.exists():
        return python
    return None


def _requirements_of(spec_or_requirements: TaskSpec | Iterable[str]) -> list[str]:
    if isinstance(spec_or_requirements, TaskSpec):
        return task_requirements(spec_or_requirements)
    if isinstance(spec_or_requirements, str):
        raise TypeError("pass a TaskSpec or a list of requirement strings, not one string")
    return [normalise_requirement(text) for text in spec_or_requirements]


# -- the interpreter a task runs with ------------------------------------------------------------------------------
def task_python(spec: TaskSpec) -> str:
    """The interpreter a task runs with when the user names none: this one (``sys.executable``) when it has every
    package the task declares (also when it declares none), else the task's prepared environment's. Raises
    ``MissingTaskPackages`` (naming the task, the packages and ``mlgym-registry prepare TASK``) when neither will do.
    """
    requirements = task_requirements(spec)
    missing = missing_requirements(requirements) if requirements else []
    if not missing:
        return sys.executable
    prepared = prepared_python(requirements)
    if prepared is not None:
        return str(prepared)
    raise MissingTaskPackages(task_label(spec), missing, sys.executable, prepare_command(spec))


def task_label(spec: TaskSpec) -> str:
    """How a user names ``spec`` to ``prepare``: the name the registry was asked for (``registered_as``), else the task
    file it was loaded from, else its id. (``Registry.prepare_label`` also finds a registered name for a spec that did
    not come from the registry.)"""
    target = _prepare_target(spec)
    return target if target is not None else spec.id


def prepare_command(spec: TaskSpec) -> str:
    """The command (and the Python call) that prepares ``spec``'s environment, as an error message shows them."""
    target = _prepare_target(spec)
    if target is None:
        return "`mlgym_registry.prepare(spec)` in Python, with this task's TaskSpec"
    return f"`mlgym-registry prepare {shlex.quote(target)}` (in Python: `mlgym_registry.prepare({target!r})`)"


def _prepare_target(spec: TaskSpec) -> str | None:
    """What ``prepare`` can be given for ``spec`` by name: its registered name, else its task file; None for a spec
    that has neither."""
    if spec.registered_as:
        return spec.registered_as
    if spec.source and Path(spec.source).is_file():
        return spec.source
    return None


# -- preparing an environment --------------------------------------------------------------------------------------
def prepare_environment(spec: TaskSpec, *, force: bool = False, pip_args: Sequence[str] = (), echo: Echo = print,
                        label: str | None = None) -> Path:
    """Make sure the packages ``spec`` declares are at hand, and return the interpreter that has them. What it prints
    names the task ``label`` (default: ``task_label(spec)``).

    When the task declares none, or this interpreter already satisfies them, nothing is built (also with ``force``:
    ``task_python`` would not use it) and ``sys.executable`` is returned. Otherwise a ready environment for the same
    requirements is reused, or one is built: ``python -m venv`` from this interpreter and ``pip install`` of the
    requirements (with the user's pip configuration; ``pip_args`` are added to pip's command line), in a new folder
    of ``environments_folder()`` that ``<key>`` (a symbolic link, switched atomically) points at only once complete;
    ``requirements.txt``, ``freeze.txt`` (pip freeze) and the ``ready`` marker are written last. A file lock keeps
    two prepares of the same set from both building. ``force=True`` rebuilds a ready environment (the old one is
    deleted: do not force while an env runs with it). A failure raises ``PrepareFailed`` with pip's last lines and
    leaves nothing behind.

    ``torch`` is installed in the version this interpreter has (``torch==<version without local tag>``) when that
    version satisfies the requirement, so that pip reuses what the configured index or wheel folder offers for it
    (e.g. a CPU build) instead of downloading another multi-GB build.
    """
    label = label or task_label(spec)
    requirements = task_requirements(spec)
    if not requirements:
        echo(f"{label}: declares no packages; it runs with {sys.executable}")
        return Path(sys.executable)
    if not missing_requirements(requirements):
        echo(f"{label}: {sys.executable} has every package it needs ({', '.join(requirements)}); nothing to prepare")
        return Path(sys.executable)
    ready = prepared_python(requirements)
    if ready is not None and not force:
        echo(f"{label}: environment ready at {ready.parent.parent}")
        return ready
    return _build(requirements, label=label, force=force, pip_args=pip_args, echo=echo)


def _build(requirements: list[str], *, label: str, force: bool, pip_args: Sequence[str], echo: Echo) -> Path:
    root = environments_folder()
    root.mkdir(parents=True, exist_ok=True)
    key = environment_key(requirements)
    entry = root / key
    with _locked(root / f"{key}.lock", echo, label):
        ready = _ready_python(entry)
        if ready is not None and not force:  # a concurrent prepare built it while we waited
            echo(f"{label}: environment ready at {ready.parent.parent}")
            return ready
        _remove_leftovers(root, key)
        building = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root))
        try:
            building.chmod(0o755)  # mkdtemp's 0700 is not what a venv folder has
            echo(f"{label}: building an environment with {', '.join(requirements)} in {building} ...")
            python = _make_venv(building)
            _pip_install(python, _install_list(requirements), pip_args, echo)
            check_imports(python, requirements, label)  # before the ready marker: a broken environment is never used
            _write_records(building, python, requirements)
            _publish(entry, building)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    ready = _ready_python(entry)
    assert ready is not None  # just published, under the lock
    echo(f"{label}: environment ready at {ready.parent.parent}")
    return ready


@contextlib.contextmanager
def _locked(path: Path, echo: Echo, label: str) -> Iterator[None]:
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"{label}: waiting for another prepare of the same environment ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_leftovers(root: Path, key: str) -> None:
    """Folders of builds that died (a crash, a kill) and link files of switches that did not finish: under the lock,
    nothing else can be building this key."""
    current = (root / key).resolve() if (root / key).is_symlink() else None
    for path in root.glob(f"{key}.*"):
        if path.is_symlink():
            path.unlink(missing_ok=True)
        elif path.is_dir() and path != current:
            shutil.rmtree(path, ignore_errors=True)


def _clean_environment() -> dict[str, str]:
    """The variables for venv and pip: the user's (pip's configuration included), without what would make the new
    environment's interpreter see another installation's packages."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")
    return {key: value for key, value in os.environ.items() if key not in dropped}


def _make_venv(folder: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "venv", str(folder)], capture_output=True, text=True,
                          env=_clean_environment(), check=False)
    python = folder / "bin" / "python"
    if done.returncode != 0 or not python.exists():
        raise PrepareFailed(f"`{sys.executable} -m venv {folder}` failed (exit {done.returncode}):\n"
                            f"{_tail(done.stdout + done.stderr)}")
    return python


def _install_list(requirements: list[str]) -> list[str]:
    """The requirements as pip installs them: ``torch`` pinned to this interpreter's version when that satisfies it."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        torch_version = Version(metadata.version("torch"))
    except (metadata.PackageNotFoundError, ValueError):
        return list(requirements)
    pinned = []
    for text in requirements:
        requirement = Requirement(text)
        pinnable = not requirement.url and requirement.specifier.contains(torch_version, True)
        if requirement_name(text) == "torch" and pinnable:
            requirement.specifier = type(requirement.specifier)(f"=={torch_version.public}")
            text = str(requirement)
        pinned.append(text)
    return pinned


def _pip_install(python: Path, requirements: list[str], pip_args: Sequence[str], echo: Echo) -> None:
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
               *pip_args, *requirements]
    tail: deque[str] = deque(maxlen=PIP_TAIL_LINES)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=_clean_environment()) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip())
            if line.startswith(("Collecting", "Successfully", "ERROR")):
                echo(f"  {line.rstrip()}")
    if process.returncode != 0:
        raise PrepareFailed(
            f"pip could not install {', '.join(requirements)} (exit {process.returncode}); its last lines:\n"
            + "\n".join(tail) + "\nCheck the names and versions, and that pip's configured index or wheel folder "
            "(pip config list) offers them."
        )


def _write_records(folder: Path, python: Path, requirements: list[str]) -> None:
    frozen = subprocess.run([str(python), "-m", "pip", "freeze", "--disable-pip-version-check"],
                            capture_output=True, text=True, env=_clean_environment(), check=False)
    (folder / "requirements.txt").write_text("".join(f"{text}\n" for text in requirements))
    (folder / "freeze.txt").write_text(frozen.stdout)
    record = {"python": sys.version.split()[0], "made_from": sys.executable, "requirements": requirements,
              "installed": _install_list(requirements), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / READY).write_text(json.dumps(record, indent=2) + "\n")


def _publish(entry: Path, folder: Path) -> None:
    """Point ``entry`` at ``folder`` atomically (a new link renamed over the old one), then delete the old one.

    The environment is not renamed: its scripts (``pip``, ``torchrun``) name its interpreter by its folder's path."""
    link = entry.with_name(f"{entry.name}.link-{os.getpid()}")
    link.unlink(missing_ok=True)
    os.symlink(folder.name, link)
    old = entry.resolve() if entry.is_symlink() else None
    if entry.exists() and not entry.is_symlink():
        shutil.rmtree(entry)
    os.replace(link, entry)
    if old is not None and old != folder.resolve():
        shutil.rmtree(old, ignore_errors=True)


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-PIP_TAIL_LINES:])


# -- listing -------------------------------------------------------------------------------------------------------
@dataclass
class PreparedEnvironment:
    """A ready prepared environment: its key, its folder, its interpreter and the requirements it was made for."""

    key: str
    folder: Path
    python: Path
    requirements: list[str]


def prepared_environments() -> list[PreparedEnvironment]:
    """The ready environments in ``environments_folder()``, sorted by key."""
    root = environments_folder()
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if not entry.is_symlink():
            continue
        python = _ready_python(entry)
        if python is None:
            continue
        folder = python.parent.parent
        listed = (folder / "requirements.txt").read_text().splitlines()
        found.append(PreparedEnvironment(entry.name, folder, python, [line for line in listed if line.strip()]))
    return found

