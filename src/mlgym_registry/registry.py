"""The registry: names of tasks and components, resolved into specs and built into envs.

Nothing here imports torch, torchrl or tensordict: listing and resolving names stays fast. Only ``make`` reaches for
``chain.build_env``, which does. What a registered name holds, and how its reference is imported and built, is in
``entries``.
"""

from __future__ import annotations

import copy
import inspect
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .entries import (
    ComponentImportError,
    Entry,
    build_component,
    import_entry,
    import_reference,
    is_task_file,
    provider_of,
)
from .env_hooks import factory_pickled
from .errors import DuplicateNameError, InvalidOverrideError, InvalidTaskError, MLGymRegistryError, UnknownNameError
from .kinds import COMPONENT_KINDS, KINDS, PATH_LOADERS
from .options import backend_rules, validate_overrides, validate_task_options
from .plugins import (
    BUILTIN_DISTRIBUTION,
    BuiltinNameRefused,
    PluginInfo,
    PluginLoader,
    PluginReplaceWarning,
    Registration,
)
from .specs import ComponentSpec, ResolvedTask, TaskSpec
from .trust_rules import check_task_file

SPEC_OVERRIDES = ("max_steps", "failure_reward", "score_format_exit")
"""``make`` keywords that change the task spec itself (besides the component names)."""


