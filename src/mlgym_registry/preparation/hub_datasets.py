"""Hugging Face hub datasets served offline from a local copy, their answers out of the agent's reach.

MLGym's image and language tasks load their data by name (``datasets.load_dataset("uoft-cs/cifar10")``), with the
test split's labels that they are scored on. The local backend serves such a dataset from a **local copy**:

- **Where and in which format.** The copy is a ``DatasetDict`` as ``save_to_disk`` writes it, at
  ``<data folder>/hub/<namespace>/<name>`` (the data folders of ``datasets.data_folders``: ``data_dir=``,
  ``$MLGYM_REGISTRY_DATA``, ``~/.cache/mlgym-registry/data``). On a machine with network access,
  ``python -m mlgym_registry.preparation.hub_datasets uoft-cs/cifar10`` makes it (``load_dataset(name)
  .save_to_disk(folder)``).
- **What is hidden.** The task declares, per hub dataset, the splits it scores and the columns that hold their
  answers (``hub_answers: {uoft-cs/cifar10: {test: [label]}}``; MLGym's tasks get theirs from
  ``tasks.mlgym_overlay``). A task that loads a hub dataset without declaring them is refused: nothing would say
  what to hide.
- **Two views.** ``prepare`` (or the first ``make``) writes, with the task's interpreter
  (``hub_view_builder.py``), two views of the copy in the ``datasets`` library's own cache layout, beside the first
  data folder's ``hub-views/``: the agent's (every split, the answer columns masked: ``-1``, ``""`` or nulls) and
  the evaluator's (the copy as it is). In the sandbox, ``HF_DATASETS_CACHE`` names a folder where
  ``load_dataset(name)`` finds the view offline (``HF_HUB_OFFLINE=1``), unchanged: the agent's shell and the
  process running its code get the agent's view, the evaluator's process alone the evaluator's
  (``backends.local.hub_cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TaskFilesMissing
from ..specs import TaskSpec
from .datasets import data_folders, hub_datasets

HUB_ANSWERS_KEY = "hub_answers"
"""A task's ``extra`` entry: per hub dataset it loads by name, the splits it scores and their answer columns,
``{"uoft-cs/cifar10": {"test": ["label"]}}``: the agent's view masks these columns."""
HUB_FOLDER = "hub"
"""Where in a data folder the local copies of hub datasets are: ``hub/<namespace>/<name>``."""
VIEWS_FOLDER = "hub-views"
"""Where in the first data folder the views of the copies are written."""
VIEW_FORMAT = 1
"""Changes when the views' layout does: views of an older format are written again."""
BUILDER = Path(__file__).with_name("hub_view_builder.py")
FETCH_COMMAND = "python -m mlgym_registry.preparation.hub_datasets"


def hub_answers(spec: TaskSpec, repo_id: str) -> dict[str, list[str]]:
    """The splits of ``repo_id`` the task scores and their answer columns (``HUB_ANSWERS_KEY``), checked for shape;
    ``TaskFilesMissing`` when the task declares none for it."""
    declared = spec.extra.get(HUB_ANSWERS_KEY) or {}
    answers = declared.get(repo_id) if isinstance(declared, dict) else None
    if not isinstance(answers, dict) or not answers or not all(
            isinstance(columns, list) and columns and all(isinstance(c, str) for c in columns)
            for columns in answers.values()):
        raise TaskFilesMissing(
            f"task {spec.id!r} loads the Hugging Face dataset {repo_id!r} by name and does not say which of its "
            f"splits it scores: the local backend serves it offline with those splits' answer columns hidden from "
            f"the agent, so the task must declare them, e.g. {HUB_ANSWERS_KEY}: {{{repo_id}: {{test: [label]}}}}"
        )
    return {str(split): list(columns) for split, columns in answers.items()}


def copy_candidates(repo_id: str, data_dir: str | None = None) -> list[Path]:
    """Where a local copy of ``repo_id`` may be, in the order they are tried."""
    return [folder / HUB_FOLDER / repo_id for folder in data_folders(data_dir)]


