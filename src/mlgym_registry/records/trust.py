"""What a recorded run may decide when it is played again, and what it may not.

A ``.traj``, ``results.json`` or run folder may come from anywhere, so its ``"run"`` record (``provenance``) is read
through an allow-list. It may choose *what* is played again: the task (a registered name), its parser, template,
reward, isolator and history (registered names), the seed and ``max_steps``; the actions come from the trajectory.
It never chooses *how* the replay is confined or what it trusts: the backend, every backend option (``sandbox``,
``network``, ``trust_agent_code``, ``python``, ``data_dir``, the limits, ``gpus``, and any option this module does
not know), a task or component given by file path or module reference, a value of the wrong type.

Those settings are *held*. A held setting whose value is what the command would use anyway (the command line's, the
task's, the backend's default) changes nothing. Any other held setting refuses the command before anything is built
(``RecordedSettingsRefused``), naming each setting and the flag that passes it again; once the user passes it again,
the command line's value is used. Top-level keys of the record that this module does not know are never read as
settings either: they are shown as warnings and have no effect. Task files follow the same rule
(``mlgym_registry.trust_rules``, where a held setting, its flag and its line in a refusal are defined once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MLGymRegistryError
from ..specs import COMPONENT_KINDS, TaskSpec
from ..trust_rules import MISSING, HeldSetting, HeldSettingsRefused, backend_default, setting_line

TAKEN_KEYS = ("task", "components", "seed", "max_steps")
"""The record's keys a replay may take settings from (each checked further: see ``split_record``)."""
HELD_KEYS = ("backend_options",)
"""The record's keys whose every entry is held: confinement and trust are the command line's to choose."""
INFORMATION_KEYS = ("policy", "versions", "started", "ended")
"""The record's keys that only describe the run; nothing is ever taken from them."""
TAKEN_COMPONENTS = tuple(kind for kind in COMPONENT_KINDS if kind != "backend")
"""The component kinds a record may choose, by registered name; the backend is held."""

_MISSING = MISSING


class RecordedSettingsRefused(HeldSettingsRefused):
    """A recorded run chooses settings a record may not choose, and the command line did not pass them again."""


@dataclass
class RecordSettings:
    """A record split by ``split_record``: what a replay takes (``task``, ``components``, ``seed``, ``max_steps``;
    None or empty where the record says nothing usable), what it holds, and warnings about keys it does not know."""

    task: str | None = None
    components: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    max_steps: int | None = None
    held: list[HeldSetting] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class TypedSettings:
    """What the user typed on the command line (None or empty: not typed), the values that win over a record."""

    task: str | None = None
    seed: int | None = None
    max_steps: int | None = None
    backend: str | None = None
    components: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def gives(self, setting: HeldSetting) -> bool:
        """True when the command line passes ``setting`` again (its own value then wins)."""
        if setting.kind == "option":
            return setting.name in self.options
        if setting.kind == "component":
            return setting.name in self.components
        return getattr(self, setting.kind) is not None


def split_record(record: Mapping[str, Any] | None) -> RecordSettings:
    """Split a run record into what a replay may take from it and what it holds (see the module's docstring).

    Only registered names are taken as the task and components, so a record cannot make this process load a file
    or import a module; a seed must be an integer >= 0 and ``max_steps`` one >= 1.
    """
    from ..registry import registry

    settings = RecordSettings()
    if not record:
        return settings
    for key in record:
        if key not in (*TAKEN_KEYS, *HELD_KEYS, *INFORMATION_KEYS):
            settings.warnings.append(f"the run record's {key!r} is not a setting this version takes from a record; "
                                     f"it was left out")
    task = record.get("task")
    name = task.get("name") if isinstance(task, Mapping) else None
    if name is not None:
        if isinstance(name, str) and name in registry.names("task"):
            settings.task = name
        else:
            settings.held.append(HeldSetting("task", "task", name, "not a registered task name"))
    components = record.get("components") or {}
    if not isinstance(components, Mapping):
        settings.warnings.append("the run record's 'components' is not a mapping; it was left out")
        components = {}
    for kind, item in components.items():
        chosen = item.get("name") if isinstance(item, Mapping) else None
        if chosen is None:
            continue
        if kind == "backend":
            settings.held.append(HeldSetting("backend", "backend", chosen))
        elif kind not in TAKEN_COMPONENTS:
            settings.warnings.append(f"the run record names a component of kind {kind!r}, which does not exist here; "
                                     f"it was left out")
        elif isinstance(chosen, str) and chosen in registry.names(kind):
            settings.components[kind] = chosen
        else:
            settings.held.append(HeldSetting("component", kind, chosen, f"not a registered {kind} name"))
    settings.seed = _integer(record, "seed", 0, settings.held)
    settings.max_steps = _integer(record, "max_steps", 1, settings.held)
    options = record.get("backend_options") or {}
    if isinstance(options, Mapping):
        settings.held += [HeldSetting("option", str(key), value) for key, value in options.items()]
    else:
        settings.warnings.append("the run record's 'backend_options' is not a mapping; it was left out")
    return settings


