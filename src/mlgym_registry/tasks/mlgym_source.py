"""Tasks of a user's MLGym checkout, registered as ``mlgym/<id>`` (MLGym's own gym ids) and read from it at run time.

The checkout is ``$MLGYM_ROOT`` when set, else the folder of an installed facebookresearch ``mlgym`` package (found
without importing it) when that folder holds ``configs/tasks``; PyPI's unrelated ``mlgym`` has no such folder and is
ignored. Every ``configs/tasks/*.yaml`` becomes a task: its ``dataset_configs`` are read from ``configs/``, relative
paths resolve against the checkout, and ``dockerfiles/aliases.sh`` is the shell alias file when present. Nothing of
MLGym is copied into this package. Registration only reads each file's ``id`` and ``name``; the full spec is built
when a task is used. A task file that cannot be read is skipped with a warning naming it.

Two files may declare one id (MLGym's ``imageClassificationCifar10L1.yaml`` reuses ``imageClassificationCifar10``): the
first by file name keeps ``mlgym/<id>``, the other is registered as ``mlgym/<its file's stem>`` when no task of the
checkout has that name, and every file stays reachable by its path; a ``DuplicateTaskIdWarning`` names both files.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidTaskError
from ..hookspecs import hookimpl
from ..plugins import PluginReplaceWarning
from ..scores import mlgym_ranking_metric
from ..specs import TaskSpec, load_task_yaml
from ..trust_rules import DATA_HINT, check_host_path
from .mlgym_overlay import (
    overlay_baseline,
    overlay_best_score,
    overlay_extras,
    overlay_files,
    overlay_requirements,
    overlay_secret_files,
    overlay_submission,
    overlay_submission_files,
)

ROOT_ENV = "MLGYM_ROOT"
NAMESPACE = "mlgym/"
TAG = "mlgym"
ENTRYPOINTS = ("CSVSubmissionTasks", "ModelSubmissionTasks", "LMSubmissionTasks", "PythonSubmissionTasks")
"""MLGym's task classes; a task file naming another one cannot run in MLGym either."""


class DuplicateTaskIdWarning(PluginReplaceWarning):
    """Two task files of an MLGym checkout declare the same ``id``; the message names both files, the name each got
    and how to reach the one that did not get ``mlgym/<id>``. A name clash, like a plugin's replaced name: the
    command line does not print it on every command, ``list`` shows the variant's name and file and ``info`` the
    files that share the id."""


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


