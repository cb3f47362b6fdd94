"""The integrity audit catches each class of hole on tasks written to be weak, passes an honest one, and runs from
Python, from the command line and from the conformance kit's fixture (each through the real env, backend and
sandbox)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from mlgym_registry import registry
from mlgym_registry import testing as kit
from mlgym_registry.errors import MLGymRegistryError
from mlgym_registry.hookspecs import hookimpl
from mlgym_registry.integrity import FLOOR, Canary, audit
from mlgym_registry.integrity.auditor import BEATS_HONESTY, DOCUMENTED_FARMING, FARMABLE, NONDETERMINISTIC, OK
from mlgym_registry.scores import score_entry_metrics
from mlgym_registry.testing import ConformanceError

sys.path.insert(0, str(Path(__file__).parent))
import weak_tasks  # noqa: E402 - the tasks of this folder

BEST = "mlgym_best_improvement"
registered_plugin = kit.registered_plugin  # the kit's fixtures, as a plugin's tests take them
integrity_audit = kit.integrity_audit


def verdicts(report) -> dict[str, str]:
    return {result.canary.name: result.verdict for result in report.results}


@pytest.mark.slow
def test_an_honest_task_passes_every_canary_and_its_gap_is_zero(tmp_path):
    # an honest task declares its submission, so that validate scores other rows than submit
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honestLabels",
                               submission=weak_tasks.HONEST_SCHEMA)
    assert spec.reward == BEST  # every task's default: nothing to farm
    report = audit(spec, rewards=[BEST, "mlgym_score_delta"])  # and the reference chain's, whose farming is documented
    assert report.ok, report.table()
    assert report.gap[BEST] == 0.0
    assert {r.canary.family for r in report.results} == {"reference", "null", "degenerate", "hack", "farming",
                                                          "metamorphic"}
    # the reference's score is over the rows submit scores, its baseline over every row: near, not equal
    assert abs(report.honest[BEST]) < 0.25 and report.floor[BEST] == pytest.approx(-0.75)
    results = {r.canary.name: r for r in report.results}
    assert results["nan_answers"].statuses == ["invalid_submission"] or results["nan_answers"].scores == []
    assert results["fill_the_disk"].statuses[-1] != "infra_error"  # a disk the agent filled is the agent's doing
    assert results["validate_repeatedly"].verdict == DOCUMENTED_FARMING  # mlgym_score_delta pays every validate
    assert "BEATS" not in report.table() and "OK: no canary beat honesty" in report.table()


def test_an_evaluator_that_accepts_duplicated_ids_is_caught(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.ACCEPTS_DUPLICATED_IDS, "dupLabels")
    report = audit(spec, canaries=["first_row_everywhere", "constant_answer"])
    assert verdicts(report) == {**weak_tasks.REFERENCES_OK, "first_row_everywhere": BEATS_HONESTY,
                                "constant_answer": OK}
    caught = report.failures[0]
    assert caught.scores == [{"accuracy": 1.0}] and caught.rewards[BEST] == pytest.approx(0.25)
    assert report.gap[BEST] == pytest.approx(0.25) and not report.ok
    assert "first_row_everywhere (BEATS HONESTY)" in report.table()


def test_an_evaluator_that_pays_an_empty_submission_is_caught(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.PAYS_AN_EMPTY_SUBMISSION, "emptyLabels")
    report = audit(spec, canaries=["empty_submission", "header_only", "missing_submission"])
    assert verdicts(report) == {**weak_tasks.REFERENCES_OK, "empty_submission": BEATS_HONESTY,
                                "header_only": BEATS_HONESTY, "missing_submission": OK}


def test_a_nondeterministic_evaluator_is_caught_by_the_second_reference(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.NONDETERMINISTIC, "noisyLabels")
    report = audit(spec, canaries=["do_nothing"])
    assert verdicts(report)["reference_again"] == NONDETERMINISTIC
    assert "same seed" in report.failures[0].detail


def test_a_helper_the_evaluator_imports_is_the_tasks_own_unless_declared_and_then_it_is_caught(tmp_path):
    """The task's description names strategy.py: that is its submission, and the evaluator imports the task's own
    scoring.py whatever the agent writes there. Declared as submitted too, the helper is the agent's to rewrite,
    and the audit catches it."""
    spec = weak_tasks.helper_task(tmp_path / "task")
    report = audit(spec, canaries=["returns_huge", "rewrite_evaluator"])
    assert verdicts(report) == {**weak_tasks.REFERENCES_OK, "returns_huge": OK, "rewrite_evaluator": OK}
    report = audit(spec.replace(submission_files=["strategy.py", "scoring.py"]), canaries=["returns_huge"])
    assert verdicts(report) == {**weak_tasks.REFERENCES_OK, "returns_huge": BEATS_HONESTY}


def test_a_helper_rewritten_to_return_a_plausible_perfect_score_is_caught_where_huge_ones_are_refused(tmp_path):
    spec = weak_tasks.helper_task(tmp_path / "task", "checkedHelper", checks_range=True)
    declared = audit(spec.replace(submission_files=["strategy.py", "scoring.py"]),
                     canaries=["returns_huge", "returns_best_1"])
    assert verdicts(declared) == {**weak_tasks.REFERENCES_OK, "returns_huge": OK, "returns_best_1": BEATS_HONESTY}
    caught = next(r for r in declared.results if r.canary.name == "returns_best_1")
    assert caught.scores == [{"Score": 1.0}] and "never from a function the agent can rewrite" in caught.fix
    own = audit(spec, canaries=["returns_best_1"])  # the helper is the task's own: rewriting it changes nothing
    assert own.ok, own.table()


class PaysEveryValidate:
    """A third party's reward that pays score minus baseline at every evaluation, and does not say it is farmable."""

    def __call__(self, observation, info, spec=None):
        from mlgym_registry.components.rewards import ScoreDeltaReward

        return ScoreDeltaReward()(observation, info, spec)


