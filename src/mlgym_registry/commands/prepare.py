"""``mlgym-registry prepare TASK [TASK ...]``: make what a task needs before it runs, once.

For each task (a registered name or a task YAML file): ``mlgym_registry.prepare``, that is a Python environment with
the packages it declares (unless the interpreter running this command has them already), then its data when the task
has a recipe to make it, with the task's interpreter. Then it says what is still in the way of ``make``, every
blocker at once (packages, data, models, devices, a trust flag: the local backend's ``task_checks.blockers``, the
checks ``make`` runs), and exits 1 while any task has one.
``--list`` shows the prepared environments, their requirements and the registered tasks that use them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prepare``."""
    parser.add_argument("tasks", metavar="TASK", nargs="*", help="a registered task name or a task YAML file")
    parser.add_argument("--force", action="store_true",
                        help="build the environment (and make the data) again, even when present")
    parser.add_argument("--data-dir", metavar="DIR", help="the data folder to write a task's data to "
                        "(default: $MLGYM_REGISTRY_DATA, else ~/.cache/mlgym-registry/data)")
    parser.add_argument("--list", action="store_true",
                        help="list the prepared environments and the registered tasks that use them")


def main(args: argparse.Namespace) -> int:
    """Prepare each task, then list the environments when asked."""
    if not args.tasks and not args.list:
        raise SystemExit("prepare needs at least one TASK (a registered name or a task YAML file), or --list")
    blocked = [task for task in args.tasks if prepare_task(task, force=args.force, data_dir=args.data_dir)]
    if args.list:
        list_environments()
    return 1 if blocked else 0


def prepare_task(task: str, *, force: bool = False, data_dir: str | None = None) -> list:
    """The task's environment, then its data (when it has a recipe for it); then every blocker left, printed, and
    returned (empty when the task is ready to run)."""
    import sys

    from ..backends.local.task_checks import blockers
    from ..registry import registry

    registry.prepare(task, force=force, data_dir=data_dir)
    spec = registry.spec_to_prepare(task)
    found = blockers(spec, data_dir=data_dir)
    label = registry.prepare_label(spec)
    if not found:
        print(f"{label}: ready to run")
    for blocker in found:
        print(f"{label}: still blocked by {blocker}", file=sys.stderr)
    return found


def list_environments() -> None:
    """One block per prepared environment: its key and folder, its requirements, the registered tasks using it."""
    from ..preparation.virtualenvs import environments_folder, prepared_environments

    found = prepared_environments()
    if not found:
        print(f"no prepared environments in {environments_folder()}")
        return
    users = tasks_by_environment()
    for environment in found:
        print(f"{environment.key}  {environment.folder}")
        print(f"  requirements: {', '.join(environment.requirements)}")
        print(f"  tasks: {', '.join(users.get(environment.key, [])) or '-'}")


def tasks_by_environment(names: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Registered task names (all, or ``names``) grouped by the key of the environment their requirements call for;
    tasks that declare none, or fail to load, are left out."""
    from ..preparation.task_packages import task_requirements
    from ..preparation.virtualenvs import environment_key
    from ..registry import registry

    grouped: dict[str, list[str]] = {}
    for name in registry.names("task") if names is None else names:
        try:
            requirements = task_requirements(registry.spec(name))
        except Exception:  # noqa: BLE001 - listing must not stop at one broken task
            continue
        if requirements:
            grouped.setdefault(environment_key(requirements), []).append(name)
    return grouped