def load_dataset(root: Path, relative: str, task_file: str = "") -> dict[str, Any]:
    """A dataset config (``configs/<relative>``) as a dict; a local ``data_path`` becomes absolute. The config and a
    local ``data_path`` must lie in the checkout (``TaskPathRefused`` naming the task file and the key otherwise)."""
    path = root / "configs" / relative
    check_host_path(task_file or str(path), "dataset_configs", relative, root / "configs")
    if not path.is_file():
        raise InvalidTaskError(f"dataset config {relative!r} not found at {str(path)!r}")
    data = read_yaml(path)
    if not isinstance(data, dict) or "data_path" not in data:
        raise InvalidTaskError(f"dataset config {str(path)!r} must be a mapping with a 'data_path'")
    data.setdefault("name", Path(relative).stem)
    data.setdefault("description", "")
    data.setdefault("is_local", False)
    if data["is_local"]:
        check_host_path(str(path), "data_path", data["data_path"], root, DATA_HINT)
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
    starter_code, protected = overlay_files(
        spec.id, list(spec.starter_code), list(spec.protected_files) or evaluator_modules(spec))
    return spec.replace(
        starter_code=starter_code,
        protected_files=protected,
        secret_files=list(dict.fromkeys([*spec.secret_files, *overlay_secret_files(spec.id)])),
        baseline_scores=overlay_baseline(spec.id, list(spec.baseline_scores)),
        requirements=spec.requirements if spec.requirements is not None else overlay_requirements(spec.id),
        submission=spec.submission if spec.submission is not None else overlay_submission(spec.id),
        submission_files=(spec.submission_files if spec.submission_files is not None
                          else overlay_submission_files(spec.id)),
        best_score=spec.best_score or overlay_best_score(spec.id),
        datasets=[load_dataset(root, item, str(path)) for item in spec.dataset_configs],
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


@dataclass(frozen=True)
class BorrowedBaseline:
    """The baseline program that a task of an MLGym checkout without one of its own borrows from the task it derives
    from (``borrowed_baseline``)."""

    task_id: str
    """The id of the task it comes from."""
    task_file: str
    """That task's file."""
    program: str
    """The starter file that holds the program, as that task's ``starter_code`` names it (relative to the checkout)."""
    script: str
    """The program's path in the workspace, as that task's ``baseline_paths`` names it: ``python <script>`` runs it."""


def borrowed_baseline(spec: TaskSpec) -> BorrowedBaseline | None:
    """The baseline program of the task that ``spec`` (a CSV task of an MLGym checkout with no baseline program of
    its own) derives from: another task file of the checkout with the same evaluator file, datasets and task class,
    which names a baseline program. MLGym's ``...L1`` variants are such tasks: the same evaluator on the same data,
    with the baseline's scores given in the description but its program left out. Of several, the one with the same
    id comes first, then one whose id begins this id (``regressionKaggleHousePrice`` for its ``...L1``), then by
    file name; None when there is none."""
    root = checkout_of(spec.source) if spec.source else None
    if root is None or spec.task_entrypoint != "CSVSubmissionTasks" or baseline_script(spec.to_dict()) is not None:
        return None
    evaluator = evaluator_file(spec.to_dict(), root)
    if evaluator is None:
        return None
    taken = {Path(item).name for item in spec.starter_code}
    found = []
    for path, data in checkout_headers(root, warn=False):
        borrowed = _baseline_of(path, data, root)
        if (path.resolve() == Path(spec.source).resolve() or borrowed is None
                or Path(borrowed.program).name in taken or evaluator_file(data, root) != evaluator
                or _strings(data.get("dataset_configs")) != list(spec.dataset_configs)
                or str(data.get("task_entrypoint") or "") != spec.task_entrypoint):
            continue
        found.append((borrowed.task_id != spec.id, not spec.id.startswith(borrowed.task_id), borrowed))
    return min(found, key=lambda entry: entry[:2])[2] if found else None


def _strings(value: Any) -> list[str]:
    """A task file's list field as strings ([] when absent)."""
    return [str(item) for item in value] if isinstance(value, list) else []


def baseline_script(data: dict[str, Any]) -> str | None:
    """The workspace path of a task's baseline program (from its task file's fields): the first of its
    ``baseline_paths`` that is not its evaluator, as ``evaluator_runs.baseline_command`` runs it; None when none."""
    evaluation = _strings(data.get("evaluation_paths"))
    scripts = [item for item in _strings(data.get("baseline_paths")) if item not in evaluation[:1]]
    return scripts[0] if scripts else None


def evaluator_file(data: dict[str, Any], root: Path) -> Path | None:
    """The checkout file of a task's evaluator (from its task file's fields): the starter file its first
    ``evaluation_paths`` entry is copied from."""
    evaluation = _strings(data.get("evaluation_paths"))
    if not evaluation:
        return None
    entry = _starter_entry(_strings(data.get("starter_code")), evaluation[0])
    return (root / entry).resolve() if entry is not None else None


def _starter_entry(starter_code: list[str], workspace_path: str) -> str | None:
    """The starter file (or folder) a workspace path comes from: the entry whose name is the path's first part."""
    first = Path(workspace_path).parts[0] if workspace_path else ""
    return next((item for item in starter_code if Path(item).name == first), None)


def _baseline_of(path: Path, data: dict[str, Any], root: Path) -> BorrowedBaseline | None:
    """The baseline program the task file ``path`` names, as one to borrow; None when it names none."""
    script = baseline_script(data)
    program = _starter_entry(_strings(data.get("starter_code")), script) if script else None
    if script is None or program is None or not (root / program).exists():
        return None
    return BorrowedBaseline(str(data["id"]), str(path), program, script)


def overlay_baseline_metrics(spec: TaskSpec) -> list[str]:
    """The metrics of ``spec.baseline`` that our overlay added (``mlgym_overlay.BASELINE_METRICS``) to what the
    task file of an MLGym checkout records; [] for a task elsewhere."""
    if not spec.source or checkout_of(spec.source) is None or not spec.baseline:
        return []
    try:
        recorded = read_yaml(Path(spec.source)).get("baseline_scores") or [{}]
        own = set(recorded[0]) if isinstance(recorded[0], dict) else set()
    except Exception:  # noqa: BLE001 - a file that changed since it was loaded: nothing to tell apart
        return []
    return [metric for metric in spec.baseline if metric not in own]


def checkout_headers(root: Path, *, warn: bool = True) -> list[tuple[Path, dict[str, Any]]]:
    """``(path, header)`` of every readable task file of the checkout, by file name; an unreadable one is skipped
    (with a warning naming it when ``warn``)."""
    headers = []
    for path in sorted((root / "configs" / "tasks").glob("*.yaml")):
        try:
            headers.append((path, task_header(path)))
        except Exception as exc:  # noqa: BLE001 - one unreadable file must not hide the others
            if warn:
                warnings.warn(f"skipping MLGym task file {str(path)!r}: {exc}", RuntimeWarning, stacklevel=3)
    return headers


def task_names(headers: list[tuple[Path, dict[str, Any]]]) -> dict[Path, str | None]:
    """The registered name of each task file (without the namespace): its ``id``, for the first file declaring it;
    for a later one its file's stem, unless a task of the checkout has that id (then None: it is reached by path).
    Each later file is warned about with a ``DuplicateTaskIdWarning``."""
    first: dict[str, Path] = {}
    for path, data in headers:
        first.setdefault(str(data["id"]), path)
    names: dict[Path, str | None] = {}
    for path, data in headers:
        task_id = str(data["id"])
        if first[task_id] == path:
            names[path] = task_id
            continue
        names[path] = path.stem if path.stem not in first else None
        warnings.warn(DuplicateTaskIdWarning(duplicate_message(path, first[task_id], task_id, names[path])),
                      stacklevel=3)
    return names


def duplicate_message(path: Path, first: Path, task_id: str, name: str | None) -> str:
    """The warning for the task file ``path``, which declares the id ``task_id`` of the earlier file ``first``."""
    if name is not None:
        how = f"it is registered as {NAMESPACE}{name} (its file's name)"
    else:
        how = f"{NAMESPACE}{path.stem} (its file's name) is another task's id, so it has no name of its own"
    return (f"MLGym task files {first.name} and {path.name} in {str(path.parent)!r} both declare id {task_id!r}: "
            f"{NAMESPACE}{task_id} is {first.name}'s; {how}. Both are reachable by their paths "
            f"(registry.make({str(path)!r}), `mlgym-registry run {path}`)")


@hookimpl
def register_tasks(register):
    root = find_checkout()
    if root is None:
        return
    headers = checkout_headers(root)
    names = task_names(headers)
    sharing: dict[str, list[str]] = {}
    for path, data in headers:
        sharing.setdefault(str(data["id"]), []).append(path.name)
    for path, data in headers:
        name = names[path]
        if name is None:
            continue
        task_id = str(data["id"])
        description = str(data.get("name") or task_id).strip().splitlines()[0]
        meta: dict[str, Any] = {}
        if len(sharing[task_id]) > 1:  # shown by `info`: which file this name reads, and which others share its id
            meta = {"task_file": str(path), "id_also_declared_by": [n for n in sharing[task_id] if n != path.name]}
        if name != task_id:
            description += f" (the variant in {path.name}, which declares id {task_id!r})"
        register(NAMESPACE + name, functools.partial(load_mlgym_task, str(path), str(root)), description=description,
                 **meta)
