"""``mlgym-registry run TASK``: play an episode with a policy, show it as it goes, and record it.

The episode is written to ``OUT/<task>.traj`` and ``OUT/results.json`` in MLGym's formats after every step, so an
interrupted run keeps every step it finished. ``--num-envs N`` plays N episodes at once in worker processes (through
TorchRL's multi-process collector); each is written to ``OUT/env<i>/``.

``OUT`` belongs to one run: a folder that already holds a run (a ``.traj``, ``results.json`` or
``replay-report.json``, at its top or in a sub-folder) is refused, and so is a folder another run is writing to right
now (each run holds an exclusive lock on ``OUT/.mlgym-registry.lock`` while it runs). Every option is checked before
the folder is created, so a refused command leaves nothing behind.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import MLGymRegistryError
from ..terminal import printable
from ..validation import InvalidOptionError, cli_integer

if TYPE_CHECKING:
    from ..episode import Turn
    from ..specs import TaskSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``run``."""
    parser.add_argument("task", help="a registered task name (see `mlgym-registry list --kind task`) or a task "
                                     "YAML file")
    parser.add_argument("--policy", default="scripted",
                        help="scripted (default), replay:PATH.traj, human, transformers:MODEL_DIR, or openai:MODEL "
                        "(a model behind an OpenAI-compatible endpoint; see the openai policy's options)")
    add_episode_arguments(parser)
    parser.add_argument("--backend", default=None, help="backend name (default: the task's, usually 'local')")
    parser.add_argument("--out", default=None,
                        help="a new folder for the .traj and results.json (default: runs/<task>-<time>); "
                        "a folder that already holds a run is refused")
    add_engine_arguments(parser, "episodes")
    parser.add_argument("--episodes", type=cli_integer(1), default=None, metavar="E",
                        help="episodes to play in all (default: one per env); a multiple of --num-envs, each env "
                        "playing E / N in a row, written to OUT/env<i>-<k>/")
    parser.add_argument("--cpus-per-env", type=float, default=None, metavar="N",
                        help="with --ray: CPUs each actor asks for (default: what lets every env run at once, "
                        "at most 1)")
    add_backend_option_argument(parser)
    add_component_arguments(parser)
    add_openai_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="show only the final score")


OPENAI_OPTIONS = ("base_url", "api_key_env", "temperature", "top_p", "max_tokens", "timeout", "max_retries",
                  "price_in", "price_out", "cost_limit")
"""The ``OpenAIPolicy`` options the command line sets (``--base-url`` sets ``base_url``, and so on)."""


def add_openai_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``--policy openai:MODEL`` (refused with any other policy)."""
    group = parser.add_argument_group("openai policy (--policy openai:MODEL)")
    group.add_argument("--base-url", default=None, metavar="URL",
                       help="the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 for vLLM or transformers "
                       "serve (default: OPENAI_BASE_URL, else OpenAI's API)")
    group.add_argument("--api-key-env", default=None, metavar="NAME",
                       help="the environment variable holding the API key (default: OPENAI_API_KEY)")
    group.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the server's)")
    group.add_argument("--top-p", type=float, default=None, help="nucleus sampling's top-p (default: the server's)")
    group.add_argument("--max-tokens", type=cli_integer(1), default=None,
                       help="most tokens per response (default: the server's)")
    group.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="how long each call may take (default: 300)")
    group.add_argument("--max-retries", type=cli_integer(0), default=None,
                       help="retries of a call after a rate limit, a server error or a dropped connection (default: 5)")
    group.add_argument("--price-in", type=float, default=None, metavar="USD",
                       help="price per million tokens sent, for the cost in model_stats (default: 0)")
    group.add_argument("--price-out", type=float, default=None, metavar="USD",
                       help="price per million tokens received (default: 0)")
    group.add_argument("--cost-limit", type=float, default=None, metavar="DOLLARS",
                       help="end an episode (a run) with MLGym's exit_cost once its cost reaches DOLLARS; the env "
                       "autosubmits (needs --price-in/--price-out)")


def policy_text(args: argparse.Namespace) -> str:
    """``--policy`` with the openai policy's options attached (a ``PolicyText``), so that worker processes build the
    same policy; ``InvalidOptionError`` when those options are given to another policy."""
    from ..policies import PolicyText

    options = {name: getattr(args, name) for name in OPENAI_OPTIONS if getattr(args, name, None) is not None}
    if not options:
        return args.policy
    if args.policy.partition(":")[0] != "openai":
        flags = ", ".join("--" + name.replace("_", "-") for name in options)
        raise InvalidOptionError(f"{flags}: only the openai policy takes these options (--policy openai:MODEL), "
                                 f"not --policy {args.policy}")
    return PolicyText(args.policy, options)


def add_episode_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-steps`` and ``--seed``, checked by argparse (an integer >= 1, an integer >= 0)."""
    parser.add_argument("--max-steps", type=cli_integer(1), default=None,
                        help="steps before autosubmission (default: the task's)")
    parser.add_argument("--seed", type=cli_integer(0), default=None,
                        help="seed of the run; the evaluator's seed is derived from it (an integer >= 0)")


