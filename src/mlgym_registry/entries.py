"""Registered entries: what a plugin registered under a name, and how a lazy ``"module:attr"`` reference is imported
and built into the component the registry hands out (with an error that names the component, its distribution and
the fix when the import fails)."""

from __future__ import annotations

import difflib
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidTaskError, MLGymRegistryError
from .plugins import BUILTIN_DISTRIBUTION, Registration
from .specs import ComponentSpec, TaskSpec, load_task_yaml


@dataclass
class Entry:
    """A registered name: where it came from, and the object once imported and built."""

    kind: str
    name: str
    target: Any
    plugin: str | None = None
    distribution: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    loaded: Any = None
    is_loaded: bool = False
    built: Any = None
    is_built: bool = False

    @property
    def ref(self) -> str | None:
        """An importable ``"module:attr"`` (or task file path) for this entry, when there is one."""
        return reference_of(self.target)

    def info(self) -> ComponentSpec:
        """The public description of this entry."""
        meta = {k: v for k, v in self.meta.items() if k not in ("description", "replace")}
        return ComponentSpec(
            kind=self.kind,
            name=self.name,
            ref=self.ref,
            distribution=self.distribution,
            plugin=self.plugin,
            description=self.description(),
            meta=meta,
        )

    def description(self) -> str:
        """A one-line description: the registered one, or the first docstring line of an already-imported object."""
        text = self.meta.get("description")
        if not text and self.is_built and isinstance(self.built, TaskSpec):
            text = str(self.built.extra.get("summary") or "") or self.built.name
        if not text and self.kind == "task" and is_task_file(self.target):
            text = task_file_line(self.target)
        if not text and not isinstance(self.target, (str, Path)):
            text = inspect.getdoc(self.target) or ""
        return (text or "").strip().splitlines()[0] if text and text.strip() else ""


class ComponentImportError(MLGymRegistryError, ImportError):
    """A component registered as a lazy ``"module:attr"`` whose module cannot be imported (a syntax error, a missing
    dependency, a missing attribute); the message names the component, its distribution and the module."""

    def __init__(self, entry: Entry, cause: BaseException):
        reference = str(entry.target)
        module = reference.partition(":")[0]
        provider = provider_of(entry)
        detail = f"{type(cause).__name__}: {cause}"
        if isinstance(cause, SyntaxError) and cause.filename:
            detail = f"SyntaxError: {cause.msg} ({cause.filename}, line {cause.lineno})"
        fix = reference_fix(reference, cause)
        if fix is None:
            fix = "Fix that module"
            if entry.distribution:
                fix += f", or uninstall or block its distribution (MLGYM_REGISTRY_BLOCK_PLUGINS={entry.distribution})"
        super().__init__(
            f"cannot import {entry.kind} {entry.name!r} registered by {provider} as {reference!r}: module "
            f"{module!r} failed with {detail}. {fix}.",
            name=module,
        )
        # after ImportError.__init__, which sets ``name`` (the module, as ImportError has it) and ``path``
        self.kind, self.component = entry.kind, entry.name
        self.distribution, self.plugin = entry.distribution, entry.plugin
        self.reference, self.module, self.cause = reference, module, cause

    def __reduce__(self) -> Any:  # to a worker process and back: the message and fields, not __init__'s arguments
        return (_restore_error, (type(self), self.args, dict(self.__dict__)))


