"""``run --num-envs N`` records every step of every episode whatever N and the machine's load, and a run that loses
anything says so and exits non-zero: a soak at 16x the cores, a worker killed mid-episode, and a frame that never
arrived."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import run_cli

from mlgym_registry import registry
from mlgym_registry.scale.frame_receiver import FrameReceiver, is_infra_failure
from mlgym_registry.scale.frames import TURN, EnvJob, play_env
from mlgym_registry.scale.run_plan import episode_run

TASK = "prisonersDilemma"
SOAK_ENVS = 32
"""16x the 2 cores of the project's test machine."""


def episode(folder: Path) -> tuple[list[str], dict, dict]:
    """The actions, ``info`` and ``results.json`` of the episode recorded in ``folder``."""
    trajectory = json.loads((folder / f"{TASK}.traj").read_text())
    results = json.loads((folder / "results.json").read_text())
    return [step["action"] for step in trajectory["trajectory"]], trajectory, results


def scored_steps(trajectory: dict) -> int:
    """How many of the recorded steps were scored evaluations: each validate that shows a score, and the final
    submit of a submitted episode."""
    steps = trajectory["trajectory"]
    validated = sum("Evaluation Score" in (step["observation"] or "") for step in steps)
    submitted = bool(steps) and steps[-1]["action"].strip() == "submit" and \
        trajectory["info"].get("exit_status") == "submitted"
    return validated + submitted


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[str], dict]:
    """The episode of seed 0 played in one process: its actions and ``results.json``."""
    out = tmp_path_factory.mktemp("one") / "run"
    result = run_cli("run", TASK, "--policy", "scripted", "--seed", "0", "--out", str(out), "--quiet", timeout=300)
    assert result.returncode == 0, result.stderr
    actions, _, results = episode(out)
    assert actions[-1].strip() == "submit" and len(results["agent"]) == 3
    return actions, results


@pytest.mark.slow
def test_many_more_envs_than_cores_record_every_step_of_every_episode(tmp_path, reference):
    actions, results = reference
    out = tmp_path / "soak"
    started = time.monotonic()
    run = run_cli("run", TASK, "--policy", "scripted", "--num-envs", str(SOAK_ENVS), "--seed", "0", "--out",
                  str(out), timeout=420)
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "infra_error" not in run.stdout + run.stderr
    folders = sorted(out.glob("env*"), key=lambda folder: int(folder.name[3:]))
    assert [folder.name for folder in folders] == [f"env{index}" for index in range(SOAK_ENVS)]
    for folder in folders:
        recorded, trajectory, recorded_results = episode(folder)
        assert recorded == actions, folder  # every step the scripted policy plays, in order
        assert trajectory["info"]["exit_status"] == "submitted", folder
        assert "failed" not in recorded_results, folder
        assert len(recorded_results["agent"]) == scored_steps(trajectory) == 3, folder
    # env 0 plays seed 0: the very episode one process plays, score for score
    assert episode(folders[0])[2]["agent"] == results["agent"]
    print(f"{SOAK_ENVS} envs: {SOAK_ENVS * len(actions)} steps recorded in {seconds:.0f} s")


def forkserver_children(pid: int) -> list[psutil.Process]:
    """The worker processes of the run ``pid``: the children of its fork server."""
    for child in psutil.Process(pid).children():
        try:
            if "forkserver" in " ".join(child.cmdline()):
                return child.children()
        except psutil.Error:
            continue
    return []


def steps_recorded(out: Path) -> int:
    total = 0
    for traj in out.glob(f"env*/{TASK}.traj"):
        try:
            total += len(json.loads(traj.read_text())["trajectory"])
        except (OSError, ValueError):
            continue
    return total


@pytest.mark.slow
def test_a_worker_killed_mid_episode_is_an_infra_error_and_the_run_exits_non_zero(tmp_path, reference):
    actions, _ = reference
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlgym_registry.cli", "run", TASK, "--policy", "scripted", "--num-envs", "2",
         "--episodes", "4", "--seed", "0", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and steps_recorded(out) == 0 and proc.poll() is None:
            time.sleep(0.1)
        workers = forkserver_children(proc.pid)
        assert len(workers) == 2 and steps_recorded(out) < len(actions), "no episode was under way"
        os.kill(workers[0].pid, signal.SIGKILL)  # a worker dies mid-episode (out of memory, say)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, stdout + stderr
    lost, complete = [], []
    for folder in sorted(out.glob("env*")):
        recorded, trajectory, results = episode(folder)
        (lost if "failed" in results else complete).append((folder.name, recorded, trajectory, results))
    assert len(lost) == 1, [(name, results.get("failed")) for name, *_, results in lost]
    name, recorded, trajectory, results = lost[0]
    assert results["failed"].startswith("infra_error: its worker process died (exit code -9)")
    assert trajectory["info"].get("exit_status") != "exit_forfeit"
    assert f"{len(recorded)} step" in results["failed"]  # what arrived is kept, and the record says how much
    assert len(complete) == 3 and all(recorded == actions for _, recorded, _, _ in complete)
    label = f"env {name[3]} episode {name[5]}"
    assert f"  {label}: infra_error: its worker process died" in stderr
    assert "1 of 4 episodes were lost or cut short by the run itself" in stderr


def test_a_frame_that_never_arrives_makes_its_episode_an_infra_error(tmp_path):
    spec = registry.spec(TASK).replace(max_steps=3)
    frames = []
    job = EnvJob(spec.to_dict(), {"batch_size": ()}, "scripted", 0, (0,), (0,))
    assert play_env(job, frames.append) == 1  # in this process: the frames a worker sends for one episode
    kinds = [frame.kind for frame in frames]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count(TURN) == frames[-1].data["turns"] >= 3

    whole = FrameReceiver(episode_run(spec, "scripted", 1, out=tmp_path / "whole"))
    for frame in frames:
        whole.receive(frame)
    [result] = whole.results()
    assert not result.failure and result.finished and not whole.lost
    assert len(result.turns) == kinds.count(TURN)
    assert len(json.loads((tmp_path / "whole" / "env0" / f"{TASK}.traj").read_text())["trajectory"]) == \
        len(result.turns)

    gappy = FrameReceiver(episode_run(spec, "scripted", 2, out=tmp_path / "gappy"))
    for frame in frames[:2] + frames[3:]:  # the second turn's frame is lost on the way
        gappy.receive(frame)
    gappy.close("the run ended")  # env 1 never sent anything
    first, second = gappy.results()
    assert is_infra_failure(first) and first.failure.startswith("infra_error: frame 2 never arrived")
    assert len(first.turns) == kinds.count(TURN) - 1
    assert json.loads((tmp_path / "gappy" / "env0" / "results.json").read_text())["failed"] == first.failure
    assert is_infra_failure(second) and "no frame of it arrived" in second.failure
    assert json.loads((tmp_path / "gappy" / "env1" / "results.json").read_text())["failed"] == second.failure
    assert [line.split(":")[0] for line in gappy.lost] == ["env 0 episode 0", "env 1 episode 0"]
