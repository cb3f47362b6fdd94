"""What an evaluation costs through the local backend, against the same evaluation script in one plain process.

For each task: the median time of ``LocalBackend.step("validate")`` (copy of the workspace, the sandboxed evaluator
and the sandboxed process that runs the agent's code, talking over the harness's channel), divided by the median time
of ``python evaluate.py`` run in one plain process in a copy of the same files (what MLGym does in its container),
both measured side by side, alternately, in this run. Our own tasks always; MLGym's game tasks (``mlgym/...``) when
``MLGYM_ROOT`` points at a checkout of facebookresearch/MLGym: the overlay evaluates them with its own program (the
games in lockstep), and their reference is MLGym's own ``evaluate.py`` in one plain process.

The episode's first validate is timed apart: the later ones find their sandboxes and interpreters started ahead.

Two columns: ``idle`` (nothing of the bench's beside it), and ``busy``: one busy process per core
(``python -c 'while True: pass'``), started by the bench, running beside both sides while they are timed, as on a
training machine where every core has an env or a trainer; the reference gets the same neighbours.

Targets (issue 52): every task within 1.5x of the plain evaluation idle, within 3x busy.

    python bench/bench_evaluation.py [--repeats 3] [--quick] [--tasks prisonersDilemma,mlgym/blotto] [--loads idle,busy]
"""

from __future__ import annotations

import argparse
import contextlib
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
TARGETS = {"idle": 1.5, "busy": 3.0}
"""The ratio every task's validate must stay within, by load."""
LOADS = ("idle", "busy")
PREPARE = {"houseRegression": "python baseline.py"}
"""Commands run in the workspace before timing, so that there is a submission to score."""
SPIN = "while True: pass"
"""The busy neighbour: one process that keeps a core busy."""


def target(load: str = "idle") -> float:
    """The ratio a task's validate must stay within under ``load``."""
    return TARGETS[load]


@contextlib.contextmanager
def neighbours(load: str):
    """Under ``busy``, one busy process per core running for the block (both sides of the pair are timed inside it),
    ended on the way out; nothing under ``idle``."""
    if load != "busy":
        yield
        return
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(len(os.sched_getaffinity(0)))]
    try:
        time.sleep(0.2)  # running before the first timed run
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


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


def mlgym_script(task: str, folder: Path) -> str | None:
    """For an MLGym task whose evaluation program our overlay replaces (the games): MLGym's own ``evaluate.py``,
    copied into the plain ``folder`` as ``mlgym_evaluate.py``, the reference, since a user compares against what MLGym
    runs; None for other tasks, or when the checkout's file is not there."""
    from mlgym_registry.tasks.mlgym_overlay import GAME_TASKS
    from mlgym_registry.tasks.mlgym_source import find_checkout

    name = task.removeprefix("mlgym/")
    checkout = find_checkout()
    if name == task or name not in GAME_TASKS or checkout is None:
        return None
    source = checkout / "data" / name / "evaluate.py"
    if not source.is_file():
        return None
    shutil.copy(source, folder / "mlgym_evaluate.py")
    return "mlgym_evaluate.py"


def plain_command(spec, script: str | None = None) -> list[str]:
    """``python evaluate.py`` (or ``script``) with the arguments MLGym passes for the task's kind of submission."""
    script = script or (spec.evaluation_paths[0] if spec.evaluation_paths else "evaluate.py")
    command = [sys.executable, script]
    if spec.task_entrypoint == "CSVSubmissionTasks":
        command += ["--submission_file", "submission.csv"]
    return command


def measure(task: str, repeats: int, load: str = "idle") -> tuple[float, float, float, str, float | None]:
    """``(validate seconds, plain seconds, first validate seconds, score text, own seconds)``: medians over
    ``repeats`` alternate runs of each, beside the ``neighbours`` of ``load``; the episode's first validate (started
    cold, not ahead) is timed apart. Where the reference is MLGym's own script (``mlgym_script``), ``own`` is the
    overlay's evaluate.py in one plain process, timed in turn with them (else None)."""
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
            reference = mlgym_script(task, folder)
            command = plain_command(spec, reference)
            env = {**os.environ, "MLGYM_REGISTRY_EVAL_SEED": "0"}
            ours, plain, own, score = [], [], [], ""
            with neighbours(load):
                start = time.perf_counter()
                backend.step("validate")  # the episode's first: nothing was started ahead for it
                first = time.perf_counter() - start
                for _ in range(repeats):
                    plain_seconds, printed, our_seconds, info = plain_then_validate(
                        backend, command, folder, env, task)
                    plain.append(plain_seconds)
                    ours.append(our_seconds)
                    score = f"{info['score'][-1]} (plain: {printed.strip()})"
                    if reference is not None:
                        start = time.perf_counter()
                        subprocess.run(plain_command(spec), cwd=folder, env=env, capture_output=True, check=True)
                        own.append(time.perf_counter() - start)
    finally:
        backend.close()
    own_median = statistics.median(own) if own else None
    return statistics.median(ours), statistics.median(plain), first, score, own_median


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
    parser.add_argument("--loads", default="idle,busy",
                        help="comma-separated: idle, busy (one busy process per core beside both sides)")
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
    loads = [load for load in args.loads.split(",") if load]
    unknown = set(loads) - set(LOADS)
    if unknown:
        parser.error(f"--loads: unknown {', '.join(sorted(unknown))} (known: {', '.join(LOADS)})")
    ratios: dict[str, float] = {}
    for task in tasks:
        for load_name in loads:
            ours, plain, first, score, own = measure(task, repeats, load_name)
            ratio = ours / plain
            ratios[task if load_name == "idle" else f"{task} {load_name}"] = ratio
            limit = target(load_name)
            verdict = "met" if ratio <= limit else "NOT met"
            name = task if load_name == "idle" else f"{task} ({load_name})"
            mlgym = "" if own is None else f" (MLGym's; ours plain {own:.2f} s, validate / it {ours / own:.2f})"
            print(f"{name:<31} validate {ours:7.2f} s   plain evaluate.py {plain:6.2f} s   ratio {ratio:6.2f} "
                  f"(target <= {limit:g}: {verdict})   first of the episode {first:.2f} s ({first / plain:.2f}x)"
                  f"   score {score}{mlgym}")
    print(f"load averages at end: {load()}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return ratios


if __name__ == "__main__":
    main()
