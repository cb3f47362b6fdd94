"""``mlgym-registry bench TASK... --policy P --runs K --out DIR``: K runs of each task, in MLGym's layout.

Each run is written to ``DIR/<model>__<task>__run_<k>/`` (``<task>.traj`` and ``results.json``) as it goes. The same
command again skips the runs that finished and plays the others from scratch, so an interrupted suite resumes where
it stopped. ``--num-envs N`` keeps N runs going at once, in N worker processes started once for the suite.
``mlgym-registry report DIR`` turns the folder into MLGym's tables.

The exit status says how the suite went (``EXIT_*``): 0 every run ended, 1 some runs did not end well (their API
failed, their worker died), 2 the command was refused (bad options, a folder made with other settings or in use), 3
the suite was interrupted (Ctrl-C or SIGTERM) before its runs were over: run the same command again to resume.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from ..options import cli_integer
from ..terminal import printable
from .out_folder import OutFolder
from .run import (
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
from .signals import on_sigterm, sigint_deferred

EXIT_DONE = 0
"""Every run of the suite ended (now or before)."""
EXIT_RUNS_FAILED = 1
"""The suite went through, but some runs did not end well (``exit_api``, a worker died): a resume plays them again."""
EXIT_REFUSED = 2
"""The command was refused before anything was played (``mlgym-registry: error: ...``), as for every command."""
EXIT_INTERRUPTED = 3
"""Ctrl-C or SIGTERM stopped the suite before its runs were over; the same command resumes it."""


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
    """Play the suite's unfinished runs; the exit status is ``EXIT_DONE``, ``EXIT_RUNS_FAILED`` or
    ``EXIT_INTERRUPTED`` (``EXIT_REFUSED`` comes from the errors raised before anything is played)."""
    from ..evaluation import suite
    from ..registry import registry

    options = backend_options(args.backend_option)
    specs = [with_changes(registry.spec(task), max_steps=args.max_steps, training_timeout=args.training_timeout,
                          options=options, components=component_choices(args)) for task in dict.fromkeys(args.tasks)]
    policy = policy_text(args)
    check_policy(policy)
    check_replayed_record(policy, specs, options)
    model = suite.safe_name(args.model_name) if args.model_name else suite.policy_model_name(args.policy)
    engine = None
    if args.ray is not None:
        from ..scale.ray_runtime import check_ray

        check_ray(args.ray)
        engine = "ray"
    elif args.num_envs > 1:
        from ..scale.workers import start_worker_server

        engine = "process"
        start_worker_server()  # the workers' server imports torch and TorchRL while this process goes on
    out = Path(args.out)
    runs = suite.plan(specs, model, args.runs, out)
    if engine != "ray":  # Ray actors may reach an endpoint that this machine cannot
        check_endpoint(policy)
    bar = None if args.quiet else SuiteBar(len(runs), model)
    runtime = contextlib.nullcontext()
    if engine == "ray":  # one runtime for the whole suite, not one per batch of runs
        from ..scale.ray_runtime import ray_session

        runtime = ray_session(args.ray or None)
    started = time.monotonic()
    with OutFolder(out, resume=True), runtime:
        record = open_record(args, out, policy, model, specs, engine)
        finished_before = sum(run.finished for run in runs)
        try:
            with interrupts_as_keyboard():
                progress, played = suite.play(runs, policy, num_envs=args.num_envs, engine=engine,
                                              address=args.ray or None, seed=args.seed, on_progress=bar,
                                              record=record)
        except KeyboardInterrupt:
            with sigint_deferred():
                return interrupted(out, record, runs, finished_before, bar)
        finally:
            if bar is not None:
                bar.close()
        close_record(out, record, progress.done, progress.failed)
    for run, result in played:
        print(f"{run.folder.name}: {printable(result.summary())}")
    print(f"{progress.total} runs in {out}: {progress.skipped} already finished, {progress.done} played now"
          + (f", {progress.failed} did not end" if progress.failed else "")
          + f" ({_duration(time.monotonic() - started)})")
    print_totals(model, record.get("totals") or {})
    print(f"summarise them with: mlgym-registry report {out} --out {out}/report")
    if progress.failed:
        print(f"{progress.failed} runs did not end well; run the same command again to play them again")
        return EXIT_RUNS_FAILED
    return EXIT_DONE


def check_replayed_record(policy: str, specs: list, options: dict) -> None:
    """A ``replay:PATH`` policy plays the recorded actions only: nothing else is taken from the run's record, and a
    record whose backend options differ from the ones each task is benched with refuses the suite
    (``RecordedSettingsRefused``) until ``-o KEY=VALUE`` passes them again (``records.trust``)."""
    from ..records.trust import TypedSettings, check_record, read_record

    kind, _, path = str(policy).partition(":")
    settings = read_record(path) if kind == "replay" and path else None
    if settings is None:
        return
    for spec in specs:
        check_record(path, settings, spec, TypedSettings(options=dict(options)), kinds=("option",))


def interrupted(out: Path, record: dict, runs: list, finished_before: int, bar: SuiteBar | None) -> int:
    """Close the session of an interrupted suite and say how far it got; ``EXIT_INTERRUPTED``."""
    if bar is not None:
        bar.close()
    finished = sum(run.finished for run in runs)
    close_record(out, record, finished - finished_before, len(runs) - finished)
    print(f"mlgym-registry: interrupted: {finished} of {len(runs)} runs finished in {out}; run the same command "
          f"again to resume", file=sys.stderr)
    return EXIT_INTERRUPTED


@contextlib.contextmanager
def interrupts_as_keyboard() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` here, as Ctrl-C does, so both end the suite the same clean way."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with on_sigterm(stop):
        yield


def open_record(args: argparse.Namespace, out: Path, policy: str, model: str, specs: list, engine: str | None) -> dict:
    """Check the folder's settings against this command's (``SettingsMismatch`` unless ``--force``) and open this
    session in its ``settings.json``."""
    from ..evaluation import settings
    from ..records.provenance import task_hash

    asked = settings.suite_settings(policy=policy, model=model, max_steps=args.max_steps, seed=args.seed,
                                    training_timeout=args.training_timeout,
                                    backend_options=backend_options(args.backend_option),
                                    components=component_choices(args))
    hashes = {spec.id: task_hash(spec) for spec in specs}
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


def print_totals(model: str, totals: dict) -> None:
    """The model's usage over the folder's runs, when the policy records usage: calls, tokens, cost, retries, time
    spent waiting for the model and wall time; answers without usage (their cost unknown) are named."""
    if not totals.get("api_calls") and not totals.get("runs_with_problems"):
        return
    calls = totals["api_calls"]
    per_call = totals.get("model_seconds", 0) / calls if calls else 0.0
    print(f"usage of {model} over {totals['runs']} runs: {calls} calls ({totals.get('api_retries', 0)} retries), "
          f"{totals['tokens_sent']} tokens sent, {totals['tokens_received']} received, "
          f"${totals['task_cost']:.4f}; model {totals.get('model_seconds', 0):.1f} s ({per_call:.2f} s per call, "
          f"longest {totals.get('max_call_seconds', 0):.2f} s), wall {totals.get('wall_seconds', 0):.1f} s"
          + (f"; {totals['truncated_responses']} answers cut at the token limit (finish_reason length)"
             if totals.get("truncated_responses") else ""))
    if totals.get("missing_usage"):
        print(f"WARNING: {totals['missing_usage']} answers came without usage: their tokens and cost are unknown (not "
              f"counted), so the cost above is a lower bound")
    if totals["runs_with_problems"]:
        print(f"{totals['runs_with_problems']} runs with problems (not scored by report)")


class SuiteBar:
    """The progress line of a suite: runs finished of all, runs in flight, failures, cost so far, steps, the time
    left and the last scores.

    On a terminal it is one line, cut to the terminal's width and redrawn in place (``\\r``) at every step; elsewhere
    (a log file, a pipe) a whole plain line is written whenever a run ends, never for a step alone.
    """

    def __init__(self, total: int, label: str, stream: TextIO | None = None):
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.skipped: int | None = None
        self._shown = ""
        self._ended = -1

    def __call__(self, progress) -> None:
        if self.skipped is None:
            self.skipped = progress.skipped
        if self.tty:
            self._draw(fit(self.text(progress), terminal_width()))
        elif progress.finished != self._ended:
            self._ended = progress.finished
            self.stream.write(self.text(progress) + "\n")
            self.stream.flush()

    def text(self, progress) -> str:
        """The whole line, most important first (``fit`` cuts its end)."""
        played = progress.finished - (self.skipped or 0)
        left = progress.total - progress.finished
        parts = [f"{self.label}: {progress.finished}/{progress.total} runs finished", f"{progress.in_flight} in flight",
                 f"{progress.failed} failed", f"${progress.cost:.4f}", f"{progress.steps} steps"]
        if played and left:
            per_run = (time.monotonic() - self.started) / played
            parts.append(f"about {_duration(per_run * left)} left")
        line = ", ".join(parts)
        if progress.last_scores:
            line += f"; last: {', '.join(progress.last_scores)}"
        return printable(line)

    def _draw(self, line: str) -> None:
        if line == self._shown:
            return
        padding = " " * max(0, len(self._shown) - len(line))  # rub out the end of a longer line drawn before
        self.stream.write("\r" + line + padding)
        self.stream.flush()
        self._shown = line

    def close(self) -> None:
        """End the line on a terminal."""
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = ""


def terminal_width() -> int:
    """The terminal's width in columns (80 when there is none)."""
    return shutil.get_terminal_size((80, 24)).columns


def fit(line: str, width: int) -> str:
    """``line`` cut to ``width - 1`` characters (a full line would wrap on some terminals), ``...`` marking a cut."""
    room = max(width - 1, 10)
    return line if len(line) <= room else line[: room - 3] + "..."


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

