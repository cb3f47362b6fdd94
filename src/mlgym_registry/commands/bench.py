"""``mlgym-registry bench TASK... --policy P --runs K --out DIR``: K runs of each task, in MLGym's layout.

Each run is written to ``DIR/<model>__<task>__run_<k>/`` (``<task>.traj`` and ``results.json``) as it goes. The same
command again skips the runs that finished and plays the others from scratch, so an interrupted suite resumes where
it stopped. ``mlgym-registry report DIR`` turns the folder into MLGym's tables.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from ..terminal import printable
from ..validation import cli_integer
from .run import (
    MAX_FAILED_STATUS,
    OutFolder,
    ProgressBar,
    add_backend_option_argument,
    add_component_arguments,
    add_engine_arguments,
    add_episode_arguments,
    add_openai_arguments,
    backend_options,
    check_endpoint,
    check_policy,
    component_choices,
    policy_text,
    with_changes,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``bench``."""
    parser.add_argument("tasks", nargs="+", metavar="TASK", help="registered task names")
    parser.add_argument("--policy", default="scripted",
                        help="scripted (default), replay:PATH.traj, transformers:MODEL_DIR or openai:MODEL")
    parser.add_argument("--runs", type=cli_integer(1), default=4, help="runs per task (default 4, as MLGym)")
    parser.add_argument("--out", required=True,
                        help="the suite's folder; running again with the same folder resumes the suite")
    parser.add_argument("--model-name", default=None,
                        help="the model's name in folder names and reports (default: from --policy)")
    add_episode_arguments(parser)
    add_engine_arguments(parser, "runs")
    add_backend_option_argument(parser)
    add_component_arguments(parser)
    add_openai_arguments(parser)
    parser.add_argument("--force", action="store_true",
                        help="resume a folder made with other settings anyway (report shows each settings as its "
                        "own row)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    """Play the suite's unfinished runs; the exit status is the number of runs that did not end (0 when all did)."""
    from ..evaluation import suite
    from ..registry import registry

    options = backend_options(args.backend_option)
    specs = [with_changes(registry.spec(task), max_steps=args.max_steps, training_timeout=args.training_timeout,
                          options=options, components=component_choices(args)) for task in dict.fromkeys(args.tasks)]
    policy = policy_text(args)
    check_policy(policy)
    model = suite.safe_name(args.model_name) if args.model_name else suite.policy_model_name(args.policy)
    engine = None
    if args.ray is not None:
        from ..ray_runtime import import_ray

        import_ray()
        engine = "ray"
    elif args.num_envs > 1:
        engine = "process"
    out = Path(args.out)
    runs = suite.plan(specs, model, args.runs, out)
    if engine != "ray":  # Ray actors may reach an endpoint that this machine cannot
        check_endpoint(policy)
    bar = None if args.quiet else SuiteBar(len(runs), f"{model}: runs done")
    runtime = contextlib.nullcontext()
    if engine == "ray":  # one runtime for the whole suite, not one per batch of runs
        from ..ray_runtime import ray_session

        runtime = ray_session(args.ray or None)
    with OutFolder(out, resume=True), runtime:
        record = open_record(args, out, policy, model, specs, engine)
        try:
            progress, played = suite.play(runs, policy, num_envs=args.num_envs, engine=engine,
                                          address=args.ray or None, seed=args.seed, on_progress=bar, record=record)
        finally:
            if bar is not None:
                bar.close()
        close_record(out, record, progress.done, progress.failed)
    for run, result in played:
        print(f"{run.folder.name}: {printable(result.summary())}")
    print(f"{progress.total} runs in {out}: {progress.skipped} already finished, {progress.done} played now"
          + (f", {progress.failed} did not end" if progress.failed else ""))
    print_totals(record.get("totals") or {})
    print(f"summarise them with: mlgym-registry report {out} --out {out}/report")
    return min(progress.failed, MAX_FAILED_STATUS)


def open_record(args: argparse.Namespace, out: Path, policy: str, model: str, specs: list, engine: str | None) -> dict:
    """Check the folder's settings against this command's (``SettingsMismatch`` unless ``--force``) and open this
    session in its ``settings.json``."""
    from ..evaluation import settings

    asked = settings.suite_settings(policy=policy, model=model, max_steps=args.max_steps, seed=args.seed,
                                    training_timeout=args.training_timeout,
                                    backend_options=backend_options(args.backend_option),
                                    components=component_choices(args))
    hashes = {spec.id: settings.task_hash(spec) for spec in specs}
    mixed = settings.check_resume(out, asked, hashes, args.force)
    if mixed:
        print(f"mlgym-registry: warning: --force: mixing settings in {out}: {mixed[0]}", file=sys.stderr)
    recorded = {name: getattr(args, name, None) for name in ("timeout", "max_retries", "price_in", "price_out",
                                                             "num_envs", "runs")}
    recorded["engine"] = engine
    return settings.start_suite(out, asked, hashes, recorded, mixed)


def close_record(out: Path, record: dict, played: int, failed: int) -> None:
    """Close this session in the suite's ``settings.json``, with usage totals over the folder's runs."""
    from ..evaluation import settings

    settings.end_suite(out, record, (folder for folder in sorted(out.iterdir()) if folder.is_dir()), played, failed)


def print_totals(totals: dict) -> None:
    """One line of usage totals, when the policy records usage."""
    if not totals.get("api_calls") and not totals.get("runs_with_problems"):
        return
    print(f"usage over {totals['runs']} runs: {totals['api_calls']} calls, {totals['tokens_sent']} tokens sent, "
          f"{totals['tokens_received']} received, ${totals['task_cost']:.4f}"
          + (f"; {totals['runs_with_problems']} runs with problems (not scored by report)"
             if totals["runs_with_problems"] else ""))


class SuiteBar:
    """The progress bar of a suite: runs over, steps, the last scores and an estimate of the time left."""

    def __init__(self, total: int, label: str):
        self.bar = ProgressBar(total, label)
        self.started = time.monotonic()
        self.skipped: int | None = None

    def __call__(self, progress) -> None:
        if self.skipped is None:
            self.skipped = progress.skipped
        played = progress.finished - self.skipped
        left = progress.total - progress.finished
        if played and left:
            per_run = (time.monotonic() - self.started) / played
            eta = f", about {_duration(per_run * left)} left"
        else:
            eta = ""
        scores = f"; last: {', '.join(progress.last_scores)}" if progress.last_scores else ""
        self.bar.update(progress.finished, printable(f"({progress.steps} steps{eta}{scores})"))

    def close(self) -> None:
        """Finish the bar's line."""
        self.bar.close()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

