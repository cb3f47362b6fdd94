"""What a source the user did not write may decide: a recorded run (``records.trust``) or a task file.

Both may come from anywhere (a downloaded ``.traj``, a task folder, a checkout, a plugin), so both choose *what* is
run, never *how* it is confined or what it trusts. A setting such a source may not choose is *held*
(``HeldSetting``): it is not used; a held setting whose value is what would be used anyway changes nothing; any
other refuses the command before anything is built, naming the setting and the flag that passes it again, and once
the user passes it again (``-o sandbox=none``, ``registry.make(..., sandbox="none")``), the user's value is used.

A task file holds every backend option it names (``sandbox``, ``network``, ``python``, ``data_dir``,
``trust_agent_code``, ``gpus``, ``workspace_dir``, the limits, and any option this module does not know) and its
backend (``TASK_FILE_HELD_KEYS``); they are kept in the spec's ``extra[HELD_KEY]``, never in ``backend_options``,
and ``check_task_file`` applies the rule when the task is made. Its ``components`` (module references) are never
read: the registry fills them from the names. Every host path it names stays inside the task's own folder, and every
workspace path inside the workspace (``check_task_paths``).
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidTaskError, MLGymRegistryError
from .kinds import COMPONENT_KINDS, PATH_LOADERS

TASK_FILE_HELD_KEYS = ("backend_options", "backend")
"""A task file's keys that are held: confinement and trust are the user's to choose."""
TASK_FILE_UNREAD_KEYS = ("components", "registered_as")
"""A task file's keys that are never read from it (the registry fills them)."""
HELD_KEY = "held_by_task_file"
"""The spec's ``extra`` entry holding what its task file chose of ``TASK_FILE_HELD_KEYS``."""
DEFAULT_BACKEND = "local"
"""The backend a task runs on unless the user chooses another."""

HOST_PATH_FIELDS = ("starter_code", "sample_submission", "requirements_path", "memory_path", "aliases_file")
"""A task file's fields that name host files, relative to the task's root: each must stay inside it."""
WORKSPACE_PATH_FIELDS = ("baseline_paths", "evaluation_paths", "protected_files", "secret_files")
"""A task file's fields that name paths in the agent's workspace: each must stay inside it."""
MISSING = object()
"""What ``value_here`` answers when nothing is known of the value a setting would have."""


class HeldSettingsRefused(MLGymRegistryError, ValueError):
    """A source the user did not write chooses settings it may not choose, and the user did not pass them again."""


class TaskFileSettingsRefused(HeldSettingsRefused):
    """A task file chooses its confinement (a backend option, the backend), and the user did not pass it again."""


class TaskPathRefused(InvalidTaskError):
    """A task file names a path outside the task's own folder (or outside the agent's workspace)."""


@dataclass(frozen=True)
class HeldSetting:
    """A setting that is not taken from its source: ``kind`` is ``"option"`` (a backend option), ``"backend"``,
    ``"component"``, ``"task"``, ``"seed"`` or ``"max_steps"``; ``why`` says why a non-option is held."""

    kind: str
    name: str
    value: Any
    why: str = ""

    @property
    def flag(self) -> str:
        """The command-line flag that passes this setting again (``-o sandbox=none``, ``--backend NAME``)."""
        if self.kind == "option":
            return "-o " + shlex.quote(f"{self.name}={option_text(self.value)}")
        if self.kind == "component":
            return f"--{self.name} NAME"
        if self.kind == "seed":
            return "--seed N"
        if self.kind == "max_steps":
            return "--max-steps N"
        if self.kind == "backend":
            return f"--backend {shlex.quote(str(self.value))}"
        return "--task NAME"


