"""What a task needs from the MLGym checkout, checked before a container starts, and the tasks this backend refuses
because MLGym cannot keep their promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import BackendUnavailable, InvalidTaskError
from ...specs import TaskSpec


def check_task_files(spec: TaskSpec, root: Path) -> None:
    """Every host file MLGym copies in at ``reset()`` exists, and the checkout at ``root`` has the dataset configs."""
    problems = []
    paths = [("starter_code", item) for item in spec.starter_code]
    if spec.sample_submission:
        paths.append(("sample_submission", spec.sample_submission))
    if not spec.use_generic_conda and spec.requirements_path:
        paths.append(("requirements_path", spec.requirements_path))
    for dataset in spec.datasets:
        if dataset.get("is_local"):
            paths.append((f"datasets[{dataset.get('name', '?')}].data_path", str(dataset.get("data_path"))))
    for field_name, item in paths:
        resolved = spec.resolve_path(item)
        if not resolved.exists():
            problems.append(f"{field_name} {item!r} (looked for {str(resolved)!r})")
    if not spec.datasets:
        for item in spec.dataset_configs:
            if not (root / "configs" / item).is_file():
                problems.append(f"dataset_configs {item!r} (not in {root / 'configs'})")
    if problems:
        raise BackendUnavailable(
            f"task {spec.id!r} cannot run on the MLGym checkout {root}: missing " + "; ".join(problems)
            + ". Use the MLGym checkout the task comes from (`pip install -e <that checkout>`), or put the "
            "task's files back."
        )


def check_entrypoint(spec: TaskSpec, root: Path, tasks_module: Any) -> None:
    """The MLGym at ``root`` (whose ``mlgym.environment.tasks`` is ``tasks_module``) has the task's class."""
    try:
        tasks_module.AbstractMLTask.get(spec.task_entrypoint)
    except (KeyError, ValueError) as exc:
        raise BackendUnavailable(
            f"task {spec.id!r} needs MLGym's task class {spec.task_entrypoint!r} (task_entrypoint), "
            f"which the MLGym at {root} does not have. Update the checkout (`git -C {root} pull`) "
            f"and reinstall it (`pip install -e {root}`)."
        ) from exc


def refuse_unprotected_files(spec: TaskSpec) -> None:
    """Raise ``InvalidTaskError`` for a task with ``secret_files`` or ``protected_files``: MLGym cannot keep them.

    What ``mlgym_source`` adds to MLGym's own task files does not count: the evaluator's modules it protects (a game's
    opponent) and the overlay's evaluator-only files (titanic's ground truth). The task file asks for neither, and
    this backend runs the task exactly as MLGym does: those files stay readable by the agent there."""
    from ...tasks import mlgym_overlay, mlgym_source

    ours = mlgym_source.TAG in spec.tags
    inferred = set(mlgym_source.evaluator_modules(spec)) if ours else set()
    overlay = set(mlgym_overlay.overlay_secret_files(spec.id)) if ours else set()
    protected = [p for p in spec.protected_files if p not in inferred]
    secret = [p for p in spec.secret_files if p not in overlay]
    fields = {name: value for name, value in (("secret_files", secret), ("protected_files", protected)) if value}
    if not fields:
        return
    named = " and ".join(f"{name}={value}" for name, value in fields.items())
    raise InvalidTaskError(
        f"task {spec.id!r} has {named}, which the mlgym backend cannot enforce: MLGym copies every starter file and "
        "dataset into the agent's workspace and runs the evaluator in the agent's own shell, so the agent could read "
        "the secret files and change the protected ones (and with them its score). Run the task on "
        "backend='local', which enforces both, or pass the backend option allow_unprotected_files=True to run it on "
        "MLGym with those files open to the agent."
    )
