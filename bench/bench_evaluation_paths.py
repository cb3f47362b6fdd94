"""Reset and validate of issue 34's new evaluation paths through the local backend, against the same evaluation in one
plain process, on tasks the tests make themselves (so it runs anywhere, without MLGym, jax or network):

- ``rl``: the RL policy channel, ``tests/rl_toy.py``'s LineWorld: the pristine evaluator steps the environment with
  the package's ``rl_driver`` and asks the agent's side (``toy_policy.py``, in the agent's sandboxed process) for each
  step's batch of actions over the channel. Plain: the same ``evaluate.py``, driver and policy in one process.
- ``hub``: a Hugging Face hub dataset from a tiny synthetic local copy (``tests/backends/test_hub_datasets.py``'s
  CIFAR-shaped copy and task): the agent's view with the test labels masked, the evaluator's with them. Plain: the
  same ``evaluate.py`` in one process reading the evaluator's view (``HF_DATASETS_CACHE``), offline.

For each: ``reset`` over a plain copy of the same workspace into a fresh folder, and ``validate`` over plain
``python evaluate.py`` (medians, measured alternately in this run; the episode's first validate is timed apart, as in
``bench_evaluation.py``). Ratios only: no absolute time is a verdict. Each path is measured idle and busy (one busy
process per core beside both sides, ``bench_evaluation.neighbours``); validate's targets are ``bench_evaluation``'s
(1.5x idle, 3x busy; issue 52).

    python bench/bench_evaluation_paths.py [--repeats 3] [--quick] [--paths rl,hub] [--loads idle,busy]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_evaluation, when loaded from a file path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backends"))

from bench_evaluation import (  # noqa: E402
    LOADS,
    load,
    neighbours,
    plain_command,
    plain_folder,
    plain_then_validate,
    target,
)


@dataclass
class Measured:
    """Medians of one path: ``reset`` and its plain copy, ``validate`` and plain ``evaluate.py``, the first validate
    of the episode, and the scores both sides gave."""

    reset: float
    copy: float
    validate: float
    plain: float
    first: float
    score: str


def rl_setup(folder: Path) -> tuple[object, str, dict[str, str]]:
    """The LineWorld task, the command that makes its checkpoints, and the plain run's extra environment."""
    from rl_toy import toy_spec

    return toy_spec(folder / "task").replace(max_steps=10**6), "python src/train.py", {}


