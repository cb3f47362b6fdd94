"""What a run of several episodes at once plays (``EpisodeRun``), checked once (``episode_run``) for whichever engine
plays it: its seeds and the writer of each episode's files are decided here, not by each engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..episodes.folders import FolderName, episode_folder
from ..records.trajectories import TrajectoryWriter
from ..specs import TaskSpec


@dataclass(frozen=True)
class EpisodeRun:
    """What an engine plays: ``num_envs`` envs of ``spec`` at once, ``episodes_per_env`` episodes each, answered by
    ``policy`` (a policy string), each env built with ``options``; ``known_problems`` are the plugin problems this
    process has already shown (a worker reports only new ones). Built, checked, by ``episode_run``."""

    spec: TaskSpec
    policy: str
    num_envs: int
    out: Path | None
    seed: int | None
    on_step: Callable[[int, int], None] | None
    options: dict[str, Any]
    episodes_per_env: int
    folders: FolderName | None
    known_problems: tuple[str, ...]

    def seed_of(self, env: int, number: int) -> int | None:
        """The seed of env ``env``'s episode ``number``: ``seed + number * num_envs + env`` (None without a seed)."""
        return None if self.seed is None else self.seed + number * self.num_envs + env

    def writer(self, env: int, number: int) -> TrajectoryWriter | None:
        """The writer of env ``env``'s episode ``number``, in its folder under ``out`` (None without ``out``)."""
        if self.out is None:
            return None
        folder = episode_folder(env, number, self.episodes_per_env, self.folders)
        return TrajectoryWriter(Path(self.out) / folder, self.spec.id.replace("/", "_"), baseline=self.spec.baseline,
                                environment=f"mlgym_registry:{self.spec.backend}")


def episode_run(spec: TaskSpec | str, policy: str, num_envs: int, *, out: Path | None = None, seed: int | None = None,
                on_step: Callable[[int, int], None] | None = None, options: dict[str, Any] | None = None,
                episodes_per_env: int = 1, folders: FolderName | None = None) -> EpisodeRun:
    """The run ``run_episodes`` describes, checked before anything starts: an unknown task, component or option and
    a bad seed fail here. Each env's tensordicts are the chain's own unbatched ones unless ``options`` says
    otherwise (``batch_size``)."""
    from ..options import check_option
    from ..registry import registry

    spec = registry.spec(spec)
    registry.resolve(spec)
    check_option("seed", seed)
    return EpisodeRun(spec, policy, num_envs, out, seed, on_step, {"batch_size": (), **(options or {})},
                      episodes_per_env, folders, tuple(str(error) for error in registry.load_errors()))
