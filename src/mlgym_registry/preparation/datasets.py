"""Where a task's local datasets are found: a data folder first, then where the task file says.

A task file names each local dataset's folder (``data_path``), relative to the task's root. Many task suites do not
ship their data with their task files (MLGym prepares some outside its repository, and Kaggle-style answers are
better kept apart), so every local dataset is looked for, in order, in:

1. the backend's ``data_dir`` option (one folder, or several separated by ``os.pathsep``);
2. ``$MLGYM_REGISTRY_DATA`` (the same form);
3. ``~/.cache/mlgym-registry/data`` (``$XDG_CACHE_HOME`` respected), where ``mlgym-registry prepare`` writes data it
   generates;
4. the task's own ``data_path``.

In a data folder, a dataset sits at the same relative path as in the task's root (for example
``<data folder>/data/titanic/data`` for MLGym's Titanic task), so a folder can hold the data of a whole suite and a
user can replace one file of a dataset (real labels, say) by putting a complete copy of the dataset there. A task
whose ``extra`` names ``data_files`` counts a place as its dataset only when it holds them; one that ships its dataset
counts a data folder's copy only when it holds every name of its own copy.
"""

from __future__ import annotations

import glob
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import TaskFilesMissing
from ..machine import cache_root
from ..specs import TaskSpec
from ..trust_rules import check_host_path, check_workspace_path

DATA_ENV = "MLGYM_REGISTRY_DATA"
PREPARE_KEY = "prepare_data"
"""A task's ``extra`` entry saying how to make its data: ``{"script": ..., "output": ...}``, both relative to the
task's root: ``python <script>`` run in a scratch copy of the script's folder makes the folder ``output``."""
DATA_FILES_KEY = "data_files"
"""A task's ``extra`` entry: the files (glob patterns, relative to the dataset's folder) its local datasets' folder
must hold to count as found, so that an empty or partial folder is refused at ``make`` rather than failing the
evaluator."""
DATA_HINT_KEY = "data_hint"
"""A task's ``extra`` entry: what its missing data is and how to make or get it, added to the ``TaskFilesMissing``
message; ``{folder}`` in it becomes the folder where the data goes (the dataset's place in the first data folder)."""


def default_data_folder() -> Path:
    """The data folder ``prepare`` writes to: ``data`` in the package's cache folder (``machine.cache_root``),
    ``~/.cache/mlgym-registry/data`` by default."""
    return cache_root() / "data"


