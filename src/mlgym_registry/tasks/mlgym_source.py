"""Tasks of a user's MLGym checkout, registered as ``mlgym/<id>`` (MLGym's own gym ids) and read from it at run time.

The checkout is ``$MLGYM_ROOT`` when set, else the folder of an installed facebookresearch ``mlgym`` package (found
without importing it) when that folder holds ``configs/tasks``; PyPI's unrelated ``mlgym`` has no such folder and is
ignored. Every ``configs/tasks/*.yaml`` becomes a task: its ``dataset_configs`` are read from ``configs/``, relative
paths resolve against the checkout, and ``dockerfiles/aliases.sh`` is the shell alias file when present. Nothing of
MLGym is copied into this package. Registration only reads each file's ``id`` and ``name``; the full spec is built
when a task is used. A task file that cannot be read is skipped with a warning naming it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from ..errors import InvalidTaskError
from ..hookspecs import hookimpl
from ..scores import mlgym_ranking_metric
from ..specs import TaskSpec, load_task_yaml
from .mlgym_overlay import (
    overlay_baseline,
    overlay_extras,
    overlay_requirements,
    overlay_secret_files,
    overlay_submission,
)

ROOT_ENV = "MLGYM_ROOT"
NAMESPACE = "mlgym/"
TAG = "mlgym"
ENTRYPOINTS = ("CSVSubmissionTasks", "ModelSubmissionTasks", "LMSubmissionTasks", "PythonSubmissionTasks")
"""MLGym's task classes; a task file naming another one cannot run in MLGym either."""

log = logging.getLogger(__name__)


def is_checkout(root: Path) -> bool:
    """True when ``root`` looks like an MLGym checkout (it has ``configs/tasks``)."""
    return (root / "configs" / "tasks").is_dir()


def checkout_of(path: str | Path) -> Path | None:
    """The MLGym checkout whose ``configs/tasks`` holds the task file ``path``, or None for a file elsewhere."""
    path = Path(path).resolve()
    for folder in path.parents:
        if folder.name == "tasks" and folder.parent.name == "configs" and is_checkout(folder.parent.parent):
            return folder.parent.parent
    return None


def load_task_file(path: str | Path) -> TaskSpec:
    """A task file as MLGym reads it when it lies in an MLGym checkout (paths relative to the checkout's root, its
    datasets and our overlay: ``load_mlgym_task``), and as our own task files are read otherwise (paths relative to
    the file: ``specs.load_task_yaml``). Every command that takes a task file, and ``registry.spec(path)``, read it
    with this."""
    root = checkout_of(path)
    return load_mlgym_task(path, root) if root is not None else load_task_yaml(path)


def installed_checkout() -> Path | None:
    """The checkout an installed ``mlgym`` package lives in (source/editable installs), found without importing it."""
    try:
        spec = importlib.util.find_spec("mlgym")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        root = Path(folder).resolve().parent
        if is_checkout(root):
            return root
    return None


