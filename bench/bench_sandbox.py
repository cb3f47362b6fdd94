"""What the bubblewrap sandbox of the local backend costs, measured side by side with the unsandboxed backend.

On prisonersDilemma, one ``LocalBackend(spec, sandbox="bwrap")`` and one unsandboxed backend, used in turn in every
round (so a burst of load on the machine hits both alike); each figure is a median over the rounds:

- reset: ``reset()`` + ``install_tools()`` (fresh workspace and shell); sandboxed / unsandboxed, and the sandboxed time;
- step: a trivial step, ``step("true")``; sandboxed / unsandboxed, and sandboxed / ``subprocess.run(["bash", "-c",
  "true"])``, the cost of starting one bare shell;
- validate: ``step("validate")``, a whole evaluation; sandboxed / unsandboxed;
- memory: proportional set size (PSS; RSS where the system does not tell it) of each env's process tree (the
  sandbox's processes and the shell), summed over 16 idle sandboxed envs and divided by 16.

Targets: reset within 3x and under 150 ms, step within 1.3x of the unsandboxed step and within 2x of a bare shell,
under 30 MB per idle env. The ratios are the figures that matter; absolute times depend on the machine.

The unsandboxed baseline is ``sandbox="none", network=True`` by default: a bare bash, no wrapper. ``--baseline none``
uses ``sandbox="none"`` as users get it, whose shell runs under ``unshare -n`` where the system allows it.

    python bench/bench_sandbox.py [--repeat 5] [--steps 40] [--envs 16] [--baseline plain|none]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import warnings

import psutil

from mlgym_registry import registry
from mlgym_registry.backends.local import LocalBackend

BASELINES = {
    "plain": {"sandbox": "none", "network": True},
    "none": {"sandbox": "none"},
}


def elapsed_ms(function) -> float:
    start = time.perf_counter()
    function()
    return (time.perf_counter() - start) * 1e3


def fresh(backend: LocalBackend) -> None:
    backend.reset()
    backend.install_tools()


def validate(backend: LocalBackend) -> None:
    observation, _reward, _done, _info = backend.step("validate")
    if "Evaluation Score" not in observation:
        raise RuntimeError(f"validate did not produce a score: {observation[:300]}")


def tree_memory(pid: int) -> tuple[int, bool]:
    """Bytes of the process ``pid`` and all its descendants (PSS, else RSS); whether every figure was a PSS."""
    root = psutil.Process(pid)
    total, all_pss = 0, True
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_full_info().pss
        except (psutil.AccessDenied, AttributeError):
            total += process.memory_info().rss
            all_pss = False
        except psutil.NoSuchProcess:
            continue
    return total, all_pss


def idle_memory_mb(spec, count: int) -> tuple[float, bool]:
    """Mean memory (MB) of the process tree of ``count`` idle sandboxed envs, and whether it is all PSS."""
    envs = []
    try:
        for _ in range(count):
            envs.append(LocalBackend(spec, sandbox="bwrap"))
            fresh(envs[-1])
        time.sleep(0.5)  # let the shells settle
        figures = [tree_memory(env._res.session.pid) for env in envs]
    finally:
        for env in envs:
            env.close()
    return sum(size for size, _ in figures) / count / 2**20, all(pss for _, pss in figures)


def ratio(numerator: list[float], denominator: list[float]) -> float:
    return statistics.median(numerator) / statistics.median(denominator)


def verdict(holds: bool) -> str:
    return "holds" if holds else "MISSED"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each times one reset and one validate per "
                        "variant (default 5: about a minute in all)")
    parser.add_argument("--steps", type=int, default=40, help="trivial steps timed per variant and round")
    parser.add_argument("--envs", type=int, default=16, help="idle sandboxed envs open for the memory figure")
    parser.add_argument("--baseline", choices=sorted(BASELINES), default="plain",
                        help="the unsandboxed variant: 'plain' (bare bash) or 'none' (sandbox='none' as is)")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore", message="sandbox='none'", category=RuntimeWarning)
    spec = registry.spec("prisonersDilemma").replace(max_steps=10**6)
    variants = {"bwrap": {"sandbox": "bwrap"}, "none": BASELINES[args.baseline]}
    backends = {name: LocalBackend(spec, **options) for name, options in variants.items()}
    times: dict[str, dict[str, list[float]]] = {name: {"reset": [], "step": [], "validate": []} for name in variants}
    bare: list[float] = []
    started = time.perf_counter()
    try:
        for backend in backends.values():  # warm up: first session, tools, page cache
            fresh(backend)
            backend.step("true")
        for _ in range(args.repeat):
            for name, backend in backends.items():
                times[name]["reset"].append(elapsed_ms(lambda b=backend: fresh(b)))
            for _ in range(args.steps):
                for name, backend in backends.items():
                    times[name]["step"].append(elapsed_ms(lambda b=backend: b.step("true")))
                bare.append(elapsed_ms(lambda: subprocess.run(["bash", "-c", "true"], check=True)))
            for name, backend in backends.items():
                times[name]["validate"].append(elapsed_ms(lambda b=backend: validate(b)))
    finally:
        for backend in backends.values():
            backend.close()
    memory_mb, all_pss = idle_memory_mb(spec, args.envs)
    took = time.perf_counter() - started

    sandboxed, plain = times["bwrap"], times["none"]
    med = {name: {kind: statistics.median(values) for kind, values in series.items()} for name, series in times.items()}
    reset_ratio = ratio(sandboxed["reset"], plain["reset"])
    step_ratio = ratio(sandboxed["step"], plain["step"])
    bare_ratio = ratio(sandboxed["step"], bare)
    validate_ratio = ratio(sandboxed["validate"], plain["validate"])
    baseline = ", ".join(f"{k}={v!r}" for k, v in variants["none"].items())

    print(f"task {spec.id}; sandboxed: sandbox='bwrap'; unsandboxed: {baseline}; {os.cpu_count()} CPUs")
    print(f"medians of {args.repeat} resets, {args.repeat * args.steps} steps, {args.repeat} validates per variant, "
          f"interleaved; memory of {args.envs} idle sandboxed envs; {took:.0f} s in all")
    print()
    rows = [
        ("reset + install_tools (ms)", med["bwrap"]["reset"], med["none"]["reset"], reset_ratio,
         f"<= 3x: {verdict(reset_ratio <= 3)}; < 150 ms: {verdict(med['bwrap']['reset'] < 150)}"),
        ("step('true') (ms)", med["bwrap"]["step"], med["none"]["step"], step_ratio,
         f"<= 1.3x: {verdict(step_ratio <= 1.3)}"),
        ("  vs bash -c true, subprocess.run", med["bwrap"]["step"], statistics.median(bare), bare_ratio,
         f"<= 2x: {verdict(bare_ratio <= 2)}"),
        ("step('validate') (ms)", med["bwrap"]["validate"], med["none"]["validate"], validate_ratio, "(ratio only)"),
    ]
    print(f"{'measure':<34}{'sandboxed':>11}{'baseline':>11}{'ratio':>8}   target")
    for label, mine, theirs, factor, target in rows:
        print(f"{label:<34}{mine:11.2f}{theirs:11.2f}{factor:8.2f}   {target}")
    label = f"{'PSS' if all_pss else 'PSS/RSS'} per idle env (MB)"
    print(f"{label:<34}{memory_mb:11.2f}{'':>19}   < 30 MB: {verdict(memory_mb < 30)}")

if __name__ == "__main__":
    main()
