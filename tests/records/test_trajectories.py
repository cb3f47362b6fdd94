"""MLGym's .traj and results.json: reading real recordings, writing our own, and atomic per-step saves."""

from __future__ import annotations

import json

import pytest
from conftest import recorded_results
from outside_data import recorded_run_params

from mlgym_registry.records import trajectories
from mlgym_registry.records.trajectories import (
    STEP_KEYS,
    Step,
    TrajectoryError,
    TrajectoryWriter,
    lined_json,
    load_results,
    load_traj,
    trajectory_from_dict,
)


def make_step(action: str = "ls -a\n", observation: str = "strategy.py") -> Step:
    response = f"DISCUSSION\nlook\n```\n{action}```"
    return Step(action=action, observation=observation, response=response, state='{"open_file": "n/a"}',
                thought="DISCUSSION\nlook\n", execution_time=0.25)


def test_writer_saves_loadable_files_after_every_step(tmp_path):
    writer = TrajectoryWriter(tmp_path, "prisonersDilemma", baseline={"Score": 2.37})
    writer.system("system prompt")
    writer.user("task prompt")
    assert load_traj(writer.traj_path).steps == []
    writer.step(make_step(), info={"score": [], "exit_status": ""})
    loaded = load_traj(tmp_path / "prisonersDilemma.traj")
    assert [s.action for s in loaded.steps] == ["ls -a\n"]
    assert [h["role"] for h in loaded.history] == ["system", "user", "assistant"]
    assert loaded.history[-1]["action"] == "ls -a\n" and loaded.history[-1]["thought"] == "DISCUSSION\nlook\n"
    writer.user("next prompt")
    writer.step(make_step("submit\n", "Exited (submit)"), info={"score": [{"Score": 2.6}], "exit_status": "submitted"})
    writer.finish()
    loaded = load_traj(writer.traj_path)
    assert len(loaded.steps) == 2 and loaded.info["exit_status"] == "submitted"
    assert load_results(writer.results_path) == {"agent": [{"Score": 2.6}], "baseline": {"Score": 2.37}}
    data = json.loads(writer.traj_path.read_text())
    assert list(data) == ["environment", "trajectory", "history", "info"]
    assert list(data["trajectory"][0]) == list(STEP_KEYS)
    assert not list(tmp_path.glob(".*.tmp")), "temporary files must not be left behind"


def test_a_batch_of_writer_calls_saves_once_at_its_end_one_step_a_line(tmp_path):
    """A turn's step and the next prompt are one write of each file (``batch``), and ``results.json`` is written only
    when its text changes; the ``.traj`` holds one step, one message, per line."""
    writer = TrajectoryWriter(tmp_path, "t", baseline={"Score": 1.0})
    writer.system("system prompt")
    writer.user("task prompt")
    writer.results_path.write_text("left alone while it does not change")
    with writer.batch():
        writer.step(make_step(), info={"score": []})
        writer.user("next prompt")
        assert len(load_traj(writer.traj_path).steps) == 0  # not yet: at the end of the block
    loaded = load_traj(writer.traj_path)
    assert [s.action for s in loaded.steps] == ["ls -a\n"]
    assert [h["role"] for h in loaded.history] == ["system", "user", "assistant", "user"]
    assert writer.results_path.read_text() == "left alone while it does not change"
    with pytest.raises(RuntimeError), writer.batch():  # a block that raises still saves what it recorded
        writer.step(make_step("submit\n", "done"), info={"score": [{"Score": 2.0}]})
        raise RuntimeError("the env broke")
    assert len(load_traj(writer.traj_path).steps) == 2
    assert load_results(writer.results_path)["agent"] == [{"Score": 2.0}]  # changed: written
    lines = writer.traj_path.read_text().splitlines()
    assert lines[:3] == ['{', '  "environment": "mlgym_registry",', '  "trajectory": [']
    assert [json.loads(line.rstrip(","))["action"] for line in lines[3:5]] == ["ls -a\n", "submit\n"]
    assert len([line for line in lines if line.startswith('    {"role": ')]) == 5


def test_each_save_writes_the_whole_trajectory_as_it_is_encoding_only_what_was_added(tmp_path):
    """The ``.traj`` written after every step is the text of the whole trajectory (``lined_json`` of its
    ``to_dict``), token ids kept against the previous step; a save encodes only the steps and messages recorded
    since the last one, so a step costs the same at any length of episode."""
    writer = TrajectoryWriter(tmp_path, "t", provenance={"command": "run"})
    writer.system("system prompt")
    encoded = []

    class CountedStep(type(make_step())):
        def to_dict(self, previous=None):
            encoded.append(self.action)
            return super().to_dict(previous)

    for turn in range(30):
        writer.user(f"prompt {turn}")
        step = CountedStep(**vars(make_step(f"echo {turn}\n")))
        step.prompt_tokens, step.response_tokens = list(range(turn * 3 + 2)), [turn * 3, turn * 3 + 1]
        encoded.clear()
        writer.step(step, info={"score": [{"Score": float(turn)}]})
        assert encoded == [f"echo {turn}\n"]  # this step only
        expected = writer.trajectory().to_dict()
        expected["run"] = writer.provenance
        assert writer.traj_path.read_text() == lined_json(expected, default=trajectories._default)
    loaded = load_traj(writer.traj_path)
    assert loaded.turn_tokens()[29] == (list(range(89)), [87, 88], None)  # 86 ids kept from step 28, then 3 new
    assert json.loads(writer.traj_path.read_text())["trajectory"][29]["prompt_tokens_kept"] == 86
    # a step replaced in the list (never done by the writer itself) is written as it now is
    writer.steps[5] = make_step("replaced\n")
    writer.save()
    assert load_traj(writer.traj_path).steps[5].action == "replaced\n"


def test_writer_turns_numpy_and_paths_into_json(tmp_path):
    np = pytest.importorskip("numpy")
    writer = TrajectoryWriter(tmp_path, "t")
    writer.finish(info={"score": [{"Score": np.float32(1.5)}], "submission": tmp_path / "x.py"})
    assert load_results(writer.results_path)["agent"] == [{"Score": 1.5}]
    assert load_traj(writer.traj_path).info["submission"] == str(tmp_path / "x.py")


@pytest.mark.parametrize("data, message", [
    ([], "JSON object"),
    ({"trajectory": [], "history": []}, "lacks the key"),
    ({"environment": "e", "trajectory": [{"action": "ls"}], "history": [], "info": {}}, "step 0 lacks"),
])
def test_invalid_trajectories_are_reported(data, message):
    with pytest.raises(TrajectoryError, match=message):
        trajectory_from_dict(data)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(TrajectoryError, match="does not exist"):
        load_traj(tmp_path / "nope.traj")
    broken = tmp_path / "broken.traj"
    broken.write_text('{"environment": ')
    with pytest.raises(TrajectoryError, match="not valid JSON"):
        load_traj(broken)


@pytest.mark.trajectories
@pytest.mark.parametrize("path", recorded_run_params())
def test_recorded_mlgym_trajectories_load(path):
    trajectory = load_traj(path)
    assert trajectory.steps, "every recorded run has steps"
    assert trajectory.history[0]["role"] == "system"
    if trajectory.info.get("exit_status"):
        assert len(trajectory.history) == 2 * len(trajectory.steps) + 1
    else:  # a run that stopped abruptly may hold a last exchange its trajectory never recorded
        assert len(trajectory.history) >= 2 * len(trajectory.steps) + 1
    results_path = recorded_results(path)
    if results_path is not None:
        assert load_results(results_path)["agent"] == trajectory.scores
