"""The ``mlgym-registry`` command: list, info, plugins (here) and the episode commands (run, replay, check).

Exit codes: 0 success, 1 the command ran and failed (e.g. a check did not pass), 2 bad usage, unknown name or any
other error the user can fix (printed as one ``mlgym-registry: error: ...`` line, never as a traceback; set
``MLGYM_REGISTRY_DEBUG=1`` to get the traceback instead).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .errors import MLGymRegistryError
from .kinds import KINDS
from .plugins import PluginLoadWarning, PluginReplaceWarning
from .registry import registry

EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("mlgym_registry.commands.run", "run an episode of a task with a policy and record it"),
    "replay": ("mlgym_registry.commands.replay", "replay a recorded MLGym .traj through our env and report"),
    "check": ("mlgym_registry.commands.check",
              "check a task (files, evaluator, baseline), audit its reward (--integrity), or a plugin's components "
              "(--plugin, --kind)"),
    "report": ("mlgym_registry.commands.report", "tables, ranks and AUP over recorded runs, as MLGym publishes them"),
    "bench": ("mlgym_registry.commands.bench", "play K runs of each task with a policy, in MLGym's layout (resumable)"),
    "prepare": ("mlgym_registry.commands.prepare",
                "build the Python environment (and make the data) a task needs, once; --list shows them"),
    "show": ("mlgym_registry.commands.show", "print a recorded .traj as a conversation: thoughts, actions, outputs"),
    "serve": ("mlgym_registry.commands.serve",
              "serve tasks to OpenEnv clients over WebSocket sessions (needs the openenv extra)"),
}
"""Sub-commands that live in their own modules, each with ``add_arguments(parser)`` and ``main(args) -> int``.
A module is imported only when its command is the one asked for, so ``list`` stays fast."""

USER_ERRORS = (MLGymRegistryError, ValueError, TypeError, OSError)
"""Errors shown as one ``mlgym-registry: error: ...`` line with exit status 2: this package's own, bad values, files
that cannot be read or written."""


def cmd_list(args: argparse.Namespace) -> int:
    """Print every registered name (of one kind with ``--kind``): name, kind, provider, description."""
    rows = [c.to_dict() for c in registry.describe(args.kind)]
    for row in rows:
        if row["kind"] == "task":
            _mark_integrity(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("nothing registered" + (f" of kind {args.kind!r}" if args.kind else ""))
        return 0
    widths = [max(len(str(r[k] or "")) for r in rows) for k in ("name", "kind", "distribution")]
    for row in rows:
        name, kind, dist = (str(row[k] or "") for k in ("name", "kind", "distribution"))
        failed = " [integrity audit FAILED]" if str(row.get("integrity", "")).startswith("FAILED") else ""
        line = f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {dist:<{widths[2]}}  {row['description']}{failed}"
        print(line.rstrip())
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Print a task's resolved spec and its components (or one component with ``--kind``)."""
    kind = args.kind or _component_kind(args.name)
    if kind != "task":
        print(_dump(registry.entry(kind, args.name).info().to_dict(), args.json))
        return 0
    spec = registry.spec(args.name)
    if args.name in registry.names("task"):
        registration = registry.entry("task", args.name).info().to_dict()  # the task's own distribution and plugin
    else:  # a task YAML file given by its path
        registration = {"name": args.name, "kind": "task", "source": spec.source or args.name}
    components = {kind: registry.entry(kind, getattr(spec, kind)).info().to_dict() for kind in spec.components}
    from .integrity.report import card_summary, integrity_status

    card = card_summary(spec)
    print(_dump({"task": spec.to_dict(), "registration": registration, "components": components,
                 "integrity": integrity_status(spec), **({"integrity_card": card} if card else {})}, args.json))
    return 0


def _mark_integrity(row: dict) -> None:
    """Add the task's last integrity audit to its ``list`` row, when there is one for the task as it is now."""
    from .integrity.report import has_result, integrity_status

    if has_result(row["name"]):
        try:
            row["integrity"] = integrity_status(registry.spec(row["name"]))
        except Exception:  # noqa: BLE001 - a task that cannot load is listed as it is; `info` shows its error
            pass


def _component_kind(name: str) -> str:
    """The kind ``info NAME`` shows without ``--kind``: a task when NAME is one (or a task file), else the one kind of
    component registered under NAME; several kinds are a usage error naming the ``--kind`` to pick."""
    if name in registry.names("task") or name.endswith((".yaml", ".yml")):
        return "task"
    kinds = [kind for kind in KINDS if kind != "task" and name in registry.names(kind)]
    if len(kinds) > 1:
        raise MLGymRegistryError(f"{name!r} is a {' and a '.join(kinds)}; pick one with "
                                 + " or ".join(f"`info {name} --kind {kind}`" for kind in kinds))
    return kinds[0] if kinds else "task"  # unknown: the task lookup's error has the did-you-mean


