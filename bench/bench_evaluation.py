"""What an evaluation costs through the local backend, against the same evaluation script in one plain process.

For each task: the median time of ``LocalBackend.step("validate")`` (copy of the workspace, the sandboxed evaluator
and the sandboxed process that runs the agent's code, talking over the harness's channel), divided by the median time
of ``python evaluate.py`` run in one plain process in a copy of the same files (what MLGym does in its container),
both measured side by side, alternately, in this run. Our own tasks always; MLGym's game tasks (``mlgym/...``) when
``MLGYM_ROOT`` points at a checkout of facebookresearch/MLGym.

The episode's first validate is timed apart: the later ones find their sandboxes and interpreters started ahead.

Targets: within 3x for MLGym's games (their evaluators call the agent's strategy once per move: 100,000 calls), within
1.5x for our own tasks.

    python bench/bench_evaluation.py [--repeats 3] [--quick] [--tasks prisonersDilemma,mlgym/blotto]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OURS = ("prisonersDilemma", "battleOfSexes", "blotto", "houseRegression")
MLGYM = ("mlgym/prisonersDilemma", "mlgym/battleOfSexes", "mlgym/blotto")
TARGETS = {"ours": 1.5, "mlgym": 3.0}
PREPARE = {"houseRegression": "python baseline.py"}
"""Commands run in the workspace before timing, so that there is a submission to score."""


def target(task: str) -> float:
    """The ratio a task's validate must stay within."""
    return TARGETS["mlgym"] if task.startswith("mlgym/") else TARGETS["ours"]


def plain_folder(backend, into: Path) -> Path:
    """A copy of the evaluation's files as the evaluator sees them: the workspace with the pristine (and secret)
    files put back."""
    folder = into / "plain"
    shutil.copytree(backend.host_workspace, folder, symlinks=True)
    for relative, source in backend._files.pristine.items():
        target_path = folder / relative
        if target_path.is_dir() and not target_path.is_symlink():
            shutil.rmtree(target_path)
        elif target_path.exists() or target_path.is_symlink():
            target_path.unlink()
        target_path.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            shutil.copytree(source, target_path)
        else:
            shutil.copy2(source, target_path)
    return folder


def plain_command(spec) -> list[str]:
    """``python evaluate.py`` with the arguments MLGym passes for the task's kind of submission."""
    script = spec.evaluation_paths[0] if spec.evaluation_paths else "evaluate.py"
    command = [sys.executable, script]
    if spec.task_entrypoint == "CSVSubmissionTasks":
        command += ["--submission_file", "submission.csv"]
    return command


def measure(task: str, repeats: int) -> tuple[float, float, float, str]:
    """``(validate seconds, plain seconds, first validate seconds, score text)``: medians over ``repeats`` alternate
    runs of each; the episode's first validate (started cold, not ahead) is timed apart."""
    from mlgym_registry import registry
    from mlgym_registry.backends.local import LocalBackend

    spec = registry.spec(task).replace(max_steps=10**6)
    backend = LocalBackend(spec, seed=0)
    try:
        backend.reset()
        backend.install_tools()
        if task in PREPARE:
            backend.step(PREPARE[task])
        with tempfile.TemporaryDirectory(prefix="bench-eval-") as scratch:
            folder = plain_folder(backend, Path(scratch))
            command = plain_command(spec)
            env = {**os.environ, "MLGYM_REGISTRY_EVAL_SEED": "0"}
            ours, plain, score = [], [], ""
            start = time.perf_counter()
            backend.step("validate")  # the episode's first: nothing was started ahead for it
            first = time.perf_counter() - start
            for _ in range(repeats):
                plain_seconds, printed, our_seconds, info = plain_then_validate(backend, command, folder, env, task)
                plain.append(plain_seconds)
                ours.append(our_seconds)
                score = f"{info['score'][-1]} (plain: {printed.strip()})"
    finally:
        backend.close()
    return statistics.median(ours), statistics.median(plain), first, score


def plain_then_validate(backend, command: list[str], folder: Path, env: dict[str, str],
                        name: str) -> tuple[float, str, float, dict]:
    """Run the task's plain ``evaluate.py`` (``command``, in ``folder``), then our ``validate`` of the same
    workspace: ``(plain seconds, what the plain run printed, validate seconds, validate's info)``."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)
    plain = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{name}: plain evaluate.py failed: {done.stdout}{done.stderr}")
    start = time.perf_counter()
    _, _, _, info = backend.step("validate")
    ours = time.perf_counter() - start
    if info.get("evaluation_status") != "ok":
        raise RuntimeError(f"{name}: validate ended {info.get('evaluation_status')}")
    return plain, done.stdout, ours, info


def load() -> str:
    """The load averages, to judge whether the machine was busy."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the bench, print each ratio with its target; the ratios by task."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side per task (median)")
    parser.add_argument("--quick", action="store_true", help="one run each, and only prisonersDilemma of each kind")
    parser.add_argument("--tasks", default="", help="comma-separated task names (default: all that are available)")
    args = parser.parse_args(argv)
    from mlgym_registry import registry

    started = time.perf_counter()
    repeats = 1 if args.quick else max(1, args.repeats)
    available = set(registry.names("task"))
    tasks = [t for t in args.tasks.split(",") if t] or list(OURS) + [t for t in MLGYM if t in available]
    if args.quick and not args.tasks:
        tasks = [t for t in tasks if t.endswith("prisonersDilemma")]
    if not any(t.startswith("mlgym/") for t in available):
        print("MLGYM_ROOT does not point at an MLGym checkout: only our own tasks are measured")
    print(f"load averages at start: {load()}")
    ratios: dict[str, float] = {}
    for task in tasks:
        ours, plain, first, score = measure(task, repeats)
        ratios[task] = ratio = ours / plain
        verdict = "met" if ratio <= target(task) else "NOT met"
        print(f"{task:<24} validate {ours:7.2f} s   plain evaluate.py {plain:6.2f} s   ratio {ratio:6.2f} "
              f"(target <= {target(task):g}: {verdict})   first of the episode {first:.2f} s ({first / plain:.2f}x)"
              f"   score {score}")
    print(f"load averages at end: {load()}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return ratios


if __name__ == "__main__":
    main()
