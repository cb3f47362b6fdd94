"""After ``prepare`` installs a task's packages: import each of them with the environment's interpreter, so that a
package that installs but cannot be imported (a torchvision built for another torch: "operator torchvision::nms does
not exist") fails ``prepare`` loudly, instead of the task's first evaluation."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ..errors import PrepareFailed
from .task_packages import requirement_name

IMPORT_TIMEOUT_S = 600
"""How long the import of every package may take (torch and its kin take seconds each on a slow disk)."""

_PROBE = r"""
import importlib, json, sys, traceback
from importlib import metadata

def modules(name):
    # the top-level modules a distribution installs: its top_level.txt, else the folders and modules of its files
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return []
    listed = (dist.read_text("top_level.txt") or "").split()
    if not listed:
        tops = set()
        for file in dist.files or ():
            parts = file.parts
            if len(parts) > 1 and parts[1] == "__init__.py" or len(parts) == 1 and parts[0].endswith(".py"):
                tops.add(parts[0].removesuffix(".py"))
        listed = sorted(tops)
    wanted = name.lower().replace("-", "_").replace(".", "_")
    for module in listed:
        if module.lower() == wanted:
            return [module]
    public = [module for module in listed if not module.startswith("_")]
    return public[:1]

failed = {}
for name in json.loads(sys.argv[1]):
    for module in modules(name):
        try:
            importlib.import_module(module)
        except BaseException as exc:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            failed[name] = f"import {module}: {last}"
print(json.dumps(failed))
"""
"""Run by the environment's interpreter: for each distribution named in ``argv[1]`` (a JSON list), import its
top-level module (the one named like it, else its first public one); prints ``{name: "import m: Error: text"}`` for
those that fail."""


def import_failures(python: str | os.PathLike[str], requirements: Sequence[str]) -> dict[str, str]:
    """``{distribution: what its import raised}`` for each requirement whose package ``python`` cannot import."""
    names = sorted({requirement_name(text) for text in requirements})
    try:
        done = subprocess.run([os.fspath(python), "-I", "-c", _PROBE, json.dumps(names)], capture_output=True,
                              text=True, timeout=IMPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {name: f"importing took more than {IMPORT_TIMEOUT_S} s" for name in names}
    if done.returncode != 0:
        return {"(interpreter)": f"exit {done.returncode}: {done.stderr.strip()[-500:]}"}
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def check_imports(python: Path, requirements: Sequence[str], label: str) -> None:
    """``PrepareFailed`` naming every package of ``requirements`` that ``python`` installed but cannot import."""
    failed = import_failures(python, requirements)
    if failed:
        raise PrepareFailed(
            f"{label}: pip installed {', '.join(requirements)}, but the environment cannot import "
            + "; ".join(f"{name} ({error})" for name, error in sorted(failed.items()))
            + ". Pin versions that work together in the task's requirements (for torchvision on a CPU-only machine, "
            "see docs/tasks.md: a torchvision built for the torch it is installed beside)."
        )
