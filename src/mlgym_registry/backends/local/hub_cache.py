"""What the sandbox shows of a task's Hugging Face hub datasets and models: ``datasets.load_dataset(name)`` and
``from_pretrained(name)`` resolve offline, unchanged, and the agent never reaches a scored split's answers.

Each hub dataset has two views of its local copy (``preparation.hub_datasets``), in the ``datasets`` cache layout
(``<namespace>___<name>/<config>/0.0.0/<hash>/``: ``dataset_info.json`` and an Arrow file per split). A sandbox gets
``HF_DATASETS_CACHE`` under its own in-memory home and, at the view's place in it, a writable folder of the env (the
library writes its ``.map`` caches beside the data, as in MLGym's container) in which every file of the view is
bound read-only over an empty placeholder: the agent can add files there but can neither change, replace nor remove
the view's. The agent's shell and the process running the agent's code get the agent's view (answer columns
masked); the evaluator's process alone gets the evaluator's. The views themselves, and the copies, are never shown.
Models a task needs (``needs: {models: [...]}``) are their folders of this machine's Hugging Face cache, read-only.
Unsandboxed (``sandbox="none"``, trusted policies only), the folders hold links to the view's files instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from ...preparation.hub_datasets import HubView
from . import sandbox as sandbox_mod

HF_HOME = f"{sandbox_mod.AGENT_HOME}/.cache/huggingface"
"""``HF_HOME`` in the sandbox (the library's default there): ``datasets`` and ``hub`` below it."""
AGENT, EVALUATOR = "agent", "evaluator"


def environment(cache: str | None, *, sandboxed: bool) -> dict[str, str]:
    """The variables that make ``datasets`` and ``huggingface_hub`` look offline, in ``cache`` for datasets (the
    sandbox's ``$HF_HOME/datasets`` when sandboxed). ``datasets`` says on stderr, at each load, that it uses its
    cache offline: an evaluator whose output must be its metrics alone (as in MLGym's container, online, where it
    says nothing) would fail, so its warnings are off."""
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "DATASETS_VERBOSITY": "error"}
    if sandboxed:
        env.update(HF_HOME=HF_HOME, HF_DATASETS_CACHE=f"{HF_HOME}/datasets", HF_HUB_CACHE=f"{HF_HOME}/hub")
    elif cache is not None:
        env["HF_DATASETS_CACHE"] = cache
    return env


def fill(folder: Path, views: Sequence[HubView], side: str, *, link: bool = False) -> None:
    """Make ``folder`` the writable part of a datasets cache for ``side``: each view's folder with an empty
    placeholder per file of the view (sandboxed: ``binds`` shows the file over it), or a link to it (``link``,
    unsandboxed); whatever else is there (the last episode's ``.map`` caches, the agent's files) is removed."""
    keep: set[Path] = set()
    for view in views:
        place = folder / view.relative
        place.mkdir(parents=True, exist_ok=True)
        for name in view.files:
            path = place / name
            keep.add(path)
            target = view.folder(side) / name
            if link:
                if not (path.is_symlink() and os.readlink(path) == str(target)):
                    _remove(path)
                    path.symlink_to(target)
            elif path.is_symlink() or not path.is_file() or path.stat().st_size:
                _remove(path)
                path.touch()
        for entry in place.iterdir():
            if entry not in keep:
                _remove(entry)
        keep |= {place, *place.parents}
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in [*dirs, *files]:
            path = Path(root) / name
            if path not in keep and not any(k.is_relative_to(path) for k in keep):
                _remove(path)


def binds(folder: Path, views: Sequence[HubView], side: str) -> list[sandbox_mod.Bind]:
    """The sandbox's binds of a datasets cache for ``side``: each view's writable folder of ``folder`` at its place
    under ``$HF_HOME/datasets``, then each file of the view, read-only, over its placeholder."""
    shown = []
    for view in views:
        target = f"{HF_HOME}/datasets/{view.relative}"
        shown.append(sandbox_mod.Bind(str(folder / view.relative), target, writable=True))
        shown += [sandbox_mod.Bind(str(view.folder(side) / name), f"{target}/{name}") for name in view.files]
    return shown


def model_binds(hub_cache: str, models: Sequence[str]) -> list[sandbox_mod.Bind]:
    """Each model's folder of this machine's Hugging Face cache (``models--org--name``), read-only, at its place
    under the sandbox's ``$HF_HOME/hub``."""
    found = []
    for model in models:
        name = "models--" + model.replace("/", "--")
        source = Path(hub_cache) / name
        if source.is_dir():
            found.append(sandbox_mod.Bind(str(source.resolve()), f"{HF_HOME}/hub/{name}"))
    return found


def hidden(views: Sequence[HubView]) -> list[str]:
    """The host folders of the views and of the copies they were written from: never shown whole, even where a
    shown folder holds them."""
    return [str(path.resolve()) for view in views for path in (view.agent.parents[4], view.copy)]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()
