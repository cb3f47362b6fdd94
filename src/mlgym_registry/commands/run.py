"""``mlgym-registry run TASK``: play an episode with a policy, show it as it goes, and record it.

The episode is written to ``OUT/<task>.traj`` and ``OUT/results.json`` in MLGym's formats after every step, so an
interrupted run keeps every step it finished. ``--num-envs N`` plays N episodes at once in worker processes (through
TorchRL's multi-process collector); each is written to ``OUT/env<i>/``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from ..episode import Turn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``run``."""
    parser.add_argument("task", help="a registered task name (see `mlgym-registry list --kind task`)")
    parser.add_argument("--policy", default="scripted",
                        help="scripted (default), replay:PATH.traj, human, or transformers:MODEL_DIR")
    parser.add_argument("--max-steps", type=int, default=None, help="steps before autosubmission (default: the task's)")
    parser.add_argument("--seed", type=int, default=None, help="seed for the backend and the evaluator")
    parser.add_argument("--backend", default=None, help="backend name (default: the task's, usually 'local')")
    parser.add_argument("--out", default=None,
                        help="folder for the .traj and results.json (default: runs/<task>-<time>)")
    parser.add_argument("--num-envs", type=int, default=1, help="episodes to play at once, in worker processes")
    add_backend_option_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="show only the final score")


def add_backend_option_argument(parser: argparse.ArgumentParser) -> None:
    """``--training-timeout`` and ``-o KEY=VALUE`` (a backend option, repeatable; the value is read as JSON when it
    parses, else as text)."""
    parser.add_argument("--training-timeout", type=int, default=None, metavar="SECONDS",
                        help="how long evaluations and training commands may run (default: the task's)")
    parser.add_argument("-o", "--backend-option", action="append", default=[], metavar="KEY=VALUE",
                        help="backend option, e.g. -o command_timeout=10 -o long_timeout=60 (repeatable)")


