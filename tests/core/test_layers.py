"""The package's layers, checked from its imports: a module imports only from its own layer or the layers below,
but for an arrow that runs back up listed in ``UPWARD`` with its reason (none is today; docs/concepts.md draws the
layers).

Every import counts, at the top of a module or inside a function: a lazy import still ties the two folders together.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import mlgym_registry

PACKAGE = Path(mlgym_registry.__file__).parent
NAME = "mlgym_registry"
CONCEPTS = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"
"""The page whose layer table draws ``LAYERS`` for readers."""

LAYERS: list[set[str]] = [
    # 0, the helpers every layer uses: the package's version, errors, hook specs, task specs and their submission
    # schemas, options, seeds, the machine's cores and cache folder, scores (the evaluation statuses, MLGym's table
    # of ranking metrics, its score text, the metrics' best values, the rows validate and submit score), what an
    # untrusted record or task file may decide (trust_rules), MLGym's tool language (the commands, their signatures
    # and docs) that backends, components and policies speak, and the moments an env is built or its factory
    # pickled, which the layers above hook into (env_hooks)
    {"errors", "hookspecs", "specs", "submissions", "options", "seeding", "terminal", "bounded_json", "_lazy",
     "_version", "scores", "tool_language", "kinds", "machine", "trust_rules", "best_scores", "held_out",
     "env_hooks"},
    # 1, the plugin host: what a registered name is, loading plugins
    {"entries", "plugins"},
    # 2, the plugins' kinds, and what a task needs before it runs
    {"backends", "components", "tasks", "preparation"},
    # 3, the TorchRL chain, over a backend and the components
    {"transforms"},
    # 4, the registry: names resolved into specs, built into envs (make) and made ready to run (prepare)
    {"registry"},
    # 5, what an episode leaves behind and how it is read back
    {"records"},
    # 6, the policies that answer the chain
    {"policies"},
    # 7, one episode
    {"episodes"},
    # 8, many envs at once
    {"scale"},
    # 9, TorchRL's pools, collectors and Ray collectors over the envs, and every TorchRL internal relied on
    {"interop"},
    # 10, evaluating models over suites of runs, and auditing a task's reward with canaries
    {"evaluation", "integrity"},
    # 11, the faces other libraries see, and the plugin authors' kit
    {"faces", "client", "testing"},
    # 12, the command line and the package's front door
    {"commands", "cli", "__init__"},
]
"""The units (a folder, a root module, or a module that sits below its folder), bottom up."""

UPWARD: dict[tuple[str, str], str] = {}
"""The arrows allowed to run up, each with its reason: none. At most four; an entry that no import needs is an
error."""


def unit_of(module: str) -> str:
    """The unit of a dotted module name: a listed module itself, else its first name under the package."""
    parts = module.split(".")[1:]
    for depth in range(len(parts), 0, -1):
        name = ".".join(parts[:depth])
        if any(name in layer for layer in LAYERS):
            return name
    return "__init__" if not parts else parts[0]


def layer_of(unit: str) -> int:
    for index, layer in enumerate(LAYERS):
        if unit in layer:
            return index
    raise AssertionError(f"unit {unit!r} is in no layer: add it to LAYERS in {__file__}")


def module_names() -> dict[Path, str]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        if "data" in relative.parts or "harness" in relative.parts or "tools" in relative.parts:
            continue  # task files, and what runs inside the sandbox: not the package's own imports
        parts = list(relative.parts)
        found[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return found


def imported(path: Path, module: str) -> set[str]:
    """The package's modules that ``module`` (at ``path``) imports, anywhere in it."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base) + (f".{node.module}" if node.module else "")
            else:
                target = node.module or ""
            candidates = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for name in candidates:
            if name.split(".")[0] == NAME and is_module(name):
                names.add(name)
    return names


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def arrows() -> dict[tuple[str, str], list[str]]:
    """Each (importer's unit, imported unit) pair, with the imports that make it."""
    found: dict[tuple[str, str], list[str]] = {}
    for path, module in module_names().items():
        for target in imported(path, module):
            pair = (unit_of(module), unit_of(target))
            if pair[0] != pair[1] and pair[1] != "__init__":
                found.setdefault(pair, []).append(f"{module} -> {target}")
    return found


