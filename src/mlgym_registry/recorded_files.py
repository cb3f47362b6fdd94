"""The starter files a recorded MLGym run saw, rebuilt from the file windows in its own trajectory.

MLGym's starter files changed after many of its published runs were recorded (licence headers were added, shifting
every line), so a recorded ``edit N:M`` only lands where it did when it meets the file version the run saw. A run
shows that version the first time it opens a file, before it has changed it: the window lists every line as
``<n>:<text>`` when the file fits in the window.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from .specs import TaskSpec

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


def with_recorded_starters(spec: TaskSpec, windows: dict[str, str], folder: Path) -> tuple[TaskSpec, list[str]]:
    """``spec`` with the starter files named in ``windows`` replaced by their recorded text (written into ``folder``).

    Returns the new spec and the names of the files replaced. Files the run never showed whole keep the task's own.
    """
    starter_code, replaced = [], []
    for item in spec.starter_code:
        name = Path(item).name
        if name in windows:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(windows[name])
            starter_code.append(str((folder / name).resolve()))
            replaced.append(name)
        else:
            starter_code.append(str(spec.resolve_path(item)))
    return spec.replace(starter_code=starter_code), replaced
