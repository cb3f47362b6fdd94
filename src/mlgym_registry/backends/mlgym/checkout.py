"""The MLGym checkout the installed ``mlgym`` package comes from: finding it, importing from it, running inside it
(MLGym resolves its files against the working directory), and its agent's tool files."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import BackendUnavailable

CHECKOUT_URL = "https://github.com/facebookresearch/MLGym"


def mlgym_checkout() -> Path:
    """The root of the MLGym checkout the installed ``mlgym`` package comes from (without importing it)."""
    spec = importlib.util.find_spec("mlgym")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(
            "The mlgym backend needs MLGym (facebookresearch/MLGym), which is not installed. Clone it and install "
            f"the checkout: `git clone {CHECKOUT_URL}` then `pip install -e <MLGym checkout>`. The package named "
            "mlgym on PyPI is an unrelated project: do not install MLGym from PyPI."
        )
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    root = package.parent
    if not (root / "configs").is_dir():
        raise BackendUnavailable(
            f"The installed `mlgym` package ({package}) is not facebookresearch/MLGym: it has no `configs` folder "
            "next to it, which is what PyPI's unrelated `mlgym` package looks like. Run `pip uninstall mlgym`, then "
            f"`pip install -e <MLGym checkout>` (git clone {CHECKOUT_URL})."
        )
    return root


def import_from_checkout(root: Path, module: str) -> Any:
    """Import ``module`` of MLGym; ``BackendUnavailable`` naming the fix when MLGym lacks its dependencies."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise BackendUnavailable(
            f"MLGym ({root}) is installed without its dependencies: importing {module} failed ({exc}). "
            f"Install the checkout with them: `pip install -e {root}`"
            + (" (docker-py, which MLGym uses to reach the container engine, is `pip install docker`)"
               if missing == "docker" else "")
            + "."
        ) from exc


@contextlib.contextmanager
def in_directory(path: Path) -> Iterator[None]:
    """Run inside ``path``: MLGym resolves task files against the process's working directory."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def command_file_entry(path: str | Path) -> dict[str, str]:
    """A tool file as MLGym's ``add_commands`` takes it (``name``, ``contents``, ``type``), typed as MLGym's agent
    types it: scripts with a shebang run, ``*.sh`` files are sourced, ``_*`` files are utilities."""
    path = Path(path)
    contents = path.read_text()
    if contents.strip().startswith("#!"):
        return {"name": path.name.rsplit(".", 1)[0], "contents": contents, "type": "script"}
    if path.name.endswith(".sh"):
        return {"name": path.name, "contents": contents, "type": "source_file"}
    if path.name.startswith("_"):
        return {"name": path.name, "contents": contents, "type": "utility"}
    raise ValueError(
        f"tool file {str(path)!r} neither starts with a shebang nor ends in .sh; MLGym cannot install it"
    )