def _restore_error(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ComponentModuleNotFoundError(ComponentImportError, ModuleNotFoundError):
    """A ``ComponentImportError`` whose module (or one it imports) is not installed."""


def reference_fix(reference: str, cause: BaseException) -> str | None:
    """How to fix a lazy ``"module:attr"`` reference that names a module or attribute that does not exist (with the
    closest existing names), or None when the reference is right and the module itself failed."""
    module_name, _, attr_path = reference.partition(":")
    where = f"Fix the registration string {reference!r} in the plugin's register_* hook"
    if isinstance(cause, ModuleNotFoundError) and cause.name and (
            module_name == cause.name or module_name.startswith(cause.name + ".")):
        close = _close_modules(cause.name)
        hint = f" (did you mean {' or '.join(repr(name) for name in close)}?)" if close else ""
        return (f"{where}: no module {cause.name!r} is importable{hint}, or install the package that provides it")
    if isinstance(cause, AttributeError) and attr_path:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - then the attribute is not the problem
            return None
        first = attr_path.split(".")[0]
        if hasattr(module, first):
            return None
        close = difflib.get_close_matches(first, [n for n in dir(module) if not n.startswith("_")], n=3)
        hint = (f" (did you mean {' or '.join(repr(f'{module_name}:{name}') for name in close)}?)" if close else "")
        return f"{where}: module {module_name!r} has no attribute {first!r}{hint}"
    return None


def _close_modules(missing: str) -> list[str]:
    """Importable module names close to ``missing``: submodules of its existing parent package, or top-level
    modules."""
    import pkgutil

    parent, _, leaf = missing.rpartition(".")
    try:
        path = importlib.import_module(parent).__path__ if parent else None
    except Exception:  # noqa: BLE001 - a parent that does not import gives no candidates of its own
        return []
    names = [info.name for info in pkgutil.iter_modules(path)]
    close = difflib.get_close_matches(leaf, names, n=3)
    return [f"{parent}.{name}" if parent else name for name in close]


def reference_of(obj: Any) -> str | None:
    """``obj`` as a lazy reference string when it is one or can be imported back by name, else None."""
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, str):
        return obj
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        return f"{module}:{qualname}"
    return None


def task_line(data: dict[str, Any]) -> str:
    """A task file's one-line description from its mapping: its ``summary``, else its ``name``, else its ``id``."""
    text = str(data.get("summary") or data.get("name") or data.get("id") or "").strip()
    return text.splitlines()[0] if text else ""


def task_file_line(path: str | Path) -> str:
    """``task_line`` of the task file ``path``, read without loading the task; ``""`` when the file cannot be read
    (``info`` and ``make`` report why)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return ""
    return task_line(data) if isinstance(data, dict) else ""


def is_task_file(target: Any) -> bool:
    """True when ``target`` names a task YAML file rather than a ``module:attr`` reference."""
    return isinstance(target, Path) or (isinstance(target, str) and target.endswith((".yaml", ".yml")))


def import_reference(ref: str) -> Any:
    """Import ``"package.module:attr.sub"`` (or a bare module path) and return the object."""
    module_name, _, attr_path = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr_path.split(".")):
        obj = getattr(obj, part)
    return obj


def import_entry(entry: Entry) -> Any:
    """Import the lazy ``"module:attr"`` reference of ``entry``; ``ComponentImportError`` (naming the component, its
    distribution and the module) when the import fails."""
    try:
        return import_reference(str(entry.target))
    except ModuleNotFoundError as exc:
        raise ComponentModuleNotFoundError(entry, exc) from exc
    except Exception as exc:  # noqa: BLE001 - SyntaxError, a module raising at import, a missing attribute
        raise ComponentImportError(entry, exc) from exc


def build_component(kind: str, obj: Any) -> Any:
    """Turn what a plugin registered into the component ``get`` returns (classes and template factories are called)."""
    if kind == "backend":
        return obj
    if kind == "task":
        if isinstance(obj, TaskSpec):
            return obj
        if is_task_file(obj):
            return load_task_yaml(obj)
        if callable(obj):
            spec = obj()
            if not isinstance(spec, TaskSpec):
                raise InvalidTaskError(
                    f"task factory {reference_of(obj)!r} returned {type(spec).__name__}, not a TaskSpec"
                )
            return spec
        if isinstance(obj, dict):
            return TaskSpec.from_dict(obj)
        raise InvalidTaskError(
            f"cannot build a task from {type(obj).__name__}; register a TaskSpec, a YAML path or a factory"
        )
    if inspect.isclass(obj) or (kind == "template" and callable(obj)):
        return obj()
    return obj


def provider_of(item: Entry | Registration) -> str:
    """Who registered ``item``, as messages name it: a built-in plugin, a distribution and its plugin, or a plugin."""
    if item.distribution == BUILTIN_DISTRIBUTION:
        return f"built-in plugin {item.plugin!r}"
    if item.distribution:
        return f"distribution {item.distribution!r} (plugin {item.plugin!r})"
    return f"plugin {item.plugin!r}"