def cmd_plugins(args: argparse.Namespace) -> int:
    """Print the loaded plugins, the hooks each implements, the names each replaced and any load error.

    With ``--strict``, also import every lazy ``"module:attr"`` reference the plugins registered, and exit 1 when a
    plugin failed to load or such a reference cannot be imported.
    """
    plugins = registry.plugins()
    import_errors = registry.import_errors() if args.strict else []
    for plugin in plugins:
        plugin["import_errors"] = [
            str(e) for e in import_errors
            if (e.distribution, e.plugin) == (plugin["distribution"], plugin["name"])
        ]
    if args.json:
        print(json.dumps(plugins, indent=2))
    else:
        for plugin in plugins:
            origin = plugin["distribution"] or "-"
            if plugin["version"]:
                origin += f" {plugin['version']}"
            status = f"ERROR: {plugin['error']}" if plugin["error"] else ", ".join(plugin["hooks"])
            print(f"{plugin['name']}  [{origin}]  {status}")
            for line in plugin["replaces"]:
                print(f"  replaces: {line}")
            for line in plugin["import_errors"]:
                print(f"  ERROR: {line}")
    failed = any(p["error"] for p in plugins) or bool(import_errors)
    return 1 if failed and args.strict else 0


def _dump(data: dict[str, Any], as_json: bool) -> str:
    """``data`` as JSON, or as text: ``key: value`` for a scalar, ``key:`` then indented ``sub_key: value`` lines for
    a dict; empty values are left out."""
    if as_json:
        return json.dumps(data, indent=2)
    lines = []
    for key, value in data.items():
        if not isinstance(value, dict):
            if not _is_empty(value):
                lines.append(f"{key}: {_one_line(value)}")
            continue
        shown = [(sub_key, sub_value) for sub_key, sub_value in value.items() if not _is_empty(sub_value)]
        if shown:
            lines.append(f"{key}:")
            lines.extend(f"  {sub_key}: {_one_line(sub_value)}" for sub_key, sub_value in shown)
    return "\n".join(lines)


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict)) and not value)


def _one_line(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if "\n" in text:
        text = text.strip().splitlines()[0] + " ..."
    return text


def _load_plugins_and_warn() -> None:
    """Load the plugins, printing one ``mlgym-registry: warning: ...`` line per plugin that failed to load (and per
    other warning while loading) instead of Python's warning with its source location; the names taken over with
    ``replace=True`` are shown by ``plugins`` and ``info`` rather than on every command."""
    from .terminal import printable

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", PluginLoadWarning)  # printed below from the errors themselves
        registry.load_errors()
    lines = [str(error) for error in registry.load_errors()]
    lines += [str(w.message) for w in caught if not issubclass(w.category, PluginReplaceWarning)]
    for line in lines:
        print(f"mlgym-registry: warning: {printable(' '.join(line.split()))}", file=sys.stderr)


def _version() -> str:
    """The installed distribution's version (the package's own when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("mlgym-registry")
    except metadata.PackageNotFoundError:
        from ._version import __version__

        return __version__


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``mlgym-registry`` (``command``: the extra command whose module to import)."""
    parser = argparse.ArgumentParser(
        prog="mlgym-registry",
        description="Turn task names into ready-to-train environments for LLM agents: list and inspect tasks and "
                    "components, prepare, check, run, replay, bench and report.",
        epilog="Run `mlgym-registry COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"mlgym-registry {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    p = sub.add_parser("list", help="list registered tasks and components")
    p.add_argument("--kind", choices=KINDS, help="only this kind")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="show a task's resolved spec and components")
    p.add_argument("name")
    p.add_argument("--kind", choices=KINDS, help="look NAME up as this kind (default: task)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("plugins", help="show loaded plugins, their hooks and load errors")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when any plugin failed to load")
    p.set_defaults(func=cmd_plugins)

    for name, (module_name, help_text) in EXTRA_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(func=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mlgym-registry`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        _load_plugins_and_warn()
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("mlgym-registry: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a command gave up with a message
            return usage_error(exc.code)
        raise
    except USER_ERRORS as exc:
        if os.environ.get("MLGYM_REGISTRY_DEBUG"):
            raise
        return usage_error(str(exc) or type(exc).__name__)


def usage_error(message: str) -> int:
    """Print ``mlgym-registry: error: MESSAGE`` (control characters escaped) to stderr, as argparse does; return 2."""
    from .terminal import printable

    print(f"mlgym-registry: error: {printable(message)}", file=sys.stderr)
    return 2


def console_main() -> None:
    """The console script: ``main()``, then exit without tearing the interpreter down.

    Once a command has imported torch, TorchRL and transformers, the interpreter's own teardown (freeing every module,
    collecting every object) takes about a second, after all the work is done. The exit handlers still run (they
    close envs and sandboxes, stop worker processes and delete temporary folders) and the output is flushed; then
    the process ends at once. ``main()`` itself returns normally, for callers in Python.
    """
    import atexit

    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    console_main()