def data_folders(data_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The data folders to search, in order: ``data_dir``, ``$MLGYM_REGISTRY_DATA``, the default one."""
    folders: list[Path] = []
    for value in (data_dir, os.environ.get(DATA_ENV)):
        if value:
            folders += [Path(part).expanduser() for part in str(value).split(os.pathsep) if part.strip()]
    folders.append(default_data_folder())
    return list(dict.fromkeys(folders))


def relative_data_path(spec: TaskSpec, dataset: dict[str, Any]) -> Path | None:
    """A local dataset's folder relative to the task's root, or None when the task file gave an absolute path
    outside it."""
    written = dataset.get("data_path")
    if not written:
        return None
    path = Path(str(written))
    if not path.is_absolute():
        return path
    if spec.root and path.is_relative_to(spec.root):
        return path.relative_to(spec.root)
    return None


def dataset_candidates(spec: TaskSpec, dataset: dict[str, Any], data_dir: str | None = None) -> list[Path]:
    """Every place a local dataset may be, in the order they are tried."""
    relative = relative_data_path(spec, dataset)
    places = [folder / relative for folder in data_folders(data_dir)] if relative is not None else []
    if dataset.get("data_path"):
        places.append(spec.resolve_path(str(dataset["data_path"])))
    return list(dict.fromkeys(places))


def find_local_dataset(spec: TaskSpec, dataset: dict[str, Any], data_dir: str | None = None) -> Path:
    """The folder (or file) of a local dataset: the first candidate that exists and holds the task's ``data_files``,
    else ``TaskFilesMissing`` naming where to put it, the files it must hold, the task's ``data_hint`` and, when the
    task can make its data, the command that does."""
    from .virtualenvs import prepare_command

    places = dataset_candidates(spec, dataset, data_dir)
    files = required_files(spec) or shipped_files(spec, dataset)
    for place in places:
        if place.exists() and not missing_files(place, files):
            return place
    name = dataset.get("name", "")
    shown = "\n".join(f"  {place}" + _lacking(place, files) for place in places)
    hint = (f" {prepare_command(spec)} makes it." if spec.extra.get(PREPARE_KEY) else
            f" Put the files in a data folder at the same relative path (pass data_dir=... to the backend or set "
            f"{DATA_ENV}).")
    needed = f" It must hold {', '.join(files)}." if files else ""
    extra_hint = str(spec.extra.get(DATA_HINT_KEY) or "").strip()
    told = f"\n{extra_hint.replace('{folder}', str(places[0]))}" if extra_hint and places else ""
    raise TaskFilesMissing(
        f"task {spec.id!r}: the files of its local dataset {name!r} are not here; looked in:\n{shown}\n"
        f"The task file's repository does not ship them.{hint}{needed}{told}"
    )


def required_files(spec: TaskSpec) -> list[str]:
    """The glob patterns (``data_files``) a folder of the task's local dataset must match to count as found."""
    value = spec.extra.get(DATA_FILES_KEY) or []
    return [str(item) for item in ([value] if isinstance(value, str) else value) if str(item).strip()]


MAX_SHIPPED = 64


def shipped_files(spec: TaskSpec, dataset: dict[str, Any]) -> list[str]:
    """The names at the top of the task's own copy of a local dataset, when the task ships one (as glob patterns that
    match only themselves): a data folder's copy counts as the dataset only when it holds them all, a complete copy,
    so that a data folder holding other tasks' data at the same relative path (``data``) is never taken for it."""
    own = spec.resolve_path(str(dataset["data_path"]))
    if not own.is_dir():
        return []
    return sorted(glob.escape(entry.name) for entry in own.iterdir())[:MAX_SHIPPED]


def missing_files(place: Path, files: list[str]) -> list[str]:
    """The patterns of ``files`` that nothing in the folder ``place`` matches."""
    return [pattern for pattern in files if not (place.is_dir() and any(place.glob(pattern)))]


def _lacking(place: Path, files: list[str]) -> str:
    """`` (it lacks ...)`` for a candidate folder that exists but misses some required files, else ``""``."""
    lacking = missing_files(place, files) if place.exists() else []
    return f" (there, but it lacks {', '.join(lacking)})" if lacking else ""


def local_datasets(spec: TaskSpec) -> list[dict[str, Any]]:
    """The task's datasets that are files (``is_local``) with a ``data_path``."""
    return [d for d in spec.datasets if isinstance(d, dict) and d.get("is_local") and d.get("data_path")]


def hub_datasets(spec: TaskSpec) -> list[str]:
    """The names of the datasets the task loads by name from the Hugging Face hub (not local files)."""
    return [str(d.get("data_path") or d.get("name")) for d in spec.datasets
            if isinstance(d, dict) and not d.get("is_local")]



def data_recipe(spec: TaskSpec) -> dict[str, str] | None:
    """The task's ``prepare_data`` recipe, checked for shape and place: its script lies in the task's root and its
    output is a relative path that does not climb (``TaskPathRefused`` otherwise); None when it has none."""
    recipe = spec.extra.get(PREPARE_KEY)
    if not recipe:
        return None
    if not isinstance(recipe, dict) or not recipe.get("script") or not recipe.get("output"):
        raise TaskFilesMissing(f"task {spec.id!r}: prepare_data must be a mapping with 'script' and 'output' paths")
    where = spec.source or spec.id
    if spec.root:
        check_host_path(where, "prepare_data.script", recipe["script"], Path(spec.root))
    check_workspace_path(where, "prepare_data.output", recipe["output"], "a data folder")
    return {"script": str(recipe["script"]), "output": str(recipe["output"])}


ScriptRunner = Callable[[list[str], Path, Path, str, float], "subprocess.CompletedProcess[str]"]
"""Runs a task's data script: ``(argv, scratch, cwd, python, timeout)`` -> its finished process, text output
(``mlgym_registry.backends.local.data_script.run_data_script``: in the local backend's sandbox)."""


def prepare_data(spec: TaskSpec, python: str, data_dir: str | None = None, *, run_script: ScriptRunner,
                 force: bool = False, timeout: float = 3600, echo=print) -> Path | None:
    """Make the task's data with its ``prepare_data`` recipe, into the first data folder (``data_dir``, else
    ``$MLGYM_REGISTRY_DATA``, else the default one), unless the dataset is found already (``force`` remakes it).

    The script runs with ``python`` (the task's interpreter) through ``run_script``, which confines it (the local
    backend's sandbox, ``run_data_script``: no network, the host read-only and hidden but for the system folders and
    the interpreter), in a scratch copy of its
    folder at the same relative path as in the task's root, so that paths like ``../data`` land where they would;
    only ``output`` is kept, and only when it is plain files and folders in the scratch folder. The task's root and
    every other host file are never written to. Returns the folder made, or None when the task has no recipe.
    """
    import shutil
    import tempfile

    recipe = data_recipe(spec)
    if recipe is None:
        return None
    target = data_folders(data_dir)[0] / recipe["output"]
    if target.exists() and not force:
        echo(f"{spec.id}: data present at {target}")
        return target
    script = spec.resolve_path(recipe["script"])
    if not script.is_file():
        raise TaskFilesMissing(f"task {spec.id!r}: its data script {str(script)!r} does not exist")
    relative_script = Path(recipe["script"])
    with tempfile.TemporaryDirectory(prefix="mlgym-registry-data-") as scratch:
        folder = Path(scratch) / relative_script.parent
        shutil.copytree(script.parent, folder, symlinks=True)  # a link stays a link: the sandbox shows no host home
        echo(f"{spec.id}: making its data with {relative_script} ...")
        done = run_script([python, script.name], Path(scratch), relative_script.parent, python, timeout)
        made = Path(scratch) / recipe["output"]
        if done.returncode != 0 or not made.exists():
            raise TaskFilesMissing(
                f"task {spec.id!r}: {relative_script} did not make {recipe['output']} (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr).strip()[-1500:]}"
            )
        refuse_links(spec, made, Path(scratch))
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(made, staging, symlinks=True)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    echo(f"{spec.id}: data made at {target}")
    return target


def refuse_links(spec: TaskSpec, made: Path, scratch: Path) -> None:
    """Refuse a data script's output that is not plain files and folders inside ``scratch`` (a link in it, or on the
    way to it, could make the host copy its own files into the data folder, and from there into a workspace)."""
    links = [made] if not made.resolve().is_relative_to(scratch.resolve()) else []
    for folder, dirs, files in os.walk(made):
        links += [Path(folder) / name for name in (*dirs, *files) if (Path(folder) / name).is_symlink()]
    if links:
        shown = ", ".join(str(path.relative_to(scratch)) for path in links[:5])
        raise TaskFilesMissing(f"task {spec.id!r}: its data script made links ({shown}) in its output or on the way "
                               f"to it; a task's data must be plain files, so nothing was kept")