class Registry:
    """Named tasks and components of seven kinds: task, backend, parser, template, reward, isolator and history
    (processor).

    Plugins load on first use. ``make`` resolves a task name plus overrides into a built TorchRL env.
    """

    def __init__(self, *, load_plugins: bool = True):
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        self._load_plugins = load_plugins
        self._loader: PluginLoader | None = None
        self._loaded = False
        self._lock = threading.RLock()

    # -- pickling ------------------------------------------------------------------------------------------------
    def __reduce__(self) -> Any:
        # ``functools.partial(registry.make, ...)`` and lambdas over it travel to worker processes (TorchRL's
        # ParallelEnv, collectors): the process-wide registry goes as a reference to the worker's own, which loads
        # the plugins from the entry points; another registry goes with its registrations, its plugins reloaded
        factory_pickled()  # whoever takes an env factory to another process may want to know (env_hooks)
        if self is registry:
            return (_process_registry, ())
        return (_registry_from_state, (self._load_plugins, self._entries))

    # -- loading -------------------------------------------------------------------------------------------------
    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            # another thread that got here first has finished loading by now; ``_loader`` set but not ``_loaded``
            # is this thread, re-entering from a plugin it is loading
            if self._loaded or self._loader is not None:
                return
            loader = PluginLoader(self._store_all, self._refuse_builtin_names)
            self._loader = loader
            if self._load_plugins:
                try:
                    loader.load_all()
                except BaseException:
                    # strict mode: forget what loaded before the failure too, so that the next call starts afresh
                    # instead of finding the built-ins already there (a false DuplicateNameError)
                    self._entries = {kind: {} for kind in KINDS}
                    self._loader = None
                    raise
            # only now: a thread that saw the loader set but the plugins not yet loaded would find no backend
            self._loaded = True

    def reload(self) -> None:
        """Forget every plugin registration and load the plugins again (after installing one, or changing env vars)."""
        with self._lock:
            self._entries = {kind: {} for kind in KINDS}
            self._loader, self._loaded = None, False
        self._ensure_loaded()

    def _store(self, reg: Registration) -> None:
        self._check_kind(reg.kind)
        entries = self._entries[reg.kind]
        existing = entries.get(reg.name)
        if existing is not None and not reg.meta.get("replace"):
            raise DuplicateNameError(reg.kind, reg.name, provider_of(existing), provider_of(reg))
        if existing is not None:
            reg.meta.setdefault("replaces", provider_of(existing))
        entries[reg.name] = Entry(reg.kind, reg.name, reg.obj, reg.plugin, reg.distribution, dict(reg.meta))

    def _store_all(self, registrations: list[Registration]) -> list[str]:
        """Store one plugin's registrations, all or none (``DuplicateNameError`` stores nothing); return one line per
        name taken over with ``replace=True``, naming who replaced what."""
        seen: dict[tuple[str, str], Registration] = {}
        for reg in registrations:
            self._check_kind(reg.kind)
            existing: Entry | Registration | None = seen.get((reg.kind, reg.name)) or self._entries[reg.kind].get(
                reg.name
            )
            if existing is not None and not reg.meta.get("replace"):
                raise DuplicateNameError(reg.kind, reg.name, provider_of(existing), provider_of(reg))
            seen[(reg.kind, reg.name)] = reg
        replaced = []
        for reg in registrations:
            existing_entry = self._entries[reg.kind].get(reg.name)
            if existing_entry is not None:
                replaced.append(
                    f"{provider_of(reg)} replaces {reg.kind} {reg.name!r} of {provider_of(existing_entry)} "
                    f"(replace=True): every task that uses {reg.name!r} now gets the replacement. Block it with "
                    f"MLGYM_REGISTRY_BLOCK_PLUGINS={reg.distribution or reg.plugin} to keep the original."
                )
            self._store(reg)
        return replaced

    def _refuse_builtin_names(self, registrations: list[Registration]
                              ) -> tuple[list[Registration], list[BuiltinNameRefused]]:
        """The registrations to store, and the refusal of each that takes a built-in name without ``replace=True``
        (only that name is refused, not the plugin)."""
        kept, refused = [], []
        for reg in registrations:
            existing = self._entries.get(reg.kind, {}).get(reg.name)
            builtin = existing is not None and existing.distribution == BUILTIN_DISTRIBUTION
            if builtin and not reg.meta.get("replace") and reg.distribution != BUILTIN_DISTRIBUTION:
                refused.append(BuiltinNameRefused(reg, existing.plugin))
            else:
                kept.append(reg)
        return kept, refused

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise UnknownNameError("kind", kind, KINDS)

    # -- public API ----------------------------------------------------------------------------------------------
    def register(self, kind: str, name: str, obj_or_ref: Any, *, replace: bool = False, **meta: Any) -> None:
        """Register ``obj_or_ref`` (an object or a lazy ``"module:attr"``) as ``name`` of ``kind`` in this process.

        A call here is the user's own decision: a name that is taken already (a built-in, a plugin's, an earlier
        ``register``) is replaced, with a ``PluginReplaceWarning`` naming both unless ``replace=True`` says it is
        meant, so that a name the package adds later never breaks a script. Clashes between installed plugins keep
        their rules (``DuplicateNameError``, or ``replace=True`` in the plugin).
        """
        self._ensure_loaded()
        self._check_kind(kind)
        existing = self._entries[kind].get(name)
        if existing is not None and not replace:
            warnings.warn(PluginReplaceWarning(
                f"register() replaces {kind} {name!r} of {provider_of(existing)} with the one registered in this "
                f"process: every task that uses {name!r} now gets yours. Pass replace=True to say so (and silence "
                "this warning), or register under another name to keep both."), stacklevel=2)
        meta = {**meta, "replace": True}
        self._store(Registration(kind, name, obj_or_ref, meta, plugin="<register()>", distribution=None))

    def unregister(self, kind: str, name: str) -> None:
        """Remove ``name`` of ``kind`` (tests use this to clean up after ``register``)."""
        self._ensure_loaded()
        self._check_kind(kind)
        self._entries[kind].pop(name, None)

    def add_plugin(self, plugin: object, name: str | None = None, distribution: str | None = None) -> PluginInfo:
        """Load an in-process plugin object (a module or class with ``@hookimpl`` functions) as if it were installed."""
        self._ensure_loaded()
        assert self._loader is not None
        return self._loader.load_object(plugin, name or getattr(plugin, "__name__", repr(plugin)), distribution)

    def remove_plugin(self, name: str) -> None:
        """Undo ``add_plugin``: drop the plugin and every name it registered."""
        self._ensure_loaded()
        assert self._loader is not None
        for entries in self._entries.values():
            for key in [k for k, e in entries.items() if e.plugin == name]:
                del entries[key]
        for plugin_name, plugin in list(self._loader.pm.list_name_plugin()):
            if plugin_name.endswith(f":{name}"):
                self._loader.pm.unregister(plugin)
        self._loader.infos = [i for i in self._loader.infos if i.name != name]

    def names(self, kind: str) -> list[str]:
        """The sorted names registered for ``kind``."""
        self._ensure_loaded()
        self._check_kind(kind)
        return sorted(self._entries[kind])

    def entry(self, kind: str, name: str) -> Entry:
        """The registration behind ``name`` of ``kind``; ``UnknownNameError`` (with close matches) if there is none."""
        self._ensure_loaded()
        self._check_kind(kind)
        try:
            return self._entries[kind][name]
        except KeyError:
            raise UnknownNameError(kind, name, self._entries[kind], self._unknown_hint(kind, name)) from None

    def describe(self, kind: str | None = None) -> list[ComponentSpec]:
        """Every registration (of ``kind``, or of all kinds) as ``ComponentSpec`` rows, sorted by kind and name."""
        kinds = KINDS if kind is None else (kind,)
        return [self.entry(k, n).info() for k in kinds for n in self.names(k)]

    def get(self, kind: str, name: str) -> Any:
        """The component registered as ``name`` of ``kind``, imported and built (tasks come back as a fresh copy)."""
        entry = self.entry(kind, name)
        with self._lock:
            if not entry.is_built:
                entry.built = build_component(kind, self._load(entry))
                entry.is_built = True
        return copy.deepcopy(entry.built) if kind == "task" else entry.built

    def build(self, kind: str, name: str) -> Any:
        """A new instance of the component (classes are instantiated afresh), so each env owns its own state."""
        entry = self.entry(kind, name)
        if kind == "task":
            return self.get(kind, name)
        return build_component(kind, self._load(entry))

    def _load(self, entry: Entry) -> Any:
        """The registered object, importing a lazy reference the first time."""
        with self._lock:
            if not entry.is_loaded:
                target = entry.target
                if isinstance(target, str) and not (entry.kind == "task" and is_task_file(target)):
                    target = import_entry(entry)
                entry.loaded, entry.is_loaded = target, True
        return entry.loaded

    def spec(self, name: str | Path | TaskSpec | dict[str, Any]) -> TaskSpec:
        """The ``TaskSpec`` of a task, with lazy references to its components filled in ``components``.

        ``name`` may also be a ``TaskSpec`` or its ``to_dict()`` (that is how a worker rebuilds an env from a spec),
        or the path of a task YAML file that is not a registered name (``check``, ``run``, ``info`` and ``bench``
        take one).
        """
        if isinstance(name, TaskSpec):
            spec = copy.deepcopy(name)
        elif isinstance(name, dict):
            spec = TaskSpec.from_dict(name)
        elif self._names_a_path(name):
            spec = self._spec_from_path(name)
        else:
            spec = self.get("task", name)
            spec.registered_as = name
        return self._with_component_refs(spec)

    def _names_a_path(self, name: Any) -> bool:
        """True when ``name`` is a path rather than a task name: a ``Path``, or a string that is no registered task and
        ends in ``.yaml``/``.yml``, starts like a path (``./``, ``../``, ``/``, ``~``) or names something on disk."""
        if isinstance(name, os.PathLike):
            return True
        if not isinstance(name, str):
            return False
        self._ensure_loaded()
        if name in self._entries["task"]:
            return False
        return is_task_file(name) or name.startswith(("./", "../", "/", "~")) or Path(name).exists()

    def _spec_from_path(self, name: str | os.PathLike[str]) -> TaskSpec:
        """The spec of a task file given by path (a ``Path`` naming a registered task is that task);
        ``InvalidTaskError`` naming the path when it is no file."""
        text = os.path.expanduser(os.fspath(name))
        if text in self._entries["task"]:
            spec = self.get("task", text)
        elif Path(text).is_file():
            spec = import_reference(PATH_LOADERS["task"])(text)  # MLGym's way in an MLGym checkout, ours elsewhere
        else:
            what = "is a folder, not a task file" if Path(text).is_dir() else "does not exist"
            where = "" if os.path.isabs(text) else f" (relative paths are read from {os.getcwd()})"
            raise InvalidTaskError(
                f"task file {text!r} {what}{where}: give the path of a task YAML file, or a registered task name "
                "(`mlgym-registry list --kind task`)")
        spec.registered_as = text
        return spec

    def _with_component_refs(self, spec: TaskSpec) -> TaskSpec:
        self._ensure_loaded()
        refs = dict(spec.components)
        for kind in COMPONENT_KINDS:
            name = getattr(spec, kind)
            entry = self._entries[kind].get(name)
            ref = entry.ref if entry is not None else None
            if ref is not None:
                refs[kind] = ref
        spec.components = refs
        return spec

    def component(self, spec: TaskSpec, kind: str) -> Any:
        """The component ``spec`` names for ``kind``; falls back to ``spec.components`` refs in a fresh worker."""
        name = getattr(spec, kind)
        self._ensure_loaded()
        if name not in self._entries[kind] and kind in PATH_LOADERS and is_task_file(name) and Path(name).is_file():
            return import_reference(PATH_LOADERS[kind])(name)
        if name in self._entries[kind] or kind not in spec.components:
            return self.build(kind, name)
        return build_component(kind, import_reference(spec.components[kind]))

    def resolve(self, name: str | TaskSpec | dict[str, Any], **overrides: Any) -> tuple[ResolvedTask, dict[str, Any]]:
        """Resolve a task and ``make`` overrides into a ``ResolvedTask`` and the remaining chain options.

        The task's ``max_steps``, ``training_timeout`` and backend options (the spec's merged with the overrides) are
        checked here, before any component but the backend's factory is loaded, and no backend is made.
        """
        from .transforms.chain import CHAIN_OPTIONS

        spec = self.spec(name)
        changes = {k: overrides.pop(k) for k in list(overrides) if k in COMPONENT_KINDS + SPEC_OVERRIDES}
        if changes:
            spec = self._with_component_refs(spec.replace(**{**changes, "components": {}}))
        backend_factory = self._task_component(spec, "backend")
        backend_options = {**spec.backend_options, **overrides.pop("backend_options", {})}
        accepted = backend_option_names(backend_factory)
        chain_options = {k: overrides.pop(k) for k in list(overrides) if k in CHAIN_OPTIONS}
        if accepted is None:
            backend_options.update(overrides)
        else:
            unknown = set(overrides) - accepted
            if unknown:
                valid = set(CHAIN_OPTIONS) | set(COMPONENT_KINDS) | set(SPEC_OVERRIDES) | accepted | {"backend_options"}
                raise InvalidOverrideError(unknown, valid)
            backend_options.update(overrides)
        # what the task file chose of its backend and options is held until the user passes it again (trust_rules)
        spec = check_task_file(spec, backend_options, backend_factory, backend_given="backend" in changes)
        validate_task_options(spec, backend_options, accepted, backend_rules(backend_factory))
        refuse_metric_mismatch(spec)
        check_available = getattr(backend_factory, "check_available", None)
        if callable(check_available):  # a backend that cannot run on this machine says so now, not at reset
            check_available(**backend_options)
        check_task = getattr(backend_factory, "check_task", None)
        if callable(check_task):  # so can one that cannot serve this task (its data or packages are missing)
            check_task(spec, **backend_options)
        components = {kind: self._task_component(spec, kind) for kind in COMPONENT_KINDS if kind != "backend"}
        found = {kind: self.origin(kind, str(getattr(spec, kind))) for kind in COMPONENT_KINDS}
        origins = {kind: where for kind, where in found.items() if where is not None}
        resolved = ResolvedTask(spec=spec, backend_factory=backend_factory, backend_options=backend_options,
                                origins=origins, **components)
        return resolved, chain_options

    def origin(self, kind: str, name: str) -> str | None:
        """Where the component ``name`` of ``kind`` came from, as error messages say it: its distribution (or
        plugin), or that it was registered in this process; None for a name not registered here (a template given
        by path, a reference only a worker's spec holds)."""
        try:
            entry = self.entry(kind, name).info()
        except Exception:  # noqa: BLE001 - not registered here: messages describe it by its reference
            return None
        if entry.distribution:
            suffix = ", built in" if entry.distribution == BUILTIN_DISTRIBUTION else ""
            return f"from {entry.distribution}{suffix}"
        if entry.plugin and entry.plugin != "<register()>":
            return f"from plugin {entry.plugin!r}, no distribution"
        return "registered in this process by registry.register(), no distribution"

    def _task_component(self, spec: TaskSpec, kind: str) -> Any:
        """``component(spec, kind)``; an unknown name says which task names it, and where to fix it."""
        try:
            return self.component(spec, kind)
        except UnknownNameError as exc:
            if exc.kind != kind or exc.name != getattr(spec, kind):
                raise
            named = spec.registered_as or spec.id
            where = f" ({spec.source})" if spec.source and spec.source != str(Path(named).resolve()) else ""
            hint = (f"Task {named!r}{where} names {kind} {exc.name!r}: fix its '{kind}:' "
                    f"field or the {kind}= override, or install the plugin that registers it.")
            raise UnknownNameError(kind, exc.name, exc.known, hint) from None

    def make(
        self,
        name: str | TaskSpec | dict[str, Any] | None = None,
        *,
        tasks: Iterable[Any] | None = None,
        **overrides: Any,
    ):
        """Build the TorchRL env of a task (or of several, sampled on each reset, with ``tasks=[...]``).

        Overrides replace what the spec names (``backend=``, ``parser=``, ``template=``, ``reward=``, ``isolator=``,
        ``history=``, ``max_steps=``, ``failure_reward=``, ``score_format_exit=``), configure the chain
        (``tokenizer=``, ``chat_template_name=``, ``reward_wrong_format=``, ``device=``, ``layout=``, ``batch_size=``,
        ``input_mode=``, ``max_format_errors=``, ``max_turns=``, ``max_observation_chars=``, the context policy's
        ``max_turn_tokens=``, ``max_episode_tokens=``, ``context_window=``, ``on_length=``, ``on_overflow=``; see
        ``chain.build_env``) or go to the backend (its factory's keyword arguments, or ``backend_options={...}``).
        Unknown keys raise ``InvalidOverrideError`` (``UnknownOptionError`` for a backend option the backend does
        not take); a value of the wrong type or out of range raises ``InvalidOptionError`` (a ``ValueError``) naming
        the option, its owner and its valid range (see ``options.py``). Both are raised before anything is built.
        """
        if (name is None) == (tasks is None):
            raise TypeError("make() takes a task name or tasks=[...], not both and not neither")
        names = [name] if tasks is None else list(tasks)
        if not names:
            raise TypeError("make(tasks=[...]) needs at least one task")
        from .transforms.chain import CHAIN_OPTION_RULES, build_env

        validate_overrides(overrides, CHAIN_OPTION_RULES)

        resolved: list[ResolvedTask] = []
        chain_options: dict[str, Any] = {}
        for task in names:
            item, chain_options = self.resolve(task, **copy.copy(overrides))
            resolved.append(item)
        return build_env(resolved, multi_task=tasks is not None, **chain_options)

    # -- preparing a task ----------------------------------------------------------------------------------------
    def prepare(self, task: TaskSpec | str | os.PathLike[str], *, force: bool = False, pip_args: Sequence[str] = (),
                data_dir: str | None = None, echo: Callable[[str], object] = print) -> Path:
        """Make a task ready to run offline (``preparation.prepare``: its Python environment, then its data), and
        return its interpreter. ``task`` is a registered name, a task YAML file or a ``TaskSpec`` (``spec_to_prepare``),
        named in what it prints as ``prepare_label`` says."""
        from .backends.local.data_script import run_data_script
        from .preparation import prepare

        spec = self.spec_to_prepare(task)
        return prepare(spec, run_script=run_data_script, force=force, pip_args=pip_args, data_dir=data_dir,
                       echo=echo, label=self.prepare_label(spec))

    def spec_to_prepare(self, task: TaskSpec | str | os.PathLike[str]) -> TaskSpec:
        """``task`` as ``prepare`` takes it: a ``TaskSpec`` as is, else ``spec``'s task (a registered name, or a task
        YAML file read by the task kind's path loader); a file's task is then named as the registry names it
        (``prepare_label``), not by the file."""
        if isinstance(task, TaskSpec):
            return task
        name = os.fspath(task)
        spec = self.spec(name)
        if name not in self._entries["task"]:
            spec.registered_as = None
        return spec

    def prepare_label(self, spec: TaskSpec) -> str:
        """How a user names ``spec`` to ``prepare``: the name the registry was asked for (``registered_as``), else the
        registered task (its id, or MLGym's ``mlgym/<id>``) that stands for the same requirements, else its task file,
        else its id (``preparation.virtualenvs.task_label``, which the backends' messages use)."""
        from .preparation.task_packages import task_requirements
        from .preparation.virtualenvs import task_label

        if spec.registered_as:
            return spec.registered_as
        try:
            names = set(self.names("task"))
        except MLGymRegistryError:
            names = set()
        wanted = task_requirements(spec)
        for candidate in dict.fromkeys([spec.id, spec.gym_id]):
            if candidate in names:
                try:
                    if task_requirements(self.spec(candidate)) == wanted:
                        return candidate
                except Exception:  # noqa: BLE001 - a task that fails to load is simply not this one
                    continue
        return task_label(spec)

    def plugins(self) -> list[dict[str, Any]]:
        """The loaded plugins: name, distribution, version, entry point, hooks implemented and any load error."""
        self._ensure_loaded()
        assert self._loader is not None
        return [info.to_dict() for info in self._loader.infos]

    def plugin_info(self, plugin: object) -> PluginInfo | None:
        """The ``PluginInfo`` of ``plugin`` (a module or object) when it is loaded already, e.g. from its entry
        point; None when it is not."""
        self._ensure_loaded()
        assert self._loader is not None
        name = self._loader.pm.get_name(plugin) if self._loader.pm.is_registered(plugin) else None
        return next((i for i in self._loader.infos if name == f"{i.distribution}:{i.name}"), None)

    def import_errors(self) -> list[ComponentImportError]:
        """Import every lazy ``"module:attr"`` reference a plugin registered; the ``ComponentImportError`` of each
        that fails (``mlgym-registry plugins --strict`` reports them)."""
        self._ensure_loaded()
        errors = []
        for kind in KINDS:
            for name in self.names(kind):
                entry = self._entries[kind][name]
                if isinstance(entry.target, str) and not is_task_file(entry.target):
                    try:
                        self._load(entry)
                    except ComponentImportError as exc:
                        errors.append(exc)
        return errors

    def load_errors(self) -> list[Exception]:
        """The ``PluginLoadError`` of every plugin that failed to load."""
        self._ensure_loaded()
        assert self._loader is not None
        return list(self._loader.errors)

    def _unknown_hint(self, kind: str, name: str) -> str | None:
        hints = []
        if "/" in name:
            namespace = name.split("/", 1)[0] + "/"
            if not any(n.startswith(namespace) for n in self._entries[kind]):
                hints.append(f"No plugin registered any {kind} in namespace {namespace!r}.")
        if self._loader is not None and self._loader.errors:
            failed = ", ".join(sorted({e.distribution or e.plugin for e in self._loader.errors}))
            hints.append(f"Some plugins failed to load ({failed}); see `mlgym-registry plugins`.")
        return " ".join(hints) or None


def backend_option_names(factory: Any) -> set[str] | None:
    """The keyword options a backend factory accepts (None when it takes ``**kwargs``, i.e. anything)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    names = set()
    for index, param in enumerate(signature.parameters.values()):
        if param.kind is param.VAR_KEYWORD:
            return None
        if index == 0 or param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
            continue  # the spec
        names.add(param.name)
    return names


def _process_registry() -> Registry:
    return registry


def _registry_from_state(load_plugins: bool, entries: dict[str, dict[str, Entry]]) -> Registry:
    copy_ = Registry(load_plugins=load_plugins)
    copy_._ensure_loaded()
    for kind, named in entries.items():
        for name, entry in named.items():
            copy_._entries[kind].setdefault(name, entry)
    return copy_


registry = Registry()
"""The process-wide registry every user starts from: ``from mlgym_registry import registry``."""


def refuse_metric_mismatch(spec: TaskSpec) -> None:
    """``InvalidTaskError`` when the task rewards a metric its baseline does not hold (``baseline_metric_problem``):
    known before anything runs, so ``make`` says it rather than every scored step failing."""
    from .scores import baseline_metric_problem

    problem = baseline_metric_problem(spec)
    if problem is not None:
        raise InvalidTaskError(problem)
