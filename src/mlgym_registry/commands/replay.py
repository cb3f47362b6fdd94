"""``mlgym-registry replay PATH.traj``: send a recorded MLGym run's responses through our env and compare.

Every recorded response goes to the env in order. The report lists, per step, the recorded action, the kind of
observation MLGym gave and the kind ours gave, then the final scores side by side. It is printed and written to
``OUT/replay-report.json``, next to our own ``.traj`` and ``results.json`` of the replayed episode.

The task defaults to ``mlgym/<id>`` when an MLGym checkout is registered, else to our own task of that id, with a
warning: recorded ``edit N:M`` commands were aimed at MLGym's starter files, whose line numbers ours need not share.

``OUT`` follows ``run``'s rule: a folder that already holds a run, or that another run is writing to, is refused.

A run this package recorded replays on the task, components, seed and max steps its record names; nothing that
decides confinement or trust (the backend, its options) is taken from a record, and one that differs from what this
command would use refuses the replay until the command line passes it again (``records.trust``). Starter files rebuilt
from the recorded windows are only the agent's own: the evaluator, protected files and data always come from the task.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..machine import usable_cores
from ..records.recorded_files import first_windows, task_kept, with_recorded_starters
from ..records.regular_files import split_regular
from ..records.trajectories import load_recorded
from ..records.trust import RecordSettings, check_record, read_record
from ..scores import mlgym_ranking_metric
from ..terminal import printable
from .out_folder import OutFolder, default_out
from .run import (
    add_backend_option_argument,
    add_component_arguments,
    add_episode_arguments,
    typed_settings,
    with_changes,
)
from .signals import sigint_deferred, terminate_as_exit
from .terminal_output import Transcript, shorten


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``replay``."""
    parser.add_argument("traj", metavar="PATH.traj", nargs="+",
                        help="an MLGym trajectory file; several files, or folders of them, replay in parallel")
    parser.add_argument("--jobs", type=positive_int, default=None,
                        help="replays run at once when several are given (default: the number of cores)")
    parser.add_argument("--task", default=None, help="task to replay on (default: mlgym/<id>, else our <id>)")
    parser.add_argument("--out", default=None, help="a new folder for the report, .traj and results.json (default: "
                        "runs/replay-<id>-<time>); a folder that already holds a run is refused")
    add_episode_arguments(parser)
    parser.add_argument("--backend", default=None, help="backend name (default: the task's, usually 'local'); a "
                        "recorded run never chooses it")
    parser.add_argument(
        "--starter-files", choices=("recorded", "task"), default=None,
        help="recorded: start from the file versions the run showed when it first opened them, so its "
        "line-numbered edits land where they did (default for MLGym's runs); task: the task's own files (default "
        "for runs this package recorded, which also replay on their recorded components, seed and options)",
    )
    add_component_arguments(parser)
    add_backend_option_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="print only the summary")


@dataclass
class StepComparison:
    """One replayed step: what MLGym's run did and saw, and what ours saw."""

    index: int
    action: str
    recorded_kind: str
    our_kind: str
    recorded_observation: str
    our_observation: str

    @property
    def same_kind(self) -> bool:
        """True when both observations are of the same kind."""
        return self.recorded_kind == self.our_kind


