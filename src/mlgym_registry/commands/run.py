"""``mlgym-registry run TASK``: play an episode with a policy, show it as it goes, and record it.

The episode is written to ``OUT/<task>.traj`` and ``OUT/results.json`` in MLGym's formats after every step, so an
interrupted run keeps every step it finished. ``--num-envs N`` plays N episodes at once in worker processes, each
written to ``OUT/env<i>/`` with every step it played; a run that lost any (an ``infra_error``) lists them and exits
non-zero.

``OUT`` belongs to one run: a folder that already holds a run (a ``.traj``, ``results.json`` or
``replay-report.json``, at its top or in a sub-folder) is refused, and so is a folder another run is writing to right
now (each run holds an exclusive lock on ``OUT/.mlgym-registry.lock`` while it runs). Every option is checked before
the folder is created, so a refused command leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..options import InvalidOptionError, cli_integer
from ..terminal import printable
from .out_folder import OutFolder, default_out
from .signals import sigint_deferred, terminate_as_exit
from .terminal_output import Transcript, progress_bar, show_progress

if TYPE_CHECKING:
    from ..records.trust import TypedSettings
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
    parser.add_argument("--workers", type=cli_integer(1), default=None, metavar="W",
                        help="without --ray: worker processes that play the envs (default: one per core, at most "
                        "one per env; a worker's envs each play in a thread of its own)")
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


def typed_settings(args: argparse.Namespace) -> TypedSettings:
    """What the command line of ``run`` (or ``replay``) gives: the values that win over a record."""
    from ..records.trust import TypedSettings

    return TypedSettings(task=getattr(args, "task", None), seed=args.seed, max_steps=args.max_steps,
                         backend=getattr(args, "backend", None), components=component_choices(args),
                         options=backend_options(args.backend_option))


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
        from ..scale.ray_runtime import check_ray

        check_ray(args.ray)  # no Ray, or an address nobody answers: said now, before any folder is made
    elif args.cpus_per_env is not None:
        raise InvalidOptionError("--cpus-per-env is for --ray runs; add --ray (or --ray ADDRESS)")
    if args.ray is not None and args.workers is not None:
        raise InvalidOptionError("--workers is for runs without --ray (Ray places one actor per env); leave it out")
    episodes_per_env(args)  # a count that does not divide among the envs: refused before any folder is made
    out = Path(args.out) if args.out else default_out(spec.id.replace("/", "_"))
    with OutFolder(out):
        if args.num_envs > 1 or args.ray is not None or episodes_per_env(args) > 1:
            return run_many(spec, args, out)
        return run_one(spec, args, out)


def apply_recorded_settings(args: argparse.Namespace) -> None:
    """For ``--policy replay:PATH`` of a run we recorded: what the command line leaves unset of what a record may
    choose (seed, max steps, components) as the run recorded it, so that the replay plays the run again.

    The backend and its options stay the command line's and the task's (``records.trust``): a record that sets them
    otherwise refuses the run (``RecordedSettingsRefused``) until the command line passes them again.
    """
    from ..records.trust import check_record, read_record
    from ..registry import registry

    kind, _, path = policy_text(args).partition(":")
    settings = read_record(path) if kind == "replay" and path else None
    if settings is None:
        return
    typed = typed_settings(args)  # before the record fills anything in
    check_record(path, settings, registry.spec(args.task), typed)
    for warning in settings.warnings:
        print(f"mlgym-registry run: warning: {printable(warning)}", file=sys.stderr)
    if args.seed is None:
        args.seed = settings.seed
    if args.max_steps is None:
        args.max_steps = settings.max_steps
    for kind_, name in settings.components.items():
        if getattr(args, kind_, None) is None:
            setattr(args, kind_, name)


def check_policy(text: str) -> None:
    """Refuse a ``replay:PATH`` policy whose file is not a readable ``.traj``, and an ``openai:MODEL`` policy whose
    options are wrong (or whose package is missing), before anything is written."""
    kind, _, argument = text.partition(":")
    if kind == "replay" and argument:
        from ..records.trajectories import load_recorded

        load_recorded(Path(argument))
    if kind == "openai":
        from ..policies import make_policy

        make_policy(text)  # checks the options; nothing connects before the first call


def run_one(spec, args: argparse.Namespace, out: Path, stream: TextIO | None = None) -> int:
    """One episode in this process, shown turn by turn."""
    from ..episodes.episode import run_episode
    from ..policies import make_policy
    from ..records.trajectories import TrajectoryWriter
    from ..registry import registry

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
        from ..policies import policy_modules
        from ..scale.workers import start_worker_server

        # the workers' server imports torch, TorchRL and the policy's modules (each worker builds the policy) while
        # this process does the same, on another core
        start_worker_server(also_import=policy_modules(args.policy))
    from ..scale.runs import run_episodes

    if engine == "process":
        check_endpoint(policy_text(args))
    per_env = episodes_per_env(args)
    where = "" if engine == "process" else f" on Ray ({args.ray or 'a local runtime'})"
    bar = progress_bar(args.num_envs * per_env, f"{spec.id}: episodes done{where}")
    try:
        results = run_episodes(spec, policy_text(args), args.num_envs, engine=engine, address=args.ray or None,
                               cpus_per_env=args.cpus_per_env, workers=args.workers, out=out, seed=args.seed,
                               episodes_per_env=per_env,
                               on_step=lambda finished, steps: show_progress(bar, finished, f"{steps} steps"))
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
    report_lost(results, per_env)
    return min(failed, MAX_FAILED_STATUS)


def report_lost(results: list, per_env: int) -> None:
    """Say on stderr which episodes the run's machinery lost (``infra_error``: a worker died or raised, steps never
    arrived), so that a run that lost anything says so beside its non-zero exit status."""
    from ..scale.frame_receiver import is_infra_failure

    lost = [(position, result) for position, result in enumerate(results) if is_infra_failure(result)]
    if not lost:
        return
    print(f"mlgym-registry run: {len(lost)} of {len(results)} episodes were lost or cut short by the run itself, "
          f"not by the agent (infra_error; their results.json say \"failed\", and they are not scored):",
          file=sys.stderr)
    for position, result in lost:
        index, number = divmod(position, per_env)
        label = f"env {index}" if per_env == 1 else f"env {index} episode {number}"
        print(f"  {label}: {printable(result.failure)}", file=sys.stderr)