def test_every_unit_has_a_layer():
    units = {unit for pair in arrows() for unit in pair}
    for unit in units:
        layer_of(unit)


def test_imports_run_down_the_layers_but_for_the_listed_few():
    upward = {pair: imports for pair, imports in arrows().items() if layer_of(pair[0]) < layer_of(pair[1])}
    unexpected = {pair: imports for pair, imports in upward.items() if pair not in UPWARD}
    assert not unexpected, "imports that run up the layers (move the code, or list the arrow in UPWARD with why):\n" + (
        "\n".join(f"  {a} -> {b}: {', '.join(sorted(imports))}" for (a, b), imports in sorted(unexpected.items())))
    stale = set(UPWARD) - set(upward)
    assert not stale, f"UPWARD lists arrows no import makes any more: remove {sorted(stale)}"
    assert len(UPWARD) <= 4


def test_the_layer_table_of_docs_concepts_names_the_units_of_each_layer():
    """docs/concepts.md's table has one row per layer, bottom up, and its "where" column names exactly that layer's
    units (``errors.py``, ``scale/``)."""
    rows = [line for line in CONCEPTS.read_text().splitlines() if re.match(r"\| \d+\. ", line)]
    drawn = [{name.removesuffix(".py").removesuffix("/") for name in re.findall(r"`([^`]+)`", row.rsplit("|", 2)[1])}
             for row in rows]
    assert [row.split(".", 1)[0].strip("| ") for row in rows] == [str(index) for index in range(len(LAYERS))]
    assert drawn == LAYERS


def test_no_circle_between_the_root_modules_at_import_time():
    """The modules' top-level imports form no circle (lazy imports inside functions may call back)."""
    graph: dict[str, set[str]] = {}
    for path, module in module_names().items():
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        targets = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base) + (f".{node.module}" if node.module else "")
                targets |= {name for name in (target, *(f"{target}.{a.name}" for a in node.names)) if is_module(name)}
        graph[module] = targets - {module}
    # a package's __init__ importing its own modules is not a circle with them
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for following in graph.get(node, ()):
            if following.startswith(node + "."):
                continue
            if state.get(following) == 1:
                circles.append(stack[stack.index(following):] + [following])
            elif following not in state:
                visit(following, [*stack, following])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles at import time:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_old_import_paths_of_0_1_are_gone():
    """The shims for the modules' paths before they moved into folders are gone (CHANGELOG.md): an old path is not
    found, and the only finder of the package's on ``sys.meta_path`` is Gymnasium's registration hook (run in a fresh
    interpreter)."""
    code = textwrap.dedent("""
        import importlib, importlib.util, json, sys
        import mlgym_registry
        found = {}
        for old in ("parallel", "episode", "trajectories", "ray_episodes", "gym_env", "validation", "tasks.baselines"):
            try:
                importlib.import_module("mlgym_registry." + old)
                found[old] = "imported"
            except ModuleNotFoundError as exc:
                found[old] = exc.name
        finders = [type(f).__module__ for f in sys.meta_path if type(f).__module__.startswith("mlgym_registry")]
        print(json.dumps([found, finders, importlib.util.find_spec("mlgym_registry._moved") is None]))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found, finders, no_shims = json.loads(result.stdout.splitlines()[-1])
    assert found == {"parallel": f"{NAME}.parallel", "episode": f"{NAME}.episode",
                     "trajectories": f"{NAME}.trajectories", "ray_episodes": f"{NAME}.ray_episodes",
                     "gym_env": f"{NAME}.gym_env", "validation": f"{NAME}.validation",
                     "tasks.baselines": f"{NAME}.tasks.baselines"}
    assert finders == ["mlgym_registry.faces.gymnasium_registration"] and no_shims  # Gymnasium's hook alone