class FarmingRewardPlugin:
    @hookimpl
    def register_reward_assigners(self, register):
        register("pays_every_validate", PaysEveryValidate)


def test_a_farmable_reward_fails_the_audit_unless_it_is_documented(tmp_path, registered_plugin):
    registered_plugin(FarmingRewardPlugin(), name="farming-reward")
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honestLabels")
    report = audit(spec, rewards=["pays_every_validate", "mlgym_score_delta", BEST], canaries=["validate_repeatedly"])
    farmed = report.results[-1]
    assert farmed.verdict == FARMABLE and not report.ok
    assert "pays_every_validate summed" in farmed.detail and "mlgym_score_delta summed" in farmed.detail
    assert f"{BEST} summed" not in farmed.detail  # best minus baseline, however often it validates
    assert farmed.limits[BEST] == pytest.approx(0.075)  # the best score minus a baseline set just below it


PREPARED = """\
import shutil
shutil.copy("prepared.csv", "submission.csv")
"""
"""A baseline that submits the labels the test prepared (``prepared.csv``, written once the split is known)."""


@pytest.mark.parametrize("validate_rows_right", [True, False])
def test_farming_is_judged_whatever_rows_validate_and_submit_score(tmp_path, validate_rows_right):
    """Validate and submit score disjoint rows (held_out): a submission right on one part and wrong on the other is
    scored 1.0 at every validate and 0.0 at submit, or the reverse. A reward that pays every validate still farms,
    and the one that pays improvements still does not, whichever part the submission got right."""
    from mlgym_registry.episodes.episode import env_parts
    from mlgym_registry.integrity.auditor import SEED

    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "lopsidedLabels", baseline=PREPARED,
                               submission=weak_tasks.HONEST_SCHEMA)
    spec = spec.replace(starter_code=[*spec.starter_code, "prepared.csv"])
    (tmp_path / "task" / "prepared.csv").write_text("id,label\n")
    env = registry.make(spec)  # the split of the farming canary's episode: the audit's seed, on an env made as it is
    try:
        env.set_seed(SEED)
        env.reset()
        split = env_parts(env)[0].backend.row_split()
    finally:
        env.close()
    answers = [line.split(",") for line in (tmp_path / "task" / "answers.csv").read_text().split()[1:]]
    labels = [(i, y if split.keeps(i, "validate") == validate_rows_right else str(1 - int(y))) for i, y in answers]
    (tmp_path / "task" / "prepared.csv").write_text("id,label\n" + "".join(f"{i},{y}\n" for i, y in labels))

    report = audit(spec, rewards=["mlgym_score_delta", BEST], canaries=["validate_repeatedly"])
    farmed = report.results[-1]
    validates, submitted = [s["accuracy"] for s in farmed.scores[:-1]], farmed.scores[-1]["accuracy"]
    assert validates == [1.0 if validate_rows_right else 0.0] * len(validates) and len(validates) > 1, farmed
    assert submitted == (0.0 if validate_rows_right else 1.0), farmed
    assert farmed.verdict == DOCUMENTED_FARMING, farmed.detail
    assert "mlgym_score_delta summed" in farmed.detail and f"{BEST} summed" not in farmed.detail


class ExtraCanaries:
    """A plugin's canary set: one canary for tasks that hide answers."""

    @hookimpl
    def register_canaries(self, register):
        def canaries(spec):
            if not spec.secret_files:
                return []
            return [Canary("list_the_answers", "hack", "print the hidden answers", ("cat answers.csv || true",),
                           bound=FLOOR, submits=True)]

        register("hidden-answers", canaries)


