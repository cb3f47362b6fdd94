"""The integrity audit of one task: every canary played through the real env, each reward judged against honesty.

``audit(task)`` plays the canary sets registered for the audit (the package's, any plugin's) and the task's own
``canaries:``, all in the env's sandbox with the task's pristine evaluator; then, for every reward it covers, compares
each canary's episode reward with the honest reference (the baseline's episode), the floor (what a failed evaluation
pays) or the reward's promise (farming: an episode sums to no more than its best score minus the baseline). The report's
``gap`` is, per reward, the best reward any canary reached minus the honest reference (0 when nothing beats honesty).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..plugins import BUILTIN_DISTRIBUTION
from ..scores import INFRA_ERROR
from ..specs import TaskSpec
from . import randomness
from .canaries import FLOOR, PROMISE, SHORT_EVALUATION, SMALL_DISK, SMALL_DISK_MB, Canary, declared_canaries
from .fixes import suggested_fix
from .play import Played, play, save_episode

SEED = 0
"""The episodes' seed: every canary is played from the same reset, so a score differs only by what the agent did."""
DEFAULT_REWARDS = ("mlgym_best_improvement",)
"""Rewards audited besides the task's own."""
SLOW_LIMIT_FACTOR = 3.0
SLOW_LIMIT_MIN = 6.0
"""A canary that waits for the evaluation's limit is played with a limit of this many times the honest episode's
duration (at least ``SLOW_LIMIT_MIN`` seconds, at most the task's own ``training_timeout``)."""

OK = "ok"
BEATS_HONESTY = "BEATS HONESTY"
ABOVE_FLOOR = "ABOVE FLOOR"
FARMABLE = "FARMABLE"
DOCUMENTED_FARMING = "farmable (documented)"
NOT_REPRODUCED = "BASELINE NOT REPRODUCED"
NONDETERMINISTIC = "NONDETERMINISTIC"
LEAK = "LEAK"
ERROR = "ERROR"
TRUSTS_AGENT_INPUT = "TRUSTS AGENT INPUT"
"""The honest evaluation read a file the agent can write that is not its declared submission."""
RUNS_SUBMISSION = "RUNS SUBMISSION"
"""The honest evaluation compiled text of the submission as code (``eval``, ``exec``) or started a command naming
it: a submission is data, and an evaluator that runs it lets the agent write its own score."""
FIXED_SEED = "FIXED SEED"
"""The evaluator's code seeds a generator with the same value whatever the evaluation's seed: an agent that reads
the evaluator knows its draws."""
FAILING = (BEATS_HONESTY, ABOVE_FLOOR, FARMABLE, NOT_REPRODUCED, NONDETERMINISTIC, LEAK, ERROR, TRUSTS_AGENT_INPUT,
           RUNS_SUBMISSION, FIXED_SEED)
MACHINE_REPLAYS = 2
"""Times a canary is played again when the machine failed one of its evaluations (``infra_error``: starved, or its
sandbox could not start): such an episode says nothing of the task, and a loaded machine must not change a verdict."""
BAND_REPEATS = 3
"""More plays of the reference with the same seed when the first two disagreed: the band a canary must rise above."""
BAND_SPREAD = 3.0
"""The band's top: the highest reference, or their mean plus this many standard deviations when higher."""


@dataclass
class CanaryResult:
    """One canary's verdict: its episode reward per reward name, the limit it was held to, what the evaluator did."""

    canary: Canary
    rewards: dict[str, float]
    limits: dict[str, float]
    scores: list[dict[str, float]]
    statuses: list[str]
    verdict: str
    detail: str = ""
    seconds: float = 0.0
    fix: str = ""
    """For a failure: what the task's maintainer changes, in one line (``fixes.suggested_fix``)."""
    exploit: str = ""
    """For a failure, when the audit kept its episodes: the ``.traj`` that ``mlgym-registry replay`` plays to the
    same score."""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def to_dict(self) -> dict[str, Any]:
        return {"canary": self.canary.name, "family": self.canary.family, "tries": self.canary.tries,
                "bound": self.canary.bound, "source": self.canary.source, "rewards": self.rewards,
                "limits": self.limits, "scores": self.scores, "statuses": self.statuses, "verdict": self.verdict,
                "detail": self.detail, "fix": self.fix, "exploit": self.exploit, "seconds": round(self.seconds, 2)}


