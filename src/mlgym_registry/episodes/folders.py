"""Where episodes played at once write their files: one folder per env and episode under the run's ``out``, the same
for worker processes (``parallel``) and Ray actors (``ray_episodes``)."""

from __future__ import annotations

from collections.abc import Callable

FolderName = Callable[[int, int], str]
"""``folders(env_index, episode_number)``: the folder (under ``out``) of that env's episode."""


def episode_folder(index: int, number: int, episodes_per_env: int, folders: FolderName | None = None) -> str:
    """The folder of env ``index``'s episode ``number``: ``folders(index, number)`` when given, else ``env<i>`` (one
    episode per env) or ``env<i>-<k>``."""
    if folders is not None:
        return folders(index, number)
    return f"env{index}" if episodes_per_env == 1 else f"env{index}-{number}"