def _integer(record: Mapping[str, Any], key: str, low: int, held: list[HeldSetting]) -> int | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= low:
        return value
    held.append(HeldSetting(key, key, value, f"not an integer >= {low}"))
    return None


def current_value(setting: HeldSetting, spec: TaskSpec | None, typed: TypedSettings) -> Any:
    """What the command would use for ``setting`` without the record (``_MISSING`` when nothing is known, or when
    there is no ``spec`` yet): the task's backend option, else the backend's default; the command line's or the
    task's backend; the task's component."""
    from ..registry import registry

    if spec is None:
        return _MISSING
    if setting.kind == "backend":
        return typed.backend or spec.backend
    if setting.kind == "component":
        return typed.components.get(setting.name, getattr(spec, setting.name, _MISSING))
    if setting.kind != "option":
        return _MISSING
    if setting.name in spec.backend_options:
        return spec.backend_options[setting.name]
    backend_spec = spec if not typed.backend else registry.spec(spec.replace(backend=typed.backend, components={}))
    try:
        factory = registry.component(backend_spec, "backend")
    except (TypeError, ValueError, MLGymRegistryError):  # a backend not installed here
        return _MISSING
    return backend_default(factory, setting.name)


def refused_settings(settings: RecordSettings, spec: TaskSpec | None, typed: TypedSettings,
                     kinds: Iterable[str] | None = None) -> list[tuple[HeldSetting, Any]]:
    """The held settings (of ``kinds``, default all) that the command line does not pass again and that differ from
    what the command would use: ``(setting, the value used here, or _MISSING)`` pairs."""
    wanted = set(kinds) if kinds is not None else None
    found = []
    for setting in settings.held:
        if (wanted is not None and setting.kind not in wanted) or typed.gives(setting):
            continue
        here = current_value(setting, spec, typed)
        if here is _MISSING or here != setting.value:
            found.append((setting, here))
    return found


def refusal_message(source: str | Path, refused: list[tuple[HeldSetting, Any]]) -> str:
    """The error naming each refused setting, its value here and the flag that passes it again."""
    lines = [f"the run record of {source} chooses settings that a recorded run may not choose (it may choose the "
             f"task, components, seed and max steps; confinement and trust are yours to choose), so nothing was run. "
             f"Check each and pass it again on the command line to use it:"]
    lines += [setting_line(setting, here) for setting, here in refused]
    return "\n".join(lines)


def check_record(source: str | Path, settings: RecordSettings, spec: TaskSpec | None, typed: TypedSettings,
                 kinds: Iterable[str] | None = None) -> None:
    """Raise ``RecordedSettingsRefused`` when ``refused_settings`` finds any."""
    refused = refused_settings(settings, spec, typed, kinds)
    if refused:
        raise RecordedSettingsRefused(refusal_message(source, refused))


def read_record(path: str | Path) -> RecordSettings | None:
    """``split_record`` of the run record of ``path`` (a ``.traj``, or the ``results.json`` beside it or given);
    None when there is no record (MLGym's own runs, or ours from before records)."""
    from .provenance import recorded_run

    record = recorded_run(path)
    return None if record is None else split_record(record)