def add_engine_arguments(parser: argparse.ArgumentParser, unit: str) -> None:
    """``--num-envs N`` and ``--ray [ADDRESS]``: how many ``unit`` (episodes, runs) to play at once, and where."""
    parser.add_argument("--num-envs", type=cli_integer(1), default=1,
                        help=f"{unit} to play at once, in worker processes (or Ray actors with --ray)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help=f"play the {unit} as Ray actors: on the cluster at ADDRESS (host:port, ray://host:port "
                        "or auto), or on a local runtime started for this run when no ADDRESS is given "
                        "(needs: pip install 'mlgym-registry[ray]')")


COMPONENT_OPTIONS = ("parser", "template", "reward", "isolator", "history")
"""The task's components the command line can swap (``--parser NAME`` and so on)."""


def add_component_arguments(parser: argparse.ArgumentParser) -> None:
    """``--parser``, ``--template``, ``--reward``, ``--isolator`` and ``--history``: another registered component than
    the task's."""
    group = parser.add_argument_group("components (default: the task's own; see `mlgym-registry list --kind KIND`)")
    for kind in COMPONENT_OPTIONS:
        group.add_argument(f"--{kind}", default=None, metavar="NAME", help=f"a registered {kind} to use instead")


def component_choices(args: argparse.Namespace) -> dict[str, str]:
    """The components the command line swapped in (``{"parser": "tagged"}``)."""
    return {kind: getattr(args, kind) for kind in COMPONENT_OPTIONS if getattr(args, kind, None)}


def add_backend_option_argument(parser: argparse.ArgumentParser) -> None:
    """``--training-timeout`` and ``-o KEY=VALUE`` (a backend option, repeatable; the value is read as JSON when it
    parses, else as text)."""
    parser.add_argument("--training-timeout", type=cli_integer(1), default=None, metavar="SECONDS",
                        help="how long evaluations and training commands may run (default: the task's)")
    parser.add_argument("-o", "--backend-option", action="append", default=[], metavar="KEY=VALUE",
                        help="backend option, e.g. -o command_timeout=10 -o long_timeout=60 (repeatable)")


def backend_options(pairs: list[str]) -> dict[str, object]:
    """The ``-o KEY=VALUE`` options as a dict (``60`` is a number, ``true`` a bool, anything else a string)."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidOptionError(f"-o {pair!r}: a backend option must look like KEY=VALUE (-o command_timeout=10)")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def with_changes(spec: TaskSpec, *, max_steps: int | None = None, backend: str | None = None,
                 training_timeout: int | None = None, options: dict[str, Any] | None = None,
                 components: dict[str, str] | None = None) -> TaskSpec:
    """``spec`` with the command line's changes, checked the way ``registry.make`` checks them (nothing is built):
    an unknown component name fails here, with the names registered for its kind."""
    from ..registry import registry

    changes: dict[str, Any] = {key: value for key, value in (("max_steps", max_steps), ("backend", backend),
                                                             ("training_timeout", training_timeout)) if value}
    changes.update(components or {})
    if options:
        changes["backend_options"] = {**spec.backend_options, **options}
    if changes:
        spec = registry.spec(spec.replace(**changes, components={}))
    registry.resolve(spec)  # unknown backend options, values out of range: refused now, before any file is written
    return spec


def main(args: argparse.Namespace) -> int:
    """Run the episode(s); exit 0 when every episode ended (submitted or autosubmitted)."""
    from ..registry import registry

    apply_recorded_settings(args)
    spec = with_changes(registry.spec(args.task), max_steps=args.max_steps, backend=args.backend,
                        training_timeout=args.training_timeout, options=backend_options(args.backend_option),
                        components=component_choices(args))
    check_policy(policy_text(args))
    if args.cpus_per_env is not None and not args.cpus_per_env > 0:
        raise InvalidOptionError(f"--cpus-per-env {args.cpus_per_env:g}: each actor needs a CPU share above 0 "
                                 f"(e.g. 0.5)")
    if args.ray is not None:
        from ..ray_runtime import import_ray

        import_ray()  # without the extra: say how to install it, before any folder is made
    elif args.cpus_per_env is not None:
        raise InvalidOptionError("--cpus-per-env is for --ray runs; add --ray (or --ray ADDRESS)")
    episodes_per_env(args)  # a count that does not divide among the envs: refused before any folder is made
    out = Path(args.out) if args.out else default_out(spec.id.replace("/", "_"))
    with OutFolder(out):
        if args.num_envs > 1 or args.ray is not None or episodes_per_env(args) > 1:
            return run_many(spec, args, out)
        return run_one(spec, args, out)


def apply_recorded_settings(args: argparse.Namespace) -> None:
    """For ``--policy replay:PATH`` of a run we recorded: what the command line leaves unset (seed, max steps,
    components, backend and its options) as the run recorded them, so that the replay plays the run again."""
    from ..provenance import recorded_components, recorded_run

    kind, _, path = policy_text(args).partition(":")
    record = recorded_run(path) if kind == "replay" and path else None
    if record is None:
        return
    if args.seed is None:
        args.seed = record.get("seed")
    if args.max_steps is None:
        args.max_steps = record.get("max_steps")
    components = recorded_components(record)
    if args.backend is None:
        args.backend = components.pop("backend", None)
    for kind_, name in components.items():
        if getattr(args, kind_, None) is None:
            setattr(args, kind_, name)
    recorded_options = [f"{key}={json.dumps(value)}" for key, value in (record.get("backend_options") or {}).items()]
    args.backend_option = recorded_options + list(args.backend_option)  # the command line's come last and win


def check_policy(text: str) -> None:
    """Refuse a ``replay:PATH`` policy whose file is not a readable ``.traj``, and an ``openai:MODEL`` policy whose
    options are wrong (or whose package is missing), before anything is written."""
    kind, _, argument = text.partition(":")
    if kind == "replay" and argument:
        from ..trajectories import load_recorded

        load_recorded(Path(argument))
    if kind == "openai":
        from ..policies import make_policy

        make_policy(text)  # checks the options; nothing connects before the first call


def run_one(spec, args: argparse.Namespace, out: Path, stream: TextIO | None = None) -> int:
    """One episode in this process, shown turn by turn."""
    from ..episode import run_episode
    from ..policies import make_policy
    from ..registry import registry
    from ..trajectories import TrajectoryWriter

    stream = stream or sys.stdout
    policy = make_policy(policy_text(args), task_id=spec.id)
    writer = TrajectoryWriter(out, spec.id, baseline=spec.baseline, environment=f"mlgym_registry:{spec.backend}")
    notice = getattr(policy, "notice", None)
    if callable(notice) and notice(spec.id):
        print(f"mlgym-registry run: note: {printable(notice(spec.id))}", file=sys.stderr)
    if not args.quiet:
        stream.write(f"task {spec.id} on backend {spec.backend!r}, up to {spec.max_steps} steps, policy "
                     f"{printable(args.policy)}; recording to {writer.traj_path}\n")
        stream.flush()
    env = registry.make(spec, batch_size=())
    try:
        on_turn = None if args.quiet else Transcript(stream)
        with terminate_as_exit():
            result = run_episode(env, policy, spec=spec, writer=writer, on_turn=on_turn, seed=args.seed)
    finally:
        with sigint_deferred():
            env.close()
            policy.close()
    stream.write(printable(result.summary()) + "\n")
    if result.stop_reason:
        stream.write(f"the episode did not end: {printable(result.stop_reason)}\n")
    stream.write(f"wrote {writer.traj_path} and {writer.results_path}\n")
    stream.flush()
    return 0 if result.finished else 1


def check_endpoint(text: str) -> None:
    """Check that the server of a policy that talks to one (the openai policy) answers and serves its model.

    For runs in worker processes, where a policy that fails in a worker stops the whole run with that worker's
    traceback; Ray actors are not checked from here, since the endpoint may be reachable from the cluster's nodes only.
    """
    from ..policies import make_policy

    policy = make_policy(text)
    try:
        check = getattr(policy, "check_endpoint", None)
        if check is not None:
            check()
    finally:
        policy.close()


MAX_FAILED_STATUS = 100
"""The exit status of a many-episode run is the number of episodes that did not end, capped here."""


def episodes_per_env(args: argparse.Namespace) -> int:
    """How many episodes each env plays in a row: ``--episodes`` over ``--num-envs`` (1 without ``--episodes``);
    ``InvalidOptionError`` when they do not divide."""
    episodes = getattr(args, "episodes", None)
    if episodes is None:
        return 1
    if episodes % args.num_envs:
        raise InvalidOptionError(f"--episodes {episodes} does not divide among --num-envs {args.num_envs}: give a "
                                 f"multiple of {args.num_envs} (each env plays the same number of episodes)")
    return episodes // args.num_envs


def run_many(spec, args: argparse.Namespace, out: Path) -> int:
    """Episodes in worker processes or Ray actors, ``--num-envs`` at once, with a progress bar. The exit status is
    the number of episodes that did not end (0 when all did)."""
    engine = "process" if args.ray is None else "ray"
    if engine == "process":
        from ..workers import start_worker_server

        # the workers' server imports torch and TorchRL while this process does the same, on another core
        start_worker_server()
    from ..episode_runs import run_episodes

    if engine == "process":
        check_endpoint(policy_text(args))
    per_env = episodes_per_env(args)
    where = "" if engine == "process" else f" on Ray ({args.ray or 'a local runtime'})"
    bar = ProgressBar(args.num_envs * per_env, f"{spec.id}: episodes done{where}")
    try:
        results = run_episodes(spec, policy_text(args), args.num_envs, engine=engine, address=args.ray or None,
                               cpus_per_env=args.cpus_per_env, out=out, seed=args.seed, episodes_per_env=per_env,
                               on_step=lambda finished, steps: bar.update(finished, f"({steps} steps)"))
    finally:
        bar.close()
    for position, result in enumerate(results):
        index, number = divmod(position, per_env)
        label = f"env {index}" if per_env == 1 else f"env {index} episode {number}"
        print(f"{label}: {printable(result.summary())}")
    folder = "env<i>" if per_env == 1 else "env<i>-<k>"
    print(f"wrote {out}/{folder}/{spec.id}.traj and results.json for {len(results)} episodes")
    failed = sum(not result.finished or bool(result.failure) for result in results)
    if failed:
        print(f"{failed} of {len(results)} episodes did not end")
    return min(failed, MAX_FAILED_STATUS)


# -- the --out folder --------------------------------------------------------------------------------------------
def default_out(stem: str) -> Path:
    """``runs/<stem>-<time>``, or ``runs/<stem>-<time>-<n>`` when a run started in the same second took that."""
    base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, number = base, 1
    while candidate.exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


LOCK_NAME = ".mlgym-registry.lock"
"""The file in ``--out`` a run holds an exclusive ``flock`` on while it runs (removed when it ends)."""

RUN_FILES = ("*.traj", "results.json", "replay-report.json")
"""Files that show a folder already holds a run (at its top, or in a sub-folder such as ``env<i>/``)."""

LOCK_ATTEMPTS = 20


class OutFolderError(MLGymRegistryError):
    """An ``--out`` folder this run may not write to: a file, a folder that holds a run, or one in use."""


class OutFolder:
    """Exclusive use of an ``--out`` folder for one run, as a context manager.

    On entry the folder is created when missing, locked (``flock`` on ``LOCK_NAME``; the kernel drops the lock when
    the process dies, so a killed run never blocks the folder) and checked to hold no earlier run; any of these
    failing raises ``OutFolderError``. On exit the lock file is removed, and the folder too when this run created it
    and wrote nothing. A run that finds the lock taken fails at once rather than wait: of several runs started with
    the same ``--out`` exactly one proceeds. With ``resume`` a folder holding earlier runs is accepted (a suite
    continues where it stopped).
    """

    def __init__(self, path: Path, *, resume: bool = False):
        self.path = Path(path)
        self.resume = resume
        self.lock_path = self.path / LOCK_NAME
        self._fd: int | None = None
        self._created = False

    def __enter__(self) -> OutFolder:
        self.claim()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def claim(self) -> None:
        """Create, lock and check the folder (``OutFolderError`` when this run may not use it)."""
        self._make_folder()
        self._lock()
        if self.resume:
            return
        try:
            found = existing_run(self.path)
        except OSError as exc:
            self.release()
            raise self._error(f"cannot be read ({exc.strerror or exc}); choose another --out") from None
        if found is not None:
            self.release()
            raise self._error(f"already holds a run ({found}); choose another --out or remove that folder")

    def release(self) -> None:
        """Remove the lock file (while still holding the lock), unlock, and remove the folder if this run made it
        and it is empty."""
        if self._fd is None:
            return
        try:
            self.lock_path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
        if self._created:
            try:
                self.path.rmdir()
            except OSError:
                pass  # the run wrote something: keep it

    def _error(self, problem: str) -> OutFolderError:
        return OutFolderError(f"--out {str(self.path)!r} {problem}")

    def _make_folder(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise self._error("is a file, not a folder; choose another --out")
        try:
            self.path.mkdir(parents=True)
            self._created = True
        except FileExistsError:
            if not self.path.is_dir():
                raise self._error("is a file, not a folder; choose another --out") from None
        except OSError as exc:
            raise self._error(f"cannot be created ({exc.strerror or exc}); choose another --out") from None

    def _lock(self) -> None:
        """Hold an exclusive lock on the lock file that is at ``lock_path`` now.

        A run removes its lock file before unlocking, so a lock won on a file already removed is worth nothing:
        try again on the new file.
        """
        for _ in range(LOCK_ATTEMPTS):
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # the run that created the folder removed it on the way out
                self._make_folder()
                continue
            except OSError as exc:
                raise self._error(f"cannot be written to ({exc.strerror or exc}); choose another --out") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._error("is in use by another run right now; choose another --out") from None
            if _same_file(fd, self.lock_path):
                self._fd = fd
                return
            os.close(fd)
        raise self._error("is in use by another run right now; choose another --out")


def _same_file(fd: int, path: Path) -> bool:
    """True when the open file ``fd`` is the file at ``path``."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def existing_run(folder: Path) -> Path | None:
    """A file of an earlier run in ``folder`` or one of its sub-folders (``env<i>/``), or None."""
    places = [folder, *sorted(child for child in folder.iterdir() if child.is_dir())]
    for place in places:
        for pattern in RUN_FILES:
            for match in sorted(place.glob(pattern)):
                if match.is_file():
                    return match
    return None


@contextmanager
def terminate_as_exit():
    """Turn SIGTERM into ``SystemExit(143)`` so that clean-up (``finally``) runs as it does for Ctrl-C."""

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    with on_sigterm(stop):
        yield


@contextmanager
def on_sigterm(handler):
    """Call ``handler`` on SIGTERM while the block runs (the previous handler comes back after); a no-op outside
    the main thread, where Python cannot set signal handlers."""
    try:
        previous = signal.signal(signal.SIGTERM, handler)
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
        self.stream.write(printable(format_turn(turn)) + "\n")
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
        self._line = ""

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
        if line == self._line and not self.tty:
            return
        self._line = line
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Finish the bar's line."""
        self.update(self.done, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