def option_text(value: Any) -> str:
    """``value`` as ``-o KEY=TEXT`` reads it back (``backend_options``): text that does not parse as JSON as it is,
    anything else as JSON."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value)


def setting_line(setting: HeldSetting, here: Any) -> str:
    """One line of a refusal: the setting, its value, the value used here (``MISSING``: unset) and its flag."""
    now = "unset" if here is MISSING else repr(here)
    why = f", {setting.why}" if setting.why else ""
    return f"  {setting.name} = {setting.value!r} (here: {now}{why}): {setting.flag}"


# -- task files: settings ----------------------------------------------------------------------------------------
def held_back(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A task file's mapping as a spec may take it: its ``TASK_FILE_HELD_KEYS`` moved into ``extra[HELD_KEY]`` (the
    default backend is no choice and is dropped), its ``TASK_FILE_UNREAD_KEYS`` left out, and a ``HELD_KEY`` of its
    own (at the top or in its ``extra``) replaced. ``where`` names the file in errors."""
    taken = {key: value for key, value in data.items()
             if key not in (*TASK_FILE_HELD_KEYS, *TASK_FILE_UNREAD_KEYS, HELD_KEY)}
    if isinstance(taken.get("extra"), Mapping):
        taken["extra"] = {key: value for key, value in taken["extra"].items() if key != HELD_KEY}
    held: dict[str, Any] = {}
    options = data.get("backend_options")
    if options:
        if not isinstance(options, Mapping):
            raise InvalidTaskError(f"task file {where!r}: backend_options must be a mapping of option names to values, "
                                   f"got {type(options).__name__}")
        held["backend_options"] = {str(key): value for key, value in options.items()}
    if data.get("backend") not in (None, DEFAULT_BACKEND):
        held["backend"] = data["backend"]
    if held:
        taken["extra"] = {**(taken.get("extra") or {}), HELD_KEY: held}
    return taken


def held_settings(extra: Mapping[str, Any]) -> list[HeldSetting]:
    """The settings a spec's task file chose and that are held (``held_back``), from the spec's ``extra``."""
    held = extra.get(HELD_KEY) or {}
    if not isinstance(held, Mapping):
        return []
    settings = [HeldSetting("option", name, value) for name, value in (held.get("backend_options") or {}).items()]
    if held.get("backend") is not None:
        settings.append(HeldSetting("backend", "backend", held["backend"]))
    return settings


def backend_default(factory: Any, name: str) -> Any:
    """The default of the backend option ``name`` (a keyword of the backend's factory); ``MISSING`` when it has none
    or cannot be read."""
    try:
        parameter = inspect.signature(factory).parameters.get(name)
    except (TypeError, ValueError):  # no signature to read
        return MISSING
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return MISSING
    return parameter.default


def refused_task_settings(held: Iterable[HeldSetting], options: Mapping[str, Any], backend: str,
                          backend_factory: Any, backend_given: bool) -> list[tuple[HeldSetting, Any]]:
    """The held settings of a task file that the user does not pass again and that differ from what would be used:
    ``(setting, the value used here, or MISSING)`` pairs. ``options`` are the backend options the user gave (the
    spec's and ``make``'s), ``backend`` the backend the task is made on, ``backend_given`` whether the user chose it."""
    found = []
    for setting in held:
        if setting.kind == "option":
            if setting.name in options:
                continue
            here = backend_default(backend_factory, setting.name)
        else:
            if backend_given:
                continue
            here = backend
        if here is MISSING or here != setting.value:
            found.append((setting, here))
    return found


def task_file_refusal(source: str, refused: list[tuple[HeldSetting, Any]]) -> str:
    """The error naming each refused setting of the task file ``source``, its value here and the flag that passes it
    again."""
    lines = [f"the task file {source} chooses settings that a task file may not choose (a task chooses what is run; "
             f"its confinement and trust are yours to choose), so nothing was made. Check each and pass it again to "
             f"use it, on the command line as shown or as registry.make(..., KEY=VALUE) (backend=NAME):"]
    return "\n".join([*lines, *(setting_line(setting, here) for setting, here in refused)])


def check_task_file(spec: Any, options: Mapping[str, Any], backend_factory: Any, *, backend_given: bool) -> Any:
    """``spec`` (a ``TaskSpec``) without what its task file held, once the rule allows it; raise
    ``TaskFileSettingsRefused`` when a held setting is neither passed again nor what would be used anyway."""
    held = held_settings(spec.extra)
    if HELD_KEY not in spec.extra:
        return spec
    refused = refused_task_settings(held, options, spec.backend, backend_factory, backend_given)
    if refused:
        raise TaskFileSettingsRefused(task_file_refusal(spec.source or spec.registered_as or spec.id, refused))
    return spec.replace(extra={key: value for key, value in spec.extra.items() if key != HELD_KEY})