def copy_problem(place: Path, answers: dict[str, list[str]]) -> str | None:
    """What is wrong with ``place`` as a ``save_to_disk`` copy holding the scored splits and answer columns, read
    from its JSON files alone; None when nothing is."""
    index = place / "dataset_dict.json"
    if not index.is_file():
        return "no dataset_dict.json: not a DatasetDict written by save_to_disk" if place.exists() else None
    try:
        splits = json.loads(index.read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its dataset_dict.json is not one save_to_disk writes"
    for split, columns in answers.items():
        if split not in splits:
            return f"it has no split {split!r} (it has {', '.join(map(str, splits))})"
        try:
            features = json.loads((place / split / "dataset_info.json").read_text()).get("features") or {}
        except (OSError, ValueError):
            return f"its split {split!r} has no readable dataset_info.json"
        missing = [column for column in columns if column not in features]
        if missing:
            return f"its split {split!r} has no column {', '.join(map(repr, missing))}"
    return None


def find_copy(spec: TaskSpec, repo_id: str, data_dir: str | None = None) -> Path:
    """The folder of the local copy of ``repo_id``: the first candidate that holds a ``save_to_disk`` DatasetDict
    with the task's scored splits and answer columns; else ``TaskFilesMissing`` naming where it goes, its format and
    the command that makes it."""
    answers = hub_answers(spec, repo_id)
    places = copy_candidates(repo_id, data_dir)
    shown = []
    for place in places:
        problem = copy_problem(place, answers)
        if problem is None and place.is_dir():
            return place
        shown.append(f"  {place}" + (f" (there, but {problem})" if problem else ""))
    splits = ", ".join(f"{split!r} with {', '.join(map(repr, columns))}" for split, columns in answers.items())
    raise TaskFilesMissing(
        f"task {spec.id!r} loads the Hugging Face dataset {repo_id!r} by name; the local backend serves it offline "
        f"from a local copy, which is not here; looked in:\n" + "\n".join(shown) + "\n"
        f"The copy is a DatasetDict as save_to_disk writes it, holding the split {splits}. On a machine with network "
        f"access run `{FETCH_COMMAND} {repo_id}` (it writes {places[0]}; --data-dir DIR writes DIR/{HUB_FOLDER}/"
        f"{repo_id}), or in Python `datasets.load_dataset({repo_id!r}).save_to_disk(...)`, and copy the folder here"
    )


@dataclass(frozen=True)
class HubView:
    """The two views of one hub dataset's copy: ``relative`` is their folder inside a datasets cache
    (``<namespace>___<name>/<config>/0.0.0/<hash>``); ``agent`` and ``evaluator`` are that folder in each view;
    ``files`` the names of the files in it (the same in both); ``copy`` the local copy they were written from."""

    repo_id: str
    relative: str
    agent: Path
    evaluator: Path
    files: tuple[str, ...]
    copy: Path

    def folder(self, side: str) -> Path:
        """The view of one side, ``"agent"`` or ``"evaluator"``."""
        return self.evaluator if side == "evaluator" else self.agent


def views_key(copy: Path, repo_id: str, answers: dict[str, list[str]]) -> str:
    """What names the views of ``copy``: its path, its files' sizes and times, the answers hidden, the format."""
    stamp: list[Any] = [VIEW_FORMAT, repo_id, answers, str(copy.resolve())]
    for path in sorted(copy.rglob("*")):
        if path.is_file():
            status = path.stat()
            stamp.append([str(path.relative_to(copy)), status.st_size, status.st_mtime_ns])
    return hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]


def views_folder(data_dir: str | None = None) -> Path:
    """Where views are written: ``hub-views`` in the first data folder."""
    return data_folders(data_dir)[0] / VIEWS_FOLDER