@dataclass
class ReplayReport:
    """The comparison of a recorded run with its replay through our env."""

    source: str
    task: str
    warnings: list[str] = field(default_factory=list)
    steps: list[StepComparison] = field(default_factory=list)
    recorded_scores: list[dict[str, Any]] = field(default_factory=list)
    our_scores: list[dict[str, Any]] = field(default_factory=list)
    recorded_exit_status: str = ""
    our_exit_status: str = ""
    baseline: dict[str, Any] | None = None
    completed: bool = False
    note: str = ""

    @property
    def matching_kinds(self) -> int:
        """How many steps got an observation of the same kind as in the recording."""
        return sum(step.same_kind for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["matching_kinds"] = self.matching_kinds
        return data


def default_task(trajectory_path: Path, environment: str = "mlgym_main") -> tuple[str, list[str]]:
    """The task to replay on and any warning: ``mlgym/<id>`` when registered, else our ``<id>``.

    The id is the file's stem (MLGym writes ``<id>.traj``) or its folder's name. ``environment`` is the ``.traj``'s
    own: a recording made by this package on one of our tasks needs no warning.
    """
    from ..registry import registry

    tasks = set(registry.names("task"))
    candidates = [c for c in (trajectory_path.stem, trajectory_path.parent.name) if c]
    for candidate in candidates:
        if f"mlgym/{candidate}" in tasks:
            return f"mlgym/{candidate}", []
    for candidate in candidates:
        if candidate in tasks and environment.startswith("mlgym_registry"):
            return candidate, []
        if candidate in tasks:
            return candidate, [
                f"no MLGym checkout provides mlgym/{candidate}; replaying on our own task {candidate!r}. The recorded "
                f"line-numbered edits were aimed at MLGym's starter files, so edits may land on other lines here."
            ]
    hint = ""
    if any(mlgym_ranking_metric(c) for c in candidates):
        hint = " It is one of MLGym's tasks: set MLGYM_ROOT to a checkout of facebookresearch/MLGym to replay it."
    raise SystemExit(
        f"cannot tell which task {trajectory_path} belongs to (tried {candidates}); pass --task NAME.{hint}"
    )


def replay(trajectory_path: Path, task: str, out: Path, *, max_steps: int | None = None, seed: int | None = None,
           stream: TextIO | None = None, warnings: list[str] | None = None,
           options: dict[str, Any] | None = None, training_timeout: int | None = None,
           starter_files: str = "recorded", components: dict[str, str] | None = None,
           backend: str | None = None) -> ReplayReport:
    """Replay ``trajectory_path`` on ``task``, write our ``.traj``, ``results.json`` and the report to ``out``.

    With ``starter_files="recorded"`` the workspace starts from the file versions the recorded run showed when it
    first opened them (see ``recorded_files``), written to ``out/recorded-starters``: only the agent's own files; the
    task's evaluation, protected, secret and data files stay the task's own, whatever the recording showed.

    ``options`` are backend options. Replayed edits can land on other lines than in the recorded run and so make
    a strategy that never ends: a shorter ``training_timeout`` (seconds per evaluation) keeps such a replay short.
    """
    from ..episodes.episode import run_episode
    from ..policies.replay import ReplayPolicy
    from ..records.observation_kinds import observation_kind, recorded_kind
    from ..records.trajectories import TrajectoryWriter, atomic_write_json
    from ..registry import registry

    recorded = load_recorded(Path(trajectory_path))
    spec = with_changes(registry.spec(task), max_steps=max_steps, training_timeout=training_timeout, options=options,
                        components=components, backend=backend)
    replaced: list[str] = []
    kept: list[str] = []
    if starter_files == "recorded":
        windows = first_windows((step.action or "", step.observation) for step in recorded.steps)
        kept = task_kept(spec, windows)
        spec, replaced = with_recorded_starters(spec, windows, out / "recorded-starters")
    report = ReplayReport(
        source=str(trajectory_path),
        task=task,
        warnings=list(warnings or []),
        recorded_scores=recorded.scores,
        recorded_exit_status=str(recorded.info.get("exit_status") or ""),
        baseline=spec.baseline,
    )
    if replaced:
        report.warnings.append(f"started from the recorded versions of {', '.join(replaced)}")
    if kept:
        report.warnings.append(f"kept the task's own {', '.join(kept)}: a replay never rebuilds the task's "
                               f"evaluation, protected or data files from what the recorded run showed")
    writer = TrajectoryWriter(out, spec.id.replace("/", "_"), baseline=spec.baseline,
                              environment=f"mlgym_registry:{spec.backend}")
    policy = ReplayPolicy(recorded)
    env = registry.make(spec, batch_size=())
    try:
        with terminate_as_exit():
            result = run_episode(env, policy, spec=spec, writer=writer, seed=seed,
                                 on_turn=Transcript(stream) if stream is not None else None)
    except Exception as exc:
        # the report says why there is no comparison (a task whose data is missing here, a backend that failed)
        report.note = f"the episode stopped with {type(exc).__name__}: {exc}"
        atomic_write_json(out / "replay-report.json", report.to_dict())
        raise
    finally:
        with sigint_deferred():
            env.close()
    last, status = len(recorded.steps) - 1, report.recorded_exit_status
    for turn, step in zip(result.turns, recorded.steps, strict=False):  # either may be longer
        report.steps.append(StepComparison(
            index=turn.index,
            action=(step.action or "").strip(),
            recorded_kind=recorded_kind(step.observation, step.action or "", final=turn.index == last,
                                        exit_status=status),
            our_kind="format_error" if turn.format_error else observation_kind(turn.observation),
            recorded_observation=shorten(step.observation or "", lines=3),
            our_observation=shorten(turn.observation, lines=3),
        ))
    report.our_scores = list(result.info.get("score") or [])
    report.our_exit_status = str(result.info.get("exit_status") or "")
    report.completed = True
    if result.stop_reason:
        report.note = result.stop_reason
    elif len(result.turns) < len(recorded.steps):
        report.note = (f"our episode ended after {len(result.turns)} of the {len(recorded.steps)} recorded steps "
                       f"({report.our_exit_status or 'done'})")
    atomic_write_json(out / "replay-report.json", report.to_dict())
    return report


def format_report(report: ReplayReport) -> str:
    """The report as text: a line per step, then the scores side by side."""
    lines = [f"replay of {report.source} on task {report.task}"]
    lines += [f"warning: {warning}" for warning in report.warnings]
    width = max([len("recorded")] + [len(step.recorded_kind) for step in report.steps])
    lines.append(f"{'step':>4}  {'recorded':<{width}}  {'ours':<{width}}  action")
    for step in report.steps:
        action = (step.action.splitlines() or [""])[0][:60]
        mark = " " if step.same_kind else "*"
        lines.append(f"{step.index + 1:>4}{mark} {step.recorded_kind:<{width}}  {step.our_kind:<{width}}  {action}")
    lines.append(f"same observation kind on {report.matching_kinds} of {len(report.steps)} steps (* marks the others)")
    lines.append(f"{'':>18}{'recorded':<40}ours")
    lines.append(f"{'exit status':<18}{report.recorded_exit_status:<40}{report.our_exit_status}")
    recorded_final = report.recorded_scores[-1] if report.recorded_scores else None
    our_final = report.our_scores[-1] if report.our_scores else None
    lines.append(f"{'final score':<18}{str(recorded_final):<40}{our_final}")
    lines.append(f"{'scores recorded':<18}{len(report.recorded_scores):<40}{len(report.our_scores)}")
    lines.append(f"{'baseline':<18}{report.baseline}")
    if report.note:
        lines.append(f"note: {report.note}")
    return "\n".join(lines)


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def recorded_paths(arguments: list[str]) -> list[Path]:
    """The ``.traj`` files named: files as given, folders searched for ``*.traj`` (sorted), each path once."""
    paths: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        found = sorted(path.rglob("*.traj")) if path.is_dir() else [path]
        if path.is_dir():  # a FIFO, socket, device or folder named *.traj, or a link out of the folder: skipped
            found, skipped = split_regular(found, within=path)
            for line in skipped:
                print(f"mlgym-registry replay: warning: {printable(line)}; skipped", file=sys.stderr)
        if path.is_dir() and not found:
            raise SystemExit(f"no .traj file in the folder {argument!r}; pass a .traj file or a folder of runs")
        paths += [p for p in found if p not in paths]
    return paths


def default_jobs() -> int:
    """One replay per core: a replay mostly waits on its evaluations, each a pair of processes taking turns."""
    return usable_cores()


def main(args: argparse.Namespace) -> int:
    """Replay the trajectory (or each of several, in parallel) and print the report(s)."""
    paths = recorded_paths(list(args.traj))
    if len(paths) > 1 or any(Path(p).is_dir() for p in args.traj):
        return main_many(args, paths)
    return main_one(args, paths[0])


def main_one(args: argparse.Namespace, path: Path) -> int:
    """Replay one trajectory, its turns shown as they happen unless ``--quiet``."""
    from ..registry import registry

    recorded = load_recorded(path)  # fail early, with the file's problem, before building anything
    plan = plan_replay(path, recorded.environment, args)
    # every option is checked before the --out folder is made
    with_changes(registry.spec(plan.task), max_steps=plan.max_steps, training_timeout=args.training_timeout,
                 options=plan.options, components=plan.components, backend=plan.backend)
    for warning in plan.warnings:
        print(f"mlgym-registry replay: warning: {printable(warning)}", file=sys.stderr)
    out = Path(args.out) if args.out else default_out(f"replay-{plan.task.replace('/', '_')}")
    with OutFolder(out):
        report = replay(path, plan.task, out, max_steps=plan.max_steps, seed=plan.seed, warnings=plan.warnings,
                        stream=None if args.quiet else sys.stdout, options=plan.options,
                        training_timeout=args.training_timeout, starter_files=plan.starter_files,
                        components=plan.components, backend=plan.backend)
    print(printable(format_report(report)))
    print(f"wrote {out / 'replay-report.json'}")
    return 0


@dataclass
class ReplayPlan:
    """What one replay runs on: the command line's choices, else what the run recorded and a record may choose
    (``records.trust``)."""

    task: str
    warnings: list[str]
    seed: int | None
    max_steps: int | None
    components: dict[str, str]
    options: dict[str, Any]
    starter_files: str
    backend: str | None = None


def plan_replay(path: Path, environment: str, args: argparse.Namespace) -> ReplayPlan:
    """The replay of ``path``: a run we recorded replays on its recorded task, components, seed and max steps, from
    the task's own starter files, unless the command line says otherwise; an MLGym run on ``mlgym/<id>`` (or our
    ``<id>``) from the file versions it showed (``--starter-files``).

    The backend and its options are the command line's and the task's: a record that sets them otherwise is refused
    (``RecordedSettingsRefused``) until the command line passes them again.
    """
    from ..registry import registry

    settings = read_record(path)
    trusted = settings or RecordSettings()
    typed = typed_settings(args)
    if not typed.task and not trusted.task:
        check_record(path, trusted, None, typed, kinds=("task",))  # a task the record names but may not choose
    task, warnings = ((typed.task, []) if typed.task else (trusted.task, []) if trusted.task else
                      default_task(path, environment))
    check_record(path, trusted, registry.spec(task), typed)
    return ReplayPlan(
        task=task, warnings=warnings + trusted.warnings,
        seed=typed.seed if typed.seed is not None else trusted.seed,
        max_steps=typed.max_steps if typed.max_steps is not None else trusted.max_steps,
        components={**trusted.components, **typed.components},
        options=typed.options,
        starter_files=args.starter_files or ("task" if settings is not None else "recorded"),
        backend=typed.backend,
    )


def _replay_in_worker(path: Path, task: str, out: Path, warnings: list[str], arguments: dict[str, Any]) -> ReplayReport:
    """``replay`` in a worker process (no transcript: several replays would interleave)."""
    return replay(path, task, out, warnings=warnings, **arguments)


def main_many(args: argparse.Namespace, paths: list[Path]) -> int:
    """Replay several trajectories in worker processes (``--jobs`` at once), each into its own folder of ``OUT``;
    the reports are printed in the order the files were given, whatever order the replays end in."""
    from concurrent.futures import ProcessPoolExecutor

    from ..registry import registry
    from ..scale.workers import warm_context

    # the workers: never a plain fork of a process that may hold threads and envs, but forks of the warm server
    # (scale/workers.py), which imports torch and TorchRL once while this process checks the files, not spawned
    # interpreters that each import them again (4-5 s of CPU a worker)
    context = warm_context()
    plans: list[tuple[Path, ReplayPlan]] = []
    for path in paths:
        recorded = load_recorded(path)  # every file is checked before any replay starts
        plans.append((path, plan_replay(path, recorded.environment, args)))
    for _, plan in plans:
        with_changes(registry.spec(plan.task), max_steps=plan.max_steps, training_timeout=args.training_timeout,
                     options=plan.options, components=plan.components, backend=plan.backend)
    out = Path(args.out) if args.out else default_out("replay")
    jobs = min(args.jobs or default_jobs(), len(plans))
    failures = 0
    with OutFolder(out):
        folders, used = [], set()
        for path, _ in plans:
            name = f"{path.parent.name}-{path.stem}".strip("-")
            while name in used:
                name += "_"
            used.add(name)
            folders.append(out / name)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [pool.submit(_replay_in_worker, path, plan.task, folder, plan.warnings,
                                   {"max_steps": plan.max_steps, "seed": plan.seed, "options": plan.options,
                                    "training_timeout": args.training_timeout, "starter_files": plan.starter_files,
                                    "components": plan.components, "backend": plan.backend})
                       for (path, plan), folder in zip(plans, folders, strict=True)]
            for (path, _), folder, future in zip(plans, folders, futures, strict=True):
                try:
                    report = future.result()
                except Exception as exc:  # noqa: BLE001 - one failed replay does not stop the others
                    failures += 1
                    print(printable(f"replay of {path} failed: {type(exc).__name__}: {exc}"))
                    continue
                if not args.quiet:
                    print(printable(format_report(report)))
                else:
                    print(printable(f"{path}: same observation kind on {report.matching_kinds} of "
                                    f"{len(report.steps)} steps; final score {(report.our_scores or [None])[-1]}"))
                print(f"wrote {folder / 'replay-report.json'}")
    print(f"replayed {len(plans) - failures} of {len(plans)} runs with {jobs} jobs into {out}")
    return 1 if failures else 0