def find_checkout() -> Path | None:
    """The MLGym checkout to read tasks from: ``$MLGYM_ROOT``, else an installed source checkout, else None."""
    value = os.environ.get(ROOT_ENV, "").strip()
    if value:
        root = Path(value).expanduser().resolve()
        if is_checkout(root):
            return root
        warnings.warn(
            f"{ROOT_ENV}={value!r} is not an MLGym checkout (no configs/tasks folder in it); "
            f"no {NAMESPACE}* tasks are registered. Point {ROOT_ENV} at a clone of facebookresearch/MLGym.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return installed_checkout()


def read_yaml(path: Path) -> Any:
    """The parsed content of a YAML file (with libyaml's fast loader when available)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)  # noqa: S506 - a safe loader


def task_header(path: Path) -> dict[str, Any]:
    """The parsed task file, checked to be a mapping with an ``id``; ``ValueError`` otherwise."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"it holds a {type(data).__name__}, not a mapping")
    if not data.get("id"):
        raise ValueError("it has no 'id'")
    return data


def load_dataset(root: Path, relative: str) -> dict[str, Any]:
    """A dataset config (``configs/<relative>``) as a dict; a local ``data_path`` becomes absolute."""
    path = root / "configs" / relative
    if not path.is_file():
        raise InvalidTaskError(f"dataset config {relative!r} not found at {str(path)!r}")
    data = read_yaml(path)
    if not isinstance(data, dict) or "data_path" not in data:
        raise InvalidTaskError(f"dataset config {str(path)!r} must be a mapping with a 'data_path'")
    data.setdefault("name", Path(relative).stem)
    data.setdefault("description", "")
    data.setdefault("is_local", False)
    if data["is_local"]:
        data["data_path"] = str(root / str(data["data_path"]))
    return data


def load_mlgym_task(path: str | Path, root: str | Path) -> TaskSpec:
    """The ``TaskSpec`` of one task file of an MLGym checkout, with its datasets, aliases file and the mlgym tag, and
    our overlay (``mlgym_overlay``): the files only its evaluator may see, baseline metrics the file omits, and the
    schema its submission is checked against before its evaluator runs."""
    path, root = Path(path), Path(root)
    spec = load_task_yaml(path, root=root)
    if spec.task_entrypoint not in ENTRYPOINTS:
        raise InvalidTaskError(
            f"MLGym task file {str(path)!r} names task_entrypoint {spec.task_entrypoint!r}, which is not one of "
            f"MLGym's task classes ({', '.join(ENTRYPOINTS)}); MLGym cannot run it either"
        )
    aliases = root / "dockerfiles" / "aliases.sh"
    extra = overlay_extras(spec.id, dict(spec.extra))
    known = mlgym_ranking_metric(spec.id)
    if known is not None:
        extra.setdefault("priority_metric", known.name)
        extra.setdefault("metric_direction", known.direction)
    return spec.replace(
        protected_files=list(spec.protected_files) or evaluator_modules(spec),
        secret_files=list(dict.fromkeys([*spec.secret_files, *overlay_secret_files(spec.id)])),
        baseline_scores=overlay_baseline(spec.id, list(spec.baseline_scores)),
        requirements=spec.requirements if spec.requirements is not None else overlay_requirements(spec.id),
        submission=spec.submission if spec.submission is not None else overlay_submission(spec.id),
        datasets=[load_dataset(root, item) for item in spec.dataset_configs],
        aliases_file=str(aliases) if aliases.is_file() else None,
        tags=[TAG] + [t for t in spec.tags if t != TAG],
        extra=extra,
    )


def evaluator_modules(spec: TaskSpec) -> list[str]:
    """The starter Python files of a Python-submission task that belong to the evaluator: those its description does
    not name, such as a game's opponent (``target.py``) or 3SATTime's ``solver.py``.

    MLGym's task files mark only the evaluation script read-only, so MLGym lets the agent rewrite the opponent its
    strategy is scored against. A description names the file the agent is asked to change (``strategy.py``,
    ``heuristic.py``); the other starter modules the evaluator imports are kept pristine here, like the script.
    """
    if spec.task_entrypoint != "PythonSubmissionTasks":
        return []
    evaluation = {Path(p).name for p in spec.evaluation_paths}
    names = [Path(p).name for p in spec.starter_code]
    return [n for n in names if n.endswith(".py") and n not in evaluation and n not in (spec.description or "")]


@hookimpl
def register_tasks(register):
    root = find_checkout()
    if root is None:
        return
    seen: dict[str, Path] = {}
    for path in sorted((root / "configs" / "tasks").glob("*.yaml")):
        try:
            data = task_header(path)
        except Exception as exc:  # noqa: BLE001 - one unreadable file must not hide the others
            warnings.warn(f"skipping MLGym task file {str(path)!r}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        task_id = str(data["id"])
        if task_id in seen:
            # MLGym itself ships variants that reuse an id (e.g. a second config of one task): the first file wins
            log.info("MLGym task file %s reuses id %r of %s; keeping the first", path, task_id, seen[task_id])
            continue
        seen[task_id] = path
        description = str(data.get("name") or task_id).strip().splitlines()[0]
        register(NAMESPACE + task_id, functools.partial(load_mlgym_task, str(path), str(root)), description=description)