def hub_setup(folder: Path) -> tuple[object, str, dict[str, str]]:
    """The CIFAR-shaped hub task on a tiny synthetic copy in a data folder of its own, the baseline that writes its
    submission, and the plain run's environment: the evaluator's view as its datasets cache, offline."""
    os.environ["MLGYM_REGISTRY_DATA"] = str(folder / "data-folder")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HOME"] = str(folder / "hf-home")
    from test_hub_datasets import REPO, task_file, tiny_cifar

    from mlgym_registry import load_task_yaml
    from mlgym_registry.preparation import hub_datasets

    tiny_cifar(folder / "data-folder" / "hub" / REPO)
    spec = load_task_yaml(task_file(folder / "task")).replace(max_steps=10**6)
    view = hub_datasets.hub_view(spec, REPO, sys.executable)
    cache = str(view.evaluator)[: -len(view.relative)].rstrip("/")
    return spec, "python baseline.py", {"HF_DATASETS_CACHE": cache, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


PATHS = {"rl": rl_setup, "hub": hub_setup}


def measure(path: str, repeats: int, load_name: str = "idle") -> Measured:
    """Alternate runs of each side: ``reset`` then a plain copy, the task's command, plain ``evaluate.py`` then
    ``validate``; the first validate (nothing started ahead for it) apart; all beside the ``neighbours`` of
    ``load_name``."""
    from mlgym_registry.backends.local import LocalBackend

    with tempfile.TemporaryDirectory(prefix=f"bench-paths-{path}-") as scratch:
        spec, command, extra = PATHS[path](Path(scratch))
        backend = LocalBackend(spec, seed=0)
        seed = {"evaluation_seed": 0}  # the plain run's MLGYM_REGISTRY_EVAL_SEED: both sides score the same episodes
        busy = contextlib.ExitStack()
        try:
            backend.reset(options=seed)
            backend.install_tools()
            output = backend.communicate(command, timeout_duration=300)
            if backend.returncode:
                raise RuntimeError(f"{path}: `{command}` failed: {output}")
            folder = plain_folder(backend, Path(scratch))
            env = {**os.environ, **extra, "MLGYM_REGISTRY_EVAL_SEED": "0"}
            busy.enter_context(neighbours(load_name))
            started = time.perf_counter()
            backend.step("validate")  # the episode's first: nothing was started ahead for it
            first = time.perf_counter() - started
            resets, copies, ours, plain, score = [], [], [], [], ""
            for index in range(repeats):
                started = time.perf_counter()
                backend.reset(options=seed)
                resets.append(time.perf_counter() - started)
                started = time.perf_counter()
                shutil.copytree(folder, Path(scratch) / f"copy-{index}", symlinks=True)
                copies.append(time.perf_counter() - started)
                backend.communicate(command, timeout_duration=300)
                plain_seconds, printed, our_seconds, info = plain_then_validate(
                    backend, plain_command(spec), folder, env, path)
                plain.append(plain_seconds)
                ours.append(our_seconds)
                score = f"{info['score'][-1]} (plain: {printed.strip().splitlines()[-1]})"
        finally:
            busy.close()
            backend.close()
    median = statistics.median
    return Measured(median(resets), median(copies), median(ours), median(plain), first, score)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the bench and print each ratio; the ratios by name (``<path>_validate``, ``<path>_reset``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side per path (median)")
    parser.add_argument("--quick", action="store_true", help="one run of each side")
    parser.add_argument("--paths", default="rl,hub", help="comma-separated: rl, hub (default both)")
    parser.add_argument("--loads", default="idle,busy",
                        help="comma-separated: idle, busy (one busy process per core beside both sides)")
    args = parser.parse_args(argv)
    loads = [name for name in args.loads.split(",") if name]
    if set(loads) - set(LOADS):
        parser.error(f"--loads: known are {', '.join(LOADS)}")
    started = time.perf_counter()
    repeats = 1 if args.quick else max(1, args.repeats)
    print(f"load averages at start: {load()}")
    ratios: dict[str, float] = {}
    for path in [p for p in args.paths.split(",") if p]:
        if path == "hub":
            try:
                import datasets
            except ImportError:
                print("hub: skipped, the datasets library is not installed")
                continue
            datasets.disable_progress_bars()
        for load_name in loads:
            found = measure(path, repeats, load_name)
            key = path if load_name == "idle" else f"{path}_{load_name}"
            ratio = ratios[f"{key}_validate"] = found.validate / found.plain
            ratios[f"{key}_reset"] = found.reset / found.copy
            name = path if load_name == "idle" else f"{path} ({load_name})"
            verdict = "met" if ratio <= target(load_name) else "NOT met"
            print(f"{name:<11} validate {found.validate:6.2f} s   plain evaluate.py {found.plain:6.2f} s   ratio "
                  f"{ratio:6.2f} (target <= {target(load_name):g}: {verdict})   first of the episode "
                  f"{found.first:.2f} s ({found.first / found.plain:.2f}x)   score {found.score}")
            print(f"{name:<11} reset    {found.reset:6.2f} s   plain copy of the workspace {found.copy:6.3f} s   "
                  f"ratio {found.reset / found.copy:6.1f}   (reset over plain evaluate.py: "
                  f"{found.reset / found.plain:.2f})")
    print(f"load averages at end: {load()}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return ratios


if __name__ == "__main__":
    main()