def hub_view(spec: TaskSpec, repo_id: str, python: str, data_dir: str | None = None, *, echo=None,
             timeout: float = 3600) -> HubView:
    """The views of ``repo_id``'s local copy, written first (with ``python``, the task's interpreter) when they are
    not there yet; ``TaskFilesMissing`` when the copy is missing or the views cannot be written from it."""
    answers = hub_answers(spec, repo_id)
    copy = find_copy(spec, repo_id, data_dir)
    key = views_key(copy, repo_id, answers)
    target = views_folder(data_dir) / key
    done = target / "views.json"
    if not done.is_file():
        if echo is not None:
            echo(f"{spec.id}: writing the offline views of {repo_id} from {copy} ...")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
        try:
            request = {"copy": str(copy), "out": str(staging), "repo_id": repo_id, "hash": key, "hidden": answers}
            (staging / "request.json").write_text(json.dumps(request))
            made = subprocess.run([python, "-I", "-c", BUILDER.read_text(), str(staging / "request.json")],
                                  cwd=staging, capture_output=True, text=True, timeout=timeout, check=False)
            if made.returncode != 0:
                raise TaskFilesMissing(
                    f"task {spec.id!r}: the offline views of {repo_id!r} could not be written from its local copy "
                    f"{copy} with {python} (exit {made.returncode}):\n{(made.stdout + made.stderr).strip()[-1500:]}"
                )
            folders = json.loads(made.stdout.strip().splitlines()[-1])
            relative = str(Path(folders["agent"]).relative_to(staging / "agent"))
            files = sorted(p.name for p in Path(folders["agent"]).iterdir())
            (staging / "views.json").write_text(json.dumps({"relative": relative, "files": files}))
            try:
                os.replace(staging, target)
            except OSError:
                if not done.is_file():  # not another process's views, written meanwhile
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    made_views = json.loads(done.read_text())
    relative = made_views["relative"]
    return HubView(repo_id, relative, target / "agent" / relative, target / "evaluator" / relative,
                   tuple(made_views["files"]), copy)


def hub_views(spec: TaskSpec, python: str, data_dir: str | None = None, *, echo=None) -> list[HubView]:
    """The views of every hub dataset the task loads by name (``hub_view``)."""
    return [hub_view(spec, repo_id, python, data_dir, echo=echo) for repo_id in hub_datasets(spec)]


def prepare_hub_views(spec: TaskSpec, python: str, data_dir: str | None = None, *, echo=print) -> None:
    """Write the views of the task's hub datasets whose copies are here (``prepare``): a missing copy is left to the
    blockers ``prepare`` reports next."""
    for repo_id in hub_datasets(spec):
        try:
            find_copy(spec, repo_id, data_dir)
        except TaskFilesMissing:
            continue
        view = hub_view(spec, repo_id, python, data_dir, echo=echo)
        echo(f"{spec.id}: {repo_id} served offline from its local copy (views at {view.agent.parents[4]})")


def fetch(repo_id: str, data_dir: str | None = None, *, force: bool = False) -> Path:
    """Download ``repo_id`` with ``datasets.load_dataset`` (network needed) and save it where the local backend
    looks for its copy: ``<data_dir or the first data folder>/hub/<repo_id>``."""
    from datasets import load_dataset

    target = copy_candidates(repo_id, data_dir)[0]
    if (target / "dataset_dict.json").is_file() and not force:
        return target
    dataset = load_dataset(repo_id)
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    dataset.save_to_disk(str(staging))
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m mlgym_registry.preparation.hub_datasets NAME [NAME ...] [--data-dir DIR] [--force]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=FETCH_COMMAND, description="Save Hugging Face hub datasets where the local backend serves them from "
        "(network needed): <data folder>/hub/<namespace>/<name>, as save_to_disk writes a DatasetDict.")
    parser.add_argument("names", nargs="+", metavar="NAME", help="a hub dataset, e.g. uoft-cs/cifar10")
    parser.add_argument("--data-dir", metavar="DIR", help="the data folder (default: $MLGYM_REGISTRY_DATA, else "
                        "~/.cache/mlgym-registry/data)")
    parser.add_argument("--force", action="store_true", help="download again even when a copy is there")
    args = parser.parse_args(argv)
    for name in args.names:
        print(f"{name}: saved at {fetch(name, args.data_dir, force=args.force)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