def test_plugins_and_task_files_add_canaries_and_the_kit_fixture_fails_a_weak_task(tmp_path, registered_plugin,
                                                                                 integrity_audit):
    registered_plugin(ExtraCanaries(), name="extra-canaries")
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.PAYS_AN_EMPTY_SUBMISSION, "emptyLabels")
    spec.extra["canaries"] = [{"name": "forged_line", "tries": "print a perfect score", "bound": "floor",
                               "commands": ["echo '{\"accuracy\": 1.0}'"]}]
    with pytest.raises(ConformanceError, match=r"header_only \(BEATS HONESTY\)"):
        integrity_audit(spec, canaries=["header_only", "list_the_answers", "forged_line"])
    report = audit(spec, canaries=["list_the_answers", "forged_line"])
    sources = {r.canary.name: r.canary.source for r in report.results}
    assert sources["list_the_answers"] == "extra-canaries" and sources["forged_line"] == "task"
    assert report.ok, report.table()  # the answers stay hidden and a printed line is no score
    assert set(registry.names("canary")) == {"mlgym_registry", "hidden-answers"}


def test_a_csv_task_without_a_baseline_program_is_refused_saying_what_to_add(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "noBaseline").replace(baseline_paths=[])
    with pytest.raises(MLGymRegistryError, match="names no baseline program \\(baseline_paths\\).*add baseline_paths"):
        audit(spec)


def test_unknown_canary_names_get_a_did_you_mean(tmp_path):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honestLabels")
    with pytest.raises(Exception, match=r"'header_onl' \(did you mean 'header_only'\?\)"):
        audit(spec, canaries=["header_onl"])


def task_file(folder: Path, evaluator: str, task_id: str) -> Path:
    spec = weak_tasks.csv_task(folder, evaluator, task_id)
    data = {key: value for key, value in spec.to_dict().items()
            if key in ("id", "name", "description", "task_entrypoint", "training_timeout", "starter_code",
                       "baseline_paths", "baseline_scores", "worst_score", "evaluation_paths", "evaluation_read_only",
                       "secret_files", "max_steps")}
    path = folder / f"{task_id}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_command_prints_the_table_exits_one_and_list_and_info_mark_the_task(tmp_path):
    from conftest import run_cli

    env = {**os.environ, "MLGYM_REGISTRY_CACHE": str(tmp_path / "cache")}
    weak = task_file(tmp_path / "weak", weak_tasks.PAYS_AN_EMPTY_SUBMISSION, "emptyLabels")
    done = run_cli("check", "--integrity", str(weak), "--canary", "header_only", "--reward", BEST, env=env,
                   timeout=300)
    assert done.returncode == 1, done.stderr
    assert "header_only" in done.stdout and "BEATS HONESTY" in done.stdout and "gameability gap" in done.stdout
    info = run_cli("info", str(weak), "--json", env=env)
    assert json.loads(info.stdout)["integrity"] == "FAILED (header_only (BEATS HONESTY))"
    card = json.loads(info.stdout)["integrity_card"]  # the card's summary, and where the whole card is
    assert card["verdict"] == "FAILED (header_only (BEATS HONESTY))" and card["canaries"] == 4
    assert card["reward"]["floor_margin"][BEST] == pytest.approx(card["reward"]["honest"][BEST]
                                                                 - card["reward"]["floor"][BEST])
    whole = json.loads(Path(card["card"]).read_text())
    assert whole["capabilities"]["canaries"] == [*weak_tasks.REFERENCES_OK, "header_only"]
    assert whole["task_hash"] == card["task_hash"] and whole["package_version"] and whole["card_version"] == 1
    assert {c["name"]: c["verdict"] for c in whole["canaries"]}["header_only"] == "BEATS HONESTY"
    shown = run_cli("info", str(weak), env=env)
    assert "integrity: FAILED (header_only (BEATS HONESTY))" in shown.stdout.splitlines()
    # the failure's exploit: its fix in one line, and a recorded episode that replay plays to the same score
    (exploit,) = whole["exploits"]
    assert exploit["canary"] == "header_only" and exploit["fix"].startswith("refuse a submission without rows")
    assert "exploit: mlgym-registry replay " in done.stdout and exploit["replay"] in done.stdout
    command = shlex.split(exploit["replay"])[1:]  # mlgym-registry replay PATH --task NAME
    replayed = run_cli(*command, "--out", str(tmp_path / "replayed"), "--quiet", env=env, timeout=300)
    assert replayed.returncode == 0, replayed.stderr
    ours = json.loads((tmp_path / "replayed" / "replay-report.json").read_text())["our_scores"]
    assert [score_entry_metrics(score) for score in ours] == exploit["scores"] == [{"accuracy": 1.0}]

    honest = task_file(tmp_path / "honest", weak_tasks.HONEST_EVALUATOR, "honestLabels")
    done = run_cli("check", "--integrity", str(honest), "--canary", "header_only", "--json", env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    assert report["ok"] and report["gap"][BEST] == 0.0
    assert [r["canary"] for r in report["results"]] == [*weak_tasks.REFERENCES_OK, "header_only"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["prisonersDilemma", "battleOfSexes", "blotto", "capitals", "houseRegression"])
def test_every_built_in_task_passes_its_audit(task):
    report = audit(task)
    assert report.ok, report.table()
    assert report.gap[BEST] == 0.0