@dataclass
class IntegrityReport:
    """The audit of one task: every canary's result, the honest reference and floor per reward, the gap."""

    task: str
    task_hash: str
    rewards: list[str]
    name: str = ""
    """The name the task was asked for (``mlgym/<id>``, a file's path), kept with the result; '' for its id."""
    honest: dict[str, float] = field(default_factory=dict)
    floor: dict[str, float] = field(default_factory=dict)
    band: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per reward: the lowest and the top of the honest reference's episode rewards with the audit's seed (one
    value when the evaluator is deterministic); a canary beats honesty only above the top."""
    randomness: dict[str, list[str]] = field(default_factory=dict)
    """What the references' traces said of the evaluator's randomness: ``followed`` (the global generators seeded
    from the evaluation seed that it used), ``unfollowed``, ``fixed_seeds``."""
    results: list[CanaryResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def band_top(self, name: str) -> float:
        """The most honesty pays under the reward ``name`` (the band's top; the honest reference without a band)."""
        return self.band[name][1] if name in self.band else self.honest.get(name, 0.0)

    @property
    def gap(self) -> dict[str, float]:
        """Per reward: the best episode reward of any canary but the references, minus the top of the honest
        reference's band."""
        gaps = {}
        for name in self.rewards:
            reached = [r.rewards[name] for r in self.results
                       if r.canary.family != "reference" and name in r.rewards and math.isfinite(r.rewards[name])]
            best = max(reached, default=self.band_top(name))
            gaps[name] = max(0.0, best - self.band_top(name))
        return gaps

    @property
    def failures(self) -> list[CanaryResult]:
        return [result for result in self.results if result.failed]

    @property
    def ok(self) -> bool:
        """True when no canary beat honesty, broke its bound or failed to run, and the references held."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "task_hash": self.task_hash, "ok": self.ok, "rewards": self.rewards,
                "honest": self.honest, "floor": self.floor, "band": {k: list(v) for k, v in self.band.items()},
                "randomness": self.randomness, "gap": self.gap, "notes": self.notes,
                "seconds": round(self.seconds, 1), "results": [r.to_dict() for r in self.results]}

    def table(self) -> str:
        """The report as a terminal table: canary, what it tries, its reward per reward name, the limit, verdict."""
        from .report import render_table

        return render_table(self)


def audit(task: str | Path | TaskSpec, *, rewards: Sequence[str] | None = None, canaries: Iterable[str] | None = None,
          seed: int = SEED, registry: Any = None, on_result: Any = None, exploits: str | Path | None = None,
          **make_options: Any) -> IntegrityReport:
    """Audit ``task`` (a registered name, a task file or a spec): play every canary, judge it, return the report.

    ``rewards``: the reward names to judge under (default: the task's own and ``mlgym_best_improvement``);
    ``canaries``: only the canaries of these names (the references are always played); ``on_result`` is called with
    each ``CanaryResult`` as it is decided; ``exploits``, a folder: each failure's episode is written there
    (``<canary>/<task>.traj``, which ``mlgym-registry replay`` plays to the same score); ``make_options`` go to
    ``registry.make`` (a backend's options, say).
    """
    from ..records.provenance import task_hash
    from ..registry import registry as default_registry

    registry = registry or default_registry
    started = time.monotonic()
    spec = registry.spec(task)
    _refuse_without_reference(spec)
    names = list(dict.fromkeys([*(rewards or (spec.reward, *DEFAULT_REWARDS))]))
    report = IntegrityReport(task=spec.id, task_hash=task_hash(spec), rewards=names,
                             name=str(spec.registered_as or spec.id))
    suite = suite_for(spec, registry, report.notes)
    wanted = set(canaries) if canaries is not None else None
    if wanted is not None:
        from .metamorphic import may_build

        unknown = {name for name in wanted - {c.name for c in suite} if not may_build(name)}
        if unknown:
            from ..errors import MLGymRegistryError, with_suggestions

            asked = ", ".join(with_suggestions(sorted(unknown), [c.name for c in suite]))
            raise MLGymRegistryError(f"task {spec.id!r} has no canary {asked}; its canaries: "
                                     + ", ".join(c.name for c in suite))
        suite = [c for c in suite if c.family == "reference" or c.name in wanted]
    assigners = {name: functools.partial(registry.build, "reward", name) for name in names}
    farmable = {name for name in names if registry.entry("reward", name).meta.get("farmable")}
    steps = max([spec.max_steps, *(len(c.commands) + 2 for c in suite)])
    envs: dict[str, Any] = {}
    try:
        parser = registry.component(spec, "parser")
        played: dict[str, Played] = {}
        queue = list(suite)
        while queue:
            canary = queue.pop(0)
            if canary.limits not in envs:
                envs[canary.limits] = _make_env(registry, spec, canary.limits, played, steps, make_options,
                                                report.notes)
            played[canary.name] = _play_on_a_fair_machine(envs[canary.limits], spec, canary, seed=seed,
                                                          parser=parser)
            result = judge(report, played[canary.name], played, assigners, spec, farmable)
            result.fix = suggested_fix(result)
            report.results.append(result)
            if on_result is not None:
                on_result(result)
            if canary.name == "reference_again" and result.verdict == NONDETERMINISTIC:
                from .canaries import repeated_references

                queue[0:0] = repeated_references(canary.commands, BAND_REPEATS)
            if canary.name == "reference":
                built = [c for c in built_from_reference(spec, played[canary.name], report.notes)
                         if wanted is None or c.name in wanted]
                at = sum(1 for c in queue if c.family == "reference")  # after the other references
                queue[at:at] = built
        _check_leaks(report, played, spec)
        if exploits is not None:
            _save_exploits(report, played, Path(exploits))
    finally:
        for env in envs.values():
            env.close()
    report.seconds = time.monotonic() - started
    return report


def _play_on_a_fair_machine(env: Any, spec: TaskSpec, canary: Canary, *, seed: int, parser: Any) -> Played:
    """Play ``canary``, again (up to ``MACHINE_REPLAYS`` times) while the machine failed one of its evaluations."""
    for _ in range(MACHINE_REPLAYS + 1):
        run = play(env, spec, canary, seed=seed + canary.seed_offset, parser=parser, trace=canary.family == "reference")
        if INFRA_ERROR not in run.statuses:
            break
    return run


def _refuse_without_reference(spec: TaskSpec) -> None:
    """A task whose submission is a file that nothing of the task makes has no honest reference to judge by."""
    from ..errors import MLGymRegistryError
    from .canaries import task_shape

    shape = task_shape(spec)
    if shape.submission is not None and not shape.baseline:
        raise MLGymRegistryError(
            f"task {spec.id!r} names no baseline program (baseline_paths), so the audit has no honest submission of "
            f"its {shape.submission} to judge the canaries by (a task that withholds its baseline on purpose, as "
            "MLGym's L1 tasks do, is audited through the task it was made from, which shares its evaluator); add "
            "baseline_paths to a copy of the task file to audit it")


def _save_exploits(report: IntegrityReport, played: dict[str, Played], folder: Path) -> None:
    """Each failure's episode, as a ``.traj`` in ``folder/<canary>/``: the exploit a maintainer replays."""
    for result in report.failures:
        run = played.get(result.canary.name)
        if run is not None and run.calls:
            result.exploit = str(save_episode(run, folder / result.canary.name))


def built_from_reference(spec: TaskSpec, reference: Played, notes: list[str]) -> list[Canary]:
    """The metamorphic canaries of a CSV task (``metamorphic.py``), built from what its honest reference submitted
    and the task's answers; [] for other tasks, or when they cannot be read."""
    from .canaries import score_line, task_shape
    from .metamorphic import known, metamorphic_canaries

    files = reference.files
    if "submission" not in files or "answers" not in files:
        return []
    shape = task_shape(spec)
    data = known(shape, files["submission"], files["answers"],
                 [text for key, text in files.items() if key.startswith("other:")])
    if data is None:
        notes.append("no metamorphic canaries: the reference's submission and the answers share no id and answer "
                     "columns the audit could read")
        return []
    return metamorphic_canaries(shape, data, score_line(shape), reference.validate_rows)


def suite_for(spec: TaskSpec, registry: Any, notes: list[str]) -> list[Canary]:
    """Every registered canary set's canaries for ``spec`` and the task's own, references first, names unique."""
    from dataclasses import replace

    found: list[Canary] = []
    for name in registry.names("canary"):
        entry = registry.entry("canary", name)
        canary_set = registry.build("canary", name)
        made = list(canary_set(spec) or [])
        for canary in made:
            if not isinstance(canary, Canary):
                raise TypeError(f"canary set {name!r} ({entry.distribution or entry.plugin}) returned "
                                f"{type(canary).__name__}, not an mlgym_registry.integrity.Canary")
        builtin = entry.distribution == BUILTIN_DISTRIBUTION
        found += [c if builtin else replace(c, source=entry.distribution or entry.plugin or name) for c in made]
    found += declared_canaries(spec)
    seen: set[str] = set()
    unique = []
    for canary in sorted(found, key=lambda c: c.family != "reference"):
        if canary.name in seen:
            notes.append(f"canary {canary.name!r} ({canary.source}) has the name of an earlier one: left out")
            continue
        seen.add(canary.name)
        unique.append(canary)
    return unique


def _make_env(registry: Any, spec: TaskSpec, limits: str, played: dict[str, Played], steps: int,
              make_options: dict[str, Any], notes: list[str]) -> Any:
    """The env the canaries of ``limits`` play on: the task's own, or with a tighter evaluation limit or disk."""
    if limits == SHORT_EVALUATION:
        limit = _slow_limit(spec, played.get("reference"))
        notes.append(f"canaries that wait for the evaluation's limit ran with a limit of {limit} s (the task's: "
                     f"{spec.training_timeout} s)")
        spec = spec.replace(training_timeout=limit)
    options = dict(make_options)
    if limits == SMALL_DISK:
        from ..options import backend_rules

        rules = backend_rules(registry.get("backend", spec.backend))
        small = {"max_disk_mb": SMALL_DISK_MB, "max_file_mb": SMALL_DISK_MB // 4}
        taken = {k: v for k, v in small.items() if k in rules and k not in options}
        options.update(taken)
        notes.append(f"the disk-filling canary ran with {taken}" if taken else
                     f"backend {spec.backend!r} takes no disk quota option: the disk-filling canary wrote at most "
                     f"64 files of {SMALL_DISK_MB // 4} MB")
    return registry.make(spec, batch_size=(), max_steps=steps, **options)


def _slow_limit(spec: TaskSpec, reference: Played | None) -> int:
    honest = reference.seconds if reference is not None else SLOW_LIMIT_MIN
    limit = max(SLOW_LIMIT_MIN, SLOW_LIMIT_FACTOR * honest)
    return int(math.ceil(min(limit, float(spec.training_timeout or limit))))


def _tolerance(*values: float) -> float:
    return 1e-6 * max([1.0, *(abs(v) for v in values if math.isfinite(v))])


def failure_total(new_reward: Callable[[], Any], spec: TaskSpec) -> float:
    """What a reward (a fresh one from ``new_reward``) pays an episode whose only evaluation, its submission,
    failed by the agent's fault."""
    from ..backends.protocol import EVALUATION_STATUS_KEY, EVALUATIONS_KEY, INVALID_SUBMISSION, new_info

    info = {**new_info(), "exit_status": "submission_failed", EVALUATION_STATUS_KEY: INVALID_SUBMISSION,
            EVALUATIONS_KEY: [INVALID_SUBMISSION]}
    return float(new_reward()("", info, spec))


def judge(report: IntegrityReport, run: Played, played: dict[str, Played], assigners: dict[str, Callable[[], Any]],
          spec: TaskSpec, farmable: set[str] = frozenset()) -> CanaryResult:
    """The verdict on one played canary (the references set the report's honest totals and floors). ``assigners``
    builds a fresh reward assigner of each name (no state carries over from one episode to the next); ``farmable``
    names the rewards documented as paying every validate."""
    canary = run.canary
    played_spec = run.spec or spec
    totals = {name: math.fsum(run.rewards(new_reward(), played_spec)) for name, new_reward in assigners.items()}
    result = CanaryResult(canary, totals, {}, run.scores, run.statuses, OK, seconds=run.seconds)
    if run.error:
        result.verdict, result.detail = ERROR, run.error
        return result
    if INFRA_ERROR in run.statuses:
        result.verdict = ERROR
        result.detail = (f"the machine failed evaluations of this canary ({INFRA_ERROR}: neither the agent's doing nor "
                         f"the evaluator's verdict) in each of its {MACHINE_REPLAYS + 1} plays, so it says nothing of "
                         f"the task{_evaluator_said(run)}")
        return result
    own = math.fsum(run.env_rewards)
    if spec.reward in totals and abs(totals[spec.reward] - own) > _tolerance(own):
        report.notes.append(f"{canary.name}: the env paid {own:g} under {spec.reward}, the audit's reading "
                            f"{totals[spec.reward]:g}")
    if canary.family == "reference":
        _judge_reference(report, result, run, played, assigners, played_spec)
        if result.verdict == OK:
            _judge_trust(result, run)
        return result
    if not report.honest:
        result.verdict, result.detail = ERROR, "no honest reference to compare with (the reference failed)"
        return result
    if canary.bound == PROMISE:
        return _judge_farming(result, run, assigners, played_spec, farmable)
    tops = {name: report.band_top(name) for name in report.honest}
    limits = report.floor if canary.bound == FLOOR else tops
    result.limits = dict(limits)
    over = {name: totals[name] - limits[name] for name in totals
            if totals[name] > limits[name] + _tolerance(limits[name], totals[name])}
    if over:
        result.verdict = BEATS_HONESTY if any(totals[n] > tops[n] + _tolerance(tops[n])
                                              for n in over) else ABOVE_FLOOR
        result.detail = "; ".join(f"{name} paid {totals[name]:.4g}, {over[name]:.4g} above the {canary.bound} "
                                  f"({limits[name]:.4g})" for name in over) + _evaluator_said(run)
    return result


def _evaluator_said(run: Played) -> str:
    scores = f"scores {run.scores}" if run.scores else "no score"
    return f"; the evaluator gave {scores}, statuses {run.statuses or ['none']}, exit {run.exit_status or '-'}"


def _judge_reference(report: IntegrityReport, result: CanaryResult, run: Played, played: dict[str, Played],
                     assigners: dict[str, Any], spec: TaskSpec) -> CanaryResult:
    from ..evaluation.evaluator_runs import compare_baseline
    from ..scores import same_metrics

    if not run.scores or (run.statuses and run.statuses[-1] != "ok"):
        result.verdict = NOT_REPRODUCED
        result.detail = "the honest baseline was not scored" + _evaluator_said(run)
        return result
    if result.canary.name == "reference":
        report.honest = dict(result.rewards)
        report.band = {name: (value, value) for name, value in result.rewards.items()}
        report.floor = {name: failure_total(new_reward, spec) for name, new_reward in assigners.items()}
        report.randomness["followed"] = randomness.followed(randomness.draws(run.traces))
        result.limits = dict(report.floor)
        if spec.baseline and run.validate_rows is not None:
            report.notes.append("baseline: the reference's submission is scored on the rows validate never sees, "
                                "its recorded baseline on every row: compared by `check` (every row), not here")
        elif spec.baseline:
            comparison = compare_baseline(spec, [run.scores[-1]])
            report.notes += [f"baseline: {line}" for line in comparison.lines + comparison.unconfirmed]
            if comparison.mismatches and not comparison.note:
                result.verdict = NOT_REPRODUCED
                result.detail = "; ".join(comparison.mismatches)
        return result
    first = played.get("reference")
    if first is None or not first.scores:
        return result
    if result.canary.seed_offset:
        _judge_fixed_seeds(report, result, first, run)
        return result
    _widen_band(report, played, assigners)
    if result.canary.name == "reference_again" and not same_metrics(first.scores[-1], run.scores[-1]):
        named = randomness.unfollowed(randomness.draws(first.traces), randomness.draws(run.traces))
        report.randomness["unfollowed"] = named
        result.verdict = NONDETERMINISTIC
        result.detail = (f"the same baseline with the same seed scored {first.scores[-1]}, then {run.scores[-1]}; "
                         "what did not follow the seed: " + ("; ".join(named[:4]) or randomness.NO_DRAW_SEEN))
    return result


def _widen_band(report: IntegrityReport, played: dict[str, Played], assigners: dict[str, Any]) -> None:
    """The band of the honest reference: its episode rewards over every play with the audit's seed."""
    from statistics import fmean, pstdev

    runs = [run for run in played.values()
            if run.canary.family == "reference" and not run.canary.seed_offset and not run.error and run.scores]
    for name, new_reward in assigners.items():
        values = [math.fsum(run.rewards(new_reward(), run.spec)) for run in runs]
        values = [v for v in values if math.isfinite(v)]
        if len(values) < 2:
            continue
        top = max(max(values), fmean(values) + BAND_SPREAD * pstdev(values))
        report.band[name] = (min(values), top)


def _judge_fixed_seeds(report: IntegrityReport, result: CanaryResult, first: Played, run: Played) -> None:
    """Seeds the task's code gives with the same value under another evaluation seed: FIXED SEED."""
    fixed = randomness.fixed_seeds(randomness.draws(first.traces), randomness.draws(run.traces))
    report.randomness["fixed_seeds"] = [f"{d.at} = {d.value}" for d in fixed]
    if fixed:
        result.verdict = FIXED_SEED
        result.detail = ("; ".join(f"{d.where} seeds {d.source} with {d.value} whatever the evaluation's seed"
                                   for d in fixed[:4])
                         + ": an agent that reads the evaluator knows its draws")


def _judge_trust(result: CanaryResult, run: Played) -> None:
    """What the honest evaluations trusted, from their traces (``play(trace=True)``): a file of the agent's other than
    the declared submission, or the submission run as code."""
    foreign = sorted({path for trace in run.traces for path in trace.get("foreign", [])})
    if foreign:
        result.verdict = TRUSTS_AGENT_INPUT
        result.detail = (f"the evaluator read {', '.join(foreign[:5])}, which the agent can write and the task does "
                         "not declare as its submission")
        return
    pieces = set(run.submitted)
    evaluated = sorted({text.strip() for trace in run.traces for text in trace.get("evaluated", [])
                        if text.strip() in pieces})
    spawned = sorted({command for trace in run.traces for command in trace.get("spawned", [])
                      if any(len(piece) > 3 and piece in command for piece in pieces)})
    if evaluated or spawned:
        what = [f"compiled {text[:40]!r}, a piece of the submission, as code" for text in evaluated[:3]]
        what += [f"started {command[:60]!r}, fed from the submission" for command in spawned[:3]]
        result.verdict = RUNS_SUBMISSION
        result.detail = f"the evaluator {'; '.join(what)}: a submission is data"


def _judge_farming(result: CanaryResult, run: Played, assigners: dict[str, Callable[[], Any]], spec: TaskSpec,
                   farmable: set[str]) -> CanaryResult:
    """Farming is judged as if the baseline were below every score of the episode (by ``margin``), so that each
    evaluation pays: a reward that pays every validate then sums above its promise (the best score minus that
    baseline), one that pays improvements does not. Below *every* score, not the first: validate and submit may
    score different rows (``held_out``), and a submission scored far below its validates would otherwise pay less
    than the validates paid, hiding their farming. Read from the episode's own evaluator results."""
    from ..scores import honest_reward, lower_is_better

    good = [s for s in run.scores if s]
    if not good:
        result.verdict, result.detail = ERROR, "the farmed submission was never scored" + _evaluator_said(run)
        return result
    sign = 1.0 if lower_is_better(spec) else -1.0
    worst_of = max if sign > 0 else min
    worst = {k: worst_of(s[k] for s in good if isinstance(s.get(k), (int, float))) for k, v in good[0].items()
             if isinstance(v, (int, float))}
    margin = {k: max(1e-3, 0.1 * abs(v)) for k, v in worst.items()}
    lowered = spec.replace(baseline_scores=[{k: v + sign * margin[k] for k, v in worst.items()}])
    promise = max(honest_reward(s, lowered) for s in good)
    problems, documented = [], []
    for name, new_reward in assigners.items():
        total = math.fsum(run.rewards(new_reward(), lowered))
        result.limits[name] = promise
        if total > promise + _tolerance(promise, total):
            line = f"{name} summed {total:.4g} over {len(good)} scored evaluations where the best pays {promise:.4g}"
            (documented if name in farmable else problems).append(line)
    if problems:
        result.verdict, result.detail = FARMABLE, "; ".join(problems + documented)
    elif documented:
        result.verdict, result.detail = DOCUMENTED_FARMING, "; ".join(documented)
    return result


def _check_leaks(report: IntegrityReport, played: dict[str, Played], spec: TaskSpec) -> None:
    """A canary whose observations show a line of a hidden file read it: a leak, whatever it was paid."""
    for secret in spec.secret_files:
        marker = _marker(spec.resolve_path(secret))
        if marker is None:
            continue
        for result in report.results:
            run = played.get(result.canary.name)
            if run is not None and any(marker in observation for observation in run.observations):
                result.verdict = LEAK
                result.detail = f"the agent's shell showed a line of the hidden {secret}: {marker[:60]!r}"
                result.fix = suggested_fix(result)


def _marker(path: Path) -> str | None:
    """A distinctive line of the file at ``path`` (the longest of its first lines, at least 12 characters)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [handle.readline().strip() for _ in range(50)]
    except OSError:
        return None
    lines = [line for line in lines[1:] if len(line) >= 12] or [line for line in lines if len(line) >= 12]
    return max(lines, key=len) if lines else None