# -- task files: paths -------------------------------------------------------------------------------------------
def inside(base: Path, path: Path) -> bool:
    """True when ``path``, with every link in it followed, lies in the folder ``base`` (links followed too)."""
    return path.resolve().is_relative_to(base.resolve())


def path_refusal(where: str, key: str, value: Any, root: Path, hint: str = "") -> TaskPathRefused:
    """The error for the task file ``where`` whose ``key`` names ``value``, a path out of ``root``."""
    return TaskPathRefused(
        f"task file {where!r}: {key} {str(value)!r} leads out of the task's folder {str(root)!r} (an absolute path, a "
        f"'..' climb or a link out of it). A task's files must lie in its own folder: move them there{hint}")


def check_host_path(where: str, key: str, value: Any, root: Path, hint: str = "") -> None:
    """Refuse ``value`` (a path relative to ``root``, or absolute) unless it lies inside ``root``."""
    if value is None or str(value) == "":
        return
    if not inside(root, root / str(value)):
        raise path_refusal(where, key, value, root, hint)


def check_workspace_path(where: str, key: str, value: Any, place: str = "the agent's workspace") -> None:
    """Refuse ``value`` unless it is a relative path with no ``..`` (it names a path in ``place``)."""
    path = Path(str(value))
    if path.is_absolute() or ".." in path.parts:
        raise TaskPathRefused(f"task file {where!r}: {key} {str(value)!r} is not a path inside {place} (it is "
                              f"absolute or climbs with '..'); name it relative to {place}")


DATA_HINT = ", or give your data folder as the backend's data_dir (-o data_dir=DIR)"


def check_task_paths(spec: Any, where: str, root: Path) -> None:
    """Refuse a spec (a ``TaskSpec`` just read from the task file ``where``) that names a host path outside ``root``
    (the task's own folder) or a workspace path outside the workspace (``TaskPathRefused``, naming the key)."""
    for key in HOST_PATH_FIELDS:
        value = getattr(spec, key)
        for item in value if isinstance(value, list) else [value]:
            check_host_path(where, key, item, root)
    for key in WORKSPACE_PATH_FIELDS:
        for item in getattr(spec, key):
            check_workspace_path(where, key, item)
    for index, dataset in enumerate(spec.datasets):
        if isinstance(dataset, Mapping) and dataset.get("is_local"):
            check_host_path(where, f"datasets[{index}].data_path", dataset.get("data_path"), root, DATA_HINT)
    for kind in COMPONENT_KINDS:  # a component named by the path of the file it is loaded from
        name = str(getattr(spec, kind))
        if kind in PATH_LOADERS and name.endswith((".yaml", ".yml")):
            check_host_path(where, kind, name, root)


def check_links(where: str, key: str, source: Path, root: str | None) -> None:
    """Refuse the task's file or folder ``source`` (named by its field ``key``) when it lies in the task's folder
    ``root`` but is, or holds, a link that leads out of it (``TaskPathRefused``). A path outside ``root`` (one the
    user or our overlay gave) is the giver's and is not checked."""
    if not root or not Path(os.path.abspath(source)).is_relative_to(os.path.abspath(root)):
        return
    base = Path(root).resolve()
    found = [] if source.resolve().is_relative_to(base) else [source]
    if not found and source.is_dir():
        for folder, dirs, files in os.walk(source):
            paths = (Path(folder) / name for name in (*dirs, *files))
            found += [path for path in paths if path.is_symlink() and not path.resolve().is_relative_to(base)]
    if found:
        shown = ", ".join(f"{str(path)!r} -> {str(path.resolve())!r}" for path in found[:3])
        raise TaskPathRefused(f"task file {where!r}: {key} {str(source)!r} is or holds a link out of the task's folder "
                              f"{root!r} ({shown}); a task's files must lie in its own folder: copy them there")
