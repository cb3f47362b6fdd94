"""`mlgym-registry replay`: recorded MLGym runs go through our env, and the report compares them step by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from background_replays import REPLAY_ALL_VARIABLE, covering_runs, replayed, step_classes
from outside_data import RECORDED, needs_recorded_runs, recorded_run_params

from mlgym_registry import TaskFilesMissing, TaskSpec, registry
from mlgym_registry.cli import main as cli_main
from mlgym_registry.commands.replay import default_task, format_report, replay
from mlgym_registry.records.observation_kinds import KINDS
from mlgym_registry.records.trajectories import load_traj


def write_traj(path: Path, responses: list[tuple[str, str]], environment: str = "mlgym_main",
               observations: list[str] | None = None) -> Path:
    """A minimal MLGym .traj with these (response, action) steps and their recorded ``observations`` (empty by
    default)."""
    observations = observations or [""] * len(responses)
    steps = [{"action": action, "observation": observation, "response": response, "state": "{}", "thought": response,
              "execution_time": 0.1} for (response, action), observation in zip(responses, observations, strict=True)]
    history = [{"role": "system", "content": "s", "agent": "primary"}]
    for step in steps:
        history += [{"role": "user", "content": "u", "agent": "primary"},
                    {"role": "assistant", "content": step["response"], "agent": "primary"}]
    path.write_text(json.dumps({"environment": environment, "trajectory": steps, "history": history,
                                "info": {"exit_status": "submitted", "score": [{"Score": 2.5}]}}))
    return path


def test_default_task_prefers_mlgym_ids_and_warns_for_mlgym_recordings(tmp_path):
    folder = tmp_path / "prisonersDilemma"
    folder.mkdir()
    recorded = write_traj(folder / "model_run0.traj", [])
    task, warnings = default_task(recorded, "mlgym_main")
    assert task == "prisonersDilemma" and "aimed at MLGym's starter files" in warnings[0]
    assert default_task(recorded, "mlgym_registry:local") == ("prisonersDilemma", [])
    registry.register("task", "mlgym/prisonersDilemma", registry.spec("prisonersDilemma").replace(components={}))
    try:
        assert default_task(recorded, "mlgym_main") == ("mlgym/prisonersDilemma", [])
    finally:
        registry.unregister("task", "mlgym/prisonersDilemma")
    with pytest.raises(SystemExit, match="pass --task NAME"):
        default_task(write_traj(tmp_path / "unknown.traj", []), "mlgym_main")


def test_format_errors_and_made_up_exit_steps_replay_like_mlgym(tmp_path):
    recorded = write_traj(tmp_path / "blotto.traj", [
        ("DISCUSSION\nlook\n```\nls -a\n```", "ls -a\n"),
        ("I forgot the command block.", ""),
        ("Exit due to format error", "exit_format"),
    ])
    report = replay(recorded, "blotto", tmp_path / "out", seed=0)
    assert [step.our_kind for step in report.steps] == ["plain", "format_error", "exit"]
    assert report.our_exit_status == "autosubmission (exit_format)"
    assert len(report.our_scores) == 1  # the autosubmission scored the starter code
    text = format_report(report)
    assert "same observation kind on" in text and "autosubmission (exit_format)" in text
    saved = json.loads((tmp_path / "out" / "replay-report.json").read_text())
    assert saved["our_exit_status"] == "autosubmission (exit_format)" and len(saved["steps"]) == 3
    assert len(load_traj(tmp_path / "out" / "blotto.traj").steps) == 3


def test_replay_command_on_a_task_given_by_name(tmp_path, capsys):
    recorded = write_traj(tmp_path / "anything.traj", [("```\nvalidate\n```", "validate\n"),
                                                       ("```\nsubmit\n```", "submit\n")])
    assert cli_main(["replay", str(recorded), "--task", "battleOfSexes", "--out", str(tmp_path / "out"),
                     "--quiet", "--seed", "0"]) == 0
    shown = capsys.readouterr().out
    assert "validate_score" in shown and "submitted" in shown
    assert "final score       {'Score': 2.5}" in shown


def test_a_broken_trajectory_is_refused_before_any_env_is_built(tmp_path, capsys):
    broken = tmp_path / "prisonersDilemma.traj"
    broken.write_text('{"environment": "mlgym_main"}')
    assert cli_main(["replay", str(broken)]) == 2
    assert "lacks the key(s)" in capsys.readouterr().err


def test_replay_works_on_a_task_registered_from_a_spec(tmp_path):
    spec = TaskSpec.from_dict({**registry.spec("prisonersDilemma").to_dict(), "id": "pdCopy", "components": {}})
    registry.register("task", "pdCopy", spec)
    try:
        recorded = write_traj(tmp_path / "pdCopy.traj", [("```\nsubmit\n```", "submit\n")],
                              environment="mlgym_registry:local")
        report = replay(recorded, default_task(recorded, "mlgym_registry:local")[0], tmp_path / "out")
    finally:
        registry.unregister("task", "pdCopy")
    assert report.task == "pdCopy" and report.our_exit_status == "submitted" and not report.warnings


REPLAYED = replayed(RECORDED)
"""The recorded runs the session replays: the fewest that hold every class of step the records hold
(``background_replays.covering_runs``), or all of them with ``MLGYM_REPLAY_ALL=1``."""


def write_classed_traj(path: Path, steps: list[tuple[str, str]]) -> Path:
    """A .traj at ``path`` (``<task>/<run>.traj``) whose steps are these (action, observation) pairs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_traj(path, [(f"```\n{action}\n```", action) for action, _ in steps],
                      observations=[observation for _, observation in steps])


