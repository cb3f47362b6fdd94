"""The starter files a recorded MLGym run saw, rebuilt from the file windows in its own trajectory.

MLGym's starter files changed after many of its published runs were recorded (licence headers were added, shifting
every line), so a recorded ``edit N:M`` only lands where it did when it meets the file version the run saw. A run
shows that version the first time it opens a file, before it has changed it: the window lists every line as
``<n>:<text>`` when the file fits in the window.

Only the agent's own starter files are rebuilt so. A window is text the agent's commands printed, and an agent can
print anything (a forged ``evaluate.py``, an opponent that always cooperates): every file the backend keeps a
pristine copy of or hides (the task's ``evaluation_paths``, ``protected_files`` and ``secret_files``, and the
datasets' ``data`` folder) always comes from the task itself, and so does every starter folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..specs import TaskSpec

_WINDOW_HEAD = re.compile(r"^\[File: (?:/home/agent/workspace/|\S*/workspace/)(\S+) \((\d+) lines total\)\]$")
_OPEN = re.compile(r'^open\s+"?([\w./-]+?)"?(?:\s+\d+)?\s*$')
_MENTIONED = re.compile(r"[\w-]+\.\w+")


def first_windows(steps: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """``{file name: text}`` of each workspace file as first shown whole by ``open``, before any action named it.

    ``steps`` are the run's ``(action, observation)`` pairs in order.
    """
    found: dict[str, str] = {}
    mentioned: set[str] = set()
    for action, observation in steps:
        action = action.strip()
        lines = (observation or "").split("\n")
        opened, head = _OPEN.match(action), _WINDOW_HEAD.match(lines[0])
        if opened and head and head[1] == opened[1].removeprefix("./") and head[1] not in mentioned | set(found):
            body = lines[1:]
            if len(body) == int(head[2]) and all(re.match(r"^\d+:", line) for line in body):
                found[head[1]] = "".join(line.split(":", 1)[1] + "\n" for line in body)
        mentioned.update(_MENTIONED.findall(action))
    return found


DATA_FOLDER = "data"
"""Where the local backend puts a task's local datasets in the workspace (``backends/local/workspace.py``)."""


def protected_paths(spec: TaskSpec) -> set[str]:
    """The workspace paths of ``spec`` that the agent may not change its score through: evaluation, protected and
    secret files, and the datasets' folder (normalised: no ``./`` in front, no ``/`` behind)."""
    paths = [*spec.evaluation_paths, *spec.protected_files, *spec.secret_files, DATA_FOLDER]
    return {normal for normal in (_normal(path) for path in paths) if normal}


def _normal(path: str) -> str:
    text = str(path).strip().replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    return text.strip("/")


def is_protected(name: str, protected: set[str]) -> bool:
    """True when the workspace path ``name`` is one of ``protected``, lies inside one, or holds one."""
    name = _normal(name)
    return any(name == path or name.startswith(path + "/") or path.startswith(name + "/") for path in protected)


def rebuildable(spec: TaskSpec) -> dict[str, Path]:
    """``{workspace name: task file}`` of the starter files a replay may rebuild from recorded windows: the regular
    files of ``starter_code`` that are not protected (``protected_paths``)."""
    protected = protected_paths(spec)
    found: dict[str, Path] = {}
    for item in spec.starter_code:
        source = spec.resolve_path(item)
        if source.is_file() and not source.is_symlink() and not is_protected(source.name, protected):
            found[source.name] = source
    return found


def task_kept(spec: TaskSpec, windows: dict[str, str]) -> list[str]:
    """The starter files that ``windows`` shows but that stay the task's own (protected files, folders)."""
    allowed = rebuildable(spec)
    names = {spec.resolve_path(item).name for item in spec.starter_code}
    return sorted(name for name in windows if name in names and name not in allowed)


def with_recorded_starters(spec: TaskSpec, windows: dict[str, str], folder: Path) -> tuple[TaskSpec, list[str]]:
    """``spec`` with the agent's starter files named in ``windows`` replaced by their recorded text (written into
    ``folder``); the task's protected files and folders are never replaced (``rebuildable``).

    Returns the new spec and the names of the files replaced. Files the run never showed whole keep the task's own.
    """
    allowed = rebuildable(spec)
    starter_code, replaced = [], []
    for item in spec.starter_code:
        name = spec.resolve_path(item).name
        if name in windows and name in allowed:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(windows[name])
            starter_code.append(str((folder / name).resolve()))
            replaced.append(name)
        else:
            starter_code.append(str(spec.resolve_path(item)))
    return spec.replace(starter_code=starter_code), replaced
