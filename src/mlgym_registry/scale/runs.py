"""Playing several episodes at once, whatever the engine: worker processes on this machine (``process_episodes``) or
Ray actors on a cluster (``ray_episodes``). The two implementations know nothing of each other; this module checks
what to play once (``run_plan.EpisodeRun``) and picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..episodes.episode import EpisodeResult
from ..episodes.folders import FolderName
from ..specs import TaskSpec
from .run_plan import episode_run

ENGINES = ("process", "ray")
"""Where ``run_episodes`` plays: worker processes on this machine, or Ray actors on a cluster."""


def run_episodes(
    spec: TaskSpec | str,
    policy: str,
    num_envs: int,
    *,
    engine: str = "process",
    address: str | None = None,
    cpus_per_env: float | None = None,
    out: Path | None = None,
    seed: int | None = None,
    on_step: Callable[[int, int], None] | None = None,
    options: dict[str, Any] | None = None,
    episodes_per_env: int = 1,
    folders: FolderName | None = None,
    workers: int | None = None,
) -> list[EpisodeResult]:
    """Play ``num_envs * episodes_per_env`` episodes, ``num_envs`` at once, and return their results in env order
    (each env's in episode order).

    Env ``i``'s episode ``k`` is seeded ``seed + k * num_envs + i`` and written to ``out/env<i>/`` (one episode per
    env) or ``out/env<i>-<k>/`` (or what ``folders(i, k)`` names), its ``.traj`` and ``results.json`` saved at every
    step. ``on_step(episodes_over, steps_so_far)`` is called as steps arrive. A failed episode has ``failure`` set;
    one the engine lost starts with ``infra_error:``.

    ``engine="process"`` plays them in worker processes on this machine (``process_episodes``; ``workers``: how many,
    default one per core, at most one per env); ``engine="ray"`` as Ray actors, on the cluster at ``address`` or on a
    local runtime started for the run (``ray_episodes``), with ``cpus_per_env`` CPUs asked per actor. Both write the
    same files.
    """
    from ..options import InvalidOptionError

    if engine not in ENGINES:
        raise InvalidOptionError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "ray" and workers is not None:
        raise InvalidOptionError("workers= is for engine='process' (Ray places one actor per env); leave it out")
    if engine == "process" and (address is not None or cpus_per_env is not None):
        raise InvalidOptionError("address= and cpus_per_env= are for engine='ray'; pass engine='ray' to use them")
    if engine == "ray":
        from .ray_episodes import check_ray_options, run_ray_episodes

        check_ray_options(cpus_per_env)
    run = episode_run(spec, policy, num_envs, out=out, seed=seed, on_step=on_step, options=options,
                      episodes_per_env=episodes_per_env, folders=folders)
    if engine == "ray":
        return run_ray_episodes(run, address=address, cpus_per_env=cpus_per_env)
    from .process_episodes import run_process_episodes

    return run_process_episodes(run, workers=workers)


def run_parallel(spec: TaskSpec | str, policy: str, num_envs: int, **run: Any) -> list[EpisodeResult]:
    """``run_episodes(spec, policy, num_envs, engine="process", **run)``, under the name ``run --num-envs N`` has
    always had: every step of every episode recorded."""
    return run_episodes(spec, policy, num_envs, engine="process", **run)