def test_the_covering_runs_are_the_fewest_cheap_runs_that_hold_every_class_of_step(tmp_path):
    window = "[File: /home/agent/workspace/strategy.py (3 lines total)]\n1:x"
    score = "Your code produced a valid submission artefact at /w/target.py.\nBaseline Score: {}\nEvaluation Score: {}"
    broad = write_classed_traj(tmp_path / "blotto" / "a_run0.traj",
                               [("ls", "x"), ("open strategy.py", window), ("validate", score),
                                ("submit", "Exited (submit)")])
    # holds nothing the broad run does not
    narrower = write_classed_traj(tmp_path / "blotto" / "a_run1.traj", [("ls", "y"), ("submit", "Exited (submit)")])
    # the only run with a lint rejection: it must be replayed, however long
    lint = "ERRORS:\n- E999 x\nThis is how your edit would have looked if applied\n"
    rare = write_classed_traj(tmp_path / "blotto" / "b_run0.traj",
                              [("ls", "z"), *[("validate", score)] * 5, ("edit 1:1\nx\nend_of_edit", lint)])
    # the same classes as the broad one, at a higher cost (more evaluations)
    dearer = write_classed_traj(tmp_path / "blotto" / "c_run0.traj",
                                [("ls", "x"), ("open strategy.py", window), ("validate", score), ("validate", score),
                                 ("submit", "Exited (submit)")])
    # another task's steps are other classes
    other = write_classed_traj(tmp_path / "prisonersDilemma" / "a_run0.traj", [("ls", "x")])
    paths = [broad, narrower, rare, dearer, other]
    chosen = covering_runs(paths)
    assert sorted(chosen) == sorted([broad, rare, other])
    assert set().union(*map(step_classes, chosen)) == set().union(*map(step_classes, paths))
    assert ("blotto", "edit", "lint_rejection") in step_classes(rare)
    assert ("blotto", "validate", "validate_score") in step_classes(broad)
    assert covering_runs([]) == []


@needs_recorded_runs
def test_the_replayed_runs_hold_every_class_of_step_the_recorded_runs_hold(monkeypatch):
    held = set().union(*map(step_classes, REPLAYED))
    assert held == set().union(*map(step_classes, RECORDED))
    assert {kind for _, _, kind in held} >= {"file_window", "validate_score", "validate_error", "submitted"}
    # each run picked adds a class the others lack: on the shared records, 13 of the 36 runs hold all 33 classes
    assert len(REPLAYED) <= min(len(held), len(RECORDED))
    monkeypatch.setenv(REPLAY_ALL_VARIABLE, "1")
    assert replayed(RECORDED) == RECORDED


@pytest.fixture
def recorded_replays(background_replays):
    """The session's replays of the recorded runs (``background_replays.py``), started with the session."""
    return background_replays


@pytest.mark.slow
@pytest.mark.trajectories
@pytest.mark.parametrize("path", recorded_run_params(REPLAYED))
def test_each_replayed_mlgym_run_replays_and_is_reported(path, recorded_replays):
    recorded = load_traj(path)
    try:
        default_task(path, recorded.environment)
    except SystemExit as exc:  # one of MLGym's other tasks, and no MLGym checkout here
        pytest.skip(str(exc))
    out, future = recorded_replays[path]
    try:
        report = future.result()
    except TaskFilesMissing as exc:  # the checkout lacks data MLGym prepares outside its repository
        assert "stopped with TaskFilesMissing" in json.loads((out / "replay-report.json").read_text())["note"]
        pytest.skip(str(exc))
    assert report.completed and (out / "replay-report.json").is_file()
    assert report.steps and len(report.steps) <= len(recorded.steps)
    assert all(step.recorded_kind in KINDS and step.our_kind in KINDS + ("format_error",) for step in report.steps)
    # the first command of every recorded run (looking around) gives the same kind of observation here
    assert report.steps[0].same_kind
    [ours] = out.glob("*.traj")  # named after the task id, as MLGym names its own
    assert load_traj(ours).steps