def backend_options(pairs: list[str]) -> dict[str, object]:
    """The ``-o KEY=VALUE`` options as a dict (``60`` is a number, ``true`` a bool, anything else a string)."""
    import json

    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"mlgym-registry: a backend option must look like KEY=VALUE, got {pair!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def main(args: argparse.Namespace) -> int:
    """Run the episode(s); exit 0 when every episode ended (submitted or autosubmitted)."""
    from ..registry import registry

    if args.num_envs < 1:
        raise SystemExit("mlgym-registry run: --num-envs must be at least 1")
    if args.max_steps is not None and args.max_steps < 1:
        raise SystemExit("mlgym-registry run: --max-steps must be at least 1")
    spec = registry.spec(args.task)
    changes = {key: value for key, value in (("max_steps", args.max_steps), ("backend", args.backend),
                                             ("training_timeout", args.training_timeout)) if value}
    options = backend_options(args.backend_option)
    if options:
        changes["backend_options"] = {**spec.backend_options, **options}
    if changes:
        spec = registry.spec(spec.replace(**changes, components={}))
    out = Path(args.out or Path("runs") / f"{spec.id.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.num_envs > 1:
        return run_many(spec, args, out)
    return run_one(spec, args, out)


def run_one(spec, args: argparse.Namespace, out: Path, stream: TextIO | None = None) -> int:
    """One episode in this process, shown turn by turn."""
    from ..episode import run_episode
    from ..policies import make_policy
    from ..registry import registry
    from ..trajectories import TrajectoryWriter

    stream = stream or sys.stdout
    policy = make_policy(args.policy, task_id=spec.id)
    writer = TrajectoryWriter(out, spec.id, baseline=spec.baseline, environment=f"mlgym_registry:{spec.backend}")
    if not args.quiet:
        stream.write(f"task {spec.id} on backend {spec.backend!r}, up to {spec.max_steps} steps, policy "
                     f"{args.policy}; recording to {writer.traj_path}\n")
        stream.flush()
    env = registry.make(spec)
    try:
        on_turn = None if args.quiet else Transcript(stream)
        with terminate_as_exit():
            result = run_episode(env, policy, spec=spec, writer=writer, on_turn=on_turn, seed=args.seed)
    finally:
        with sigint_deferred():
            env.close()
            policy.close()
    stream.write(result.summary() + "\n")
    if result.stop_reason:
        stream.write(f"the episode did not end: {result.stop_reason}\n")
    stream.write(f"wrote {writer.traj_path} and {writer.results_path}\n")
    stream.flush()
    return 0 if result.finished else 1


def run_many(spec, args: argparse.Namespace, out: Path) -> int:
    """N episodes at once in worker processes, with a progress bar."""
    from ..parallel import run_parallel

    bar = ProgressBar(args.num_envs, f"{spec.id}: episodes done")
    results = run_parallel(spec, args.policy, args.num_envs, out=out, seed=args.seed,
                           on_step=lambda finished, steps: bar.update(finished, f"({steps} steps)"))
    bar.close()
    for index, result in enumerate(results):
        print(f"env {index}: {result.summary()}")
    print(f"wrote {out}/env<i>/{spec.id}.traj and results.json for {len(results)} episodes")
    return 0 if all(result.finished for result in results) else 1


@contextmanager
def terminate_as_exit():
    """Turn SIGTERM into ``SystemExit(143)`` so that clean-up (``finally``) runs as it does for Ctrl-C."""

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigint_deferred():
    """Hold a Ctrl-C that arrives while cleaning up until the clean-up is done (then raise it)."""
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


# -- showing an episode ------------------------------------------------------------------------------------------
OBSERVATION_LINES = 4
OBSERVATION_WIDTH = 100


def shorten(text: str, lines: int = OBSERVATION_LINES, width: int = OBSERVATION_WIDTH) -> str:
    """The first ``lines`` lines of ``text``, each cut at ``width`` characters, with a note of what was left out."""
    all_lines = text.splitlines() or [""]
    shown = [line if len(line) <= width else line[: width - 3] + "..." for line in all_lines[:lines]]
    if len(all_lines) > lines:
        shown.append(f"[... {len(all_lines) - lines} more lines]")
    return "\n".join(shown)


def indent(text: str, prefix: str = "      ") -> str:
    """``text`` with every line indented by ``prefix``."""
    return "\n".join(prefix + line for line in text.splitlines())


def format_turn(turn: Turn) -> str:
    """A turn as a few lines: step number and action, the observation shortened, the reward."""
    if turn.format_error:
        head = f"[{turn.index + 1:>3}] (no command: {turn.observation})"
        return f"{head}\n      reward {turn.reward:+.4f}"
    action_lines = turn.action.strip().splitlines() or [""]
    action = action_lines[0] + (f"  [+{len(action_lines) - 1} lines]" if len(action_lines) > 1 else "")
    parts = [f"[{turn.index + 1:>3}] {action}"]
    if turn.observation.strip():
        parts.append(indent(shorten(turn.observation)))
    parts.append(f"      reward {turn.reward:+.4f}" + ("  (done)" if turn.done else ""))
    return "\n".join(parts)


class Transcript:
    """Prints each turn as it happens."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def __call__(self, turn: Turn) -> None:
        self.stream.write(format_turn(turn) + "\n")
        self.stream.flush()


class ProgressBar:
    """A one-line progress bar over ``total`` units (redrawn in place on a terminal, a line per update elsewhere)."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 30,
                 min_interval: float = 1.0):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.done = 0
        self.note = ""
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = 0.0 if self.tty else min_interval
        self._last = 0.0

    def update(self, done: int | None = None, note: str = "", *, force: bool = False) -> None:
        """Set progress to ``done`` units (or one more) and redraw."""
        self.done = self.done + 1 if done is None else done
        self.note = note or self.note
        now = time.monotonic()
        if not force and now - self._last < self.min_interval and self.done < self.total:
            return
        self._last = now
        filled = int(self.width * min(self.done, self.total) / self.total)
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {self.note}"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Finish the bar's line."""
        self.update(self.done, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