MATCHING_SHARE = 0.95
"""The share of the replayed runs' steps whose replay on our own tasks must give the recorded kind of observation,
the steps cut by the replays' evaluation cap left out. Over the 13 runs the session replays: 97.9% (232 of 237 steps)
on 2026-12-07; over all 36 (``MLGYM_REPLAY_ALL=1``): 96.1% (598 of 622) on an idle machine, 96.0% under the suite's
load. The others are our tasks' own design, not faults: the evaluation's files (``target.py``) are read-only, so
edits MLGym let through are refused (``read_only_edit``) and the strategies that relied on them fail to validate; the
sandbox has no network (``pip install`` times out). On MLGym's own tasks (an ``MLGYM_ROOT`` checkout)
``test_local_backend.py`` replays them too."""

CAPPED = ("the evaluation did not finish within", "the evaluation ran out of time while")
"""What our observation says of an evaluation that the replays' short cap (``background_replays.EVALUATION_CAP``)
cut: MLGym's runs had far longer, so such a step tells nothing of the env (2 of the 239 steps of the 13 runs the
session replays; over all 36, 21 steps on an idle machine and 38 under the suite's load: numpy strategies that play
10,000 games slowly)."""

CAPPED_SHARE = 0.10
"""The most of the steps the cap may cut: an env whose every evaluation hung would hide its steps there."""


@pytest.mark.slow
@pytest.mark.trajectories
def test_the_replays_give_the_recorded_kind_of_observation_on_nearly_every_step(recorded_replays):
    """Over every recorded run replayed (the session's background replays), the steps whose observation is of the
    kind MLGym recorded: a change that breaks a kind of step shows here, though each run's own test (which checks its
    first step) passes."""
    if set(recorded_replays) != set(REPLAYED):
        pytest.skip(f"the share is over the {len(REPLAYED)} runs the session replays, and {len(recorded_replays)} "
                    "were selected")
    reports = {}
    for path, (_, outcome) in recorded_replays.items():
        if outcome is None:  # one of MLGym's other tasks, with no MLGym checkout here
            continue
        try:
            reports[path] = outcome.result()
        except TaskFilesMissing:
            continue
    if not reports:
        pytest.skip("no recorded run of our tasks was replayed")
    steps = [(path, step) for path, report in reports.items() for step in report.steps]
    counted = [(path, step) for path, step in steps if not any(text in step.our_observation for text in CAPPED)]
    capped = len(steps) - len(counted)
    assert capped <= CAPPED_SHARE * len(steps), f"{capped} of {len(steps)} steps hit the evaluation cap"
    others = [f"{path.parent.name}/{path.stem} step {step.index + 1}: recorded {step.recorded_kind}, "
              f"ours {step.our_kind} ({step.action.strip()[:60]!r})" for path, step in counted if not step.same_kind]
    share = 1 - len(others) / len(counted)
    assert share >= MATCHING_SHARE, (f"{len(others)} of {len(counted)} steps of {len(reports)} runs got another kind "
                                     f"of observation ({capped} more hit the evaluation cap):\n"
                                     + "\n".join(others))


def test_several_runs_replay_in_parallel_jobs_and_report_in_the_order_given(tmp_path, capsys):
    folder = tmp_path / "runs"
    folder.mkdir()
    first = write_traj(folder / "b_first.traj", [("```\nls\n```", "ls\n"), ("```\nsubmit\n```", "submit\n")],
                       environment="mlgym_registry:local")
    second = write_traj(folder / "a_second.traj", [("```\nsubmit\n```", "submit\n")],
                        environment="mlgym_registry:local")
    out = tmp_path / "out"
    assert cli_main(["replay", str(first), str(second), "--task", "battleOfSexes", "--out", str(out), "--jobs", "2",
                     "--quiet", "--seed", "0"]) == 0
    shown = capsys.readouterr().out
    assert shown.index("b_first.traj") < shown.index("a_second.traj")  # the order given, not the order of ending
    assert "replayed 2 of 2 runs with 2 jobs" in shown
    names = ("runs-b_first", "runs-a_second")
    reports = [json.loads((out / name / "replay-report.json").read_text()) for name in names]
    assert [len(report["steps"]) for report in reports] == [2, 1]
    assert all(report["our_exit_status"] == "submitted" for report in reports)
    # a folder: its .traj files, sorted
    assert cli_main(["replay", str(folder), "--task", "battleOfSexes", "--out", str(tmp_path / "out2"), "--jobs", "1",
                     "--quiet", "--seed", "0"]) == 0
    shown = capsys.readouterr().out
    assert shown.index("a_second.traj") < shown.index("b_first.traj")
    with pytest.raises(SystemExit):
        cli_main(["replay", str(first), "--jobs", "0"])
