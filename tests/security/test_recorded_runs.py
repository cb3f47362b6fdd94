"""A recorded run from elsewhere played again: its record may choose the task, components, seed and max steps, never
how the replay is confined or what it trusts; and a replay never rebuilds the evaluator or the opponent from what the
recorded agent printed.

Each attack is a ``.traj`` whose actions would leave a file on the host outside the sandbox (``touch``), replayed
through the real CLI (``replay``, ``run --policy replay:``, ``bench --policy replay:``) and judged from the host: the
file must not exist, and nothing may have been written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.cli import main as cli_main
from mlgym_registry.records.trust import split_record

from .helpers import PACKAGE_TASK_DATA

pytestmark = pytest.mark.security

TASK = "prisonersDilemma"
MAX_SCORE = 5.0
"""The best payoff of a round of the Prisoner's Dilemma: no strategy can honestly score above it."""


def recorded_traj(path: Path, steps: list[tuple[str, str]], record: dict | None, environment: str = "") -> Path:
    """A ``.traj`` of ``(action, observation)`` steps (each response the action in a code block), with ``record`` as
    its ``"run"`` record (none when None)."""
    trajectory = [{"action": action, "observation": observation, "response": f"DISCUSSION\nx\n```\n{action}\n```",
                   "state": "{}", "thought": "x", "execution_time": 0.1} for action, observation in steps]
    data = {"environment": environment or "mlgym_registry:local", "trajectory": trajectory, "history": [],
            "info": {"exit_status": "submitted", "score": []}}
    if record is not None:
        data["run"] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def run_record(**changes) -> dict:
    """A run record as this package writes one, on ``TASK`` with its own components, changed by ``changes``."""
    record = {"task": {"name": TASK, "id": TASK, "hash": "sha256:0", "file": None},
              "components": {"backend": {"name": "local"}, "reward": {"name": "mlgym_score_delta"}},
              "seed": 0, "max_steps": 3, "backend_options": {}, "policy": {"name": "scripted"},
              "versions": {}, "started": "2026-01-01T00:00:00", "ended": None}
    record.update(changes)
    return record


def touching(tmp_path: Path, record: dict | None, submit: bool = True) -> tuple[Path, Path]:
    """A recorded run whose first action creates ``marker`` on the host (outside the sandbox), then submits unless
    not ``submit``; (traj, marker)."""
    marker = tmp_path / "written-on-the-host"
    steps = [(f"touch {marker}", "")] + ([("submit", "")] if submit else [])
    return recorded_traj(tmp_path / "downloaded" / f"{TASK}.traj", steps, record), marker


def commands(traj: Path, out: Path) -> dict[str, list[str]]:
    """The readers of a recorded run, each replaying ``traj`` into ``out``."""
    return {
        "replay": ["replay", str(traj), "--out", str(out), "--quiet"],
        "run": ["run", TASK, "--policy", f"replay:{traj}", "--out", str(out), "--quiet"],
    }


HELD = [
    pytest.param({"backend_options": {"sandbox": "none"}}, "sandbox", "-o sandbox=none", id="sandbox-none"),
    pytest.param({"backend_options": {"network": True}}, "network", "-o network=true", id="network"),
    pytest.param({"backend_options": {"trust_agent_code": True}}, "trust_agent_code", "-o trust_agent_code=true",
                 id="trust-agent-code"),
    pytest.param({"backend_options": {"python": "/usr/bin/python3"}}, "python", "-o python=/usr/bin/python3",
                 id="python"),
    pytest.param({"backend_options": {"data_dir": "/srv/other-data"}}, "data_dir", "-o data_dir=/srv/other-data",
                 id="data-dir"),
    pytest.param({"backend_options": {"memory_limit_mb": 10**6}}, "memory_limit_mb", "-o memory_limit_mb=1000000",
                 id="memory-limit"),
    pytest.param({"backend_options": {"max_processes": 10**6}}, "max_processes", "-o max_processes=1000000",
                 id="process-limit"),
    pytest.param({"backend_options": {"command_timeout": 10**6}}, "command_timeout", "-o command_timeout=1000000",
                 id="time-limit"),
    pytest.param({"backend_options": {"gpus": True}}, "gpus", "-o gpus=true", id="gpus"),
    pytest.param({"backend_options": {"an_option_of_tomorrow": 1}}, "an_option_of_tomorrow",
                 "-o an_option_of_tomorrow=1", id="unknown-option"),
    pytest.param({"components": {"backend": {"name": "mlgym"}}}, "backend", "--backend mlgym", id="backend"),
    pytest.param({"components": {"template": {"name": "/tmp/someone-elses-template.yaml"}}}, "template",
                 "--template NAME", id="template-by-path"),
    pytest.param({"components": {"reward": {"name": "evil_module:reward"}}}, "reward", "--reward NAME",
                 id="reward-by-reference"),
]


@pytest.mark.parametrize(("changes", "name", "flag"), HELD)
def test_a_record_choosing_confinement_or_trust_is_refused_and_nothing_runs(tmp_path, capsys, changes, name, flag):
    traj, marker = touching(tmp_path, run_record(**changes))
    for command, argv in commands(traj, tmp_path / "out").items():
        assert cli_main(argv) == 2, command
        error = capsys.readouterr().err
        assert f"the run record of {traj} chooses settings that a recorded run may not choose" in error, command
        assert f"  {name} = " in error and error.rstrip().endswith(flag), (command, error)
        assert not marker.exists(), command
        assert not (tmp_path / "out").exists(), command


def test_every_refused_setting_is_listed_with_its_flag(tmp_path, capsys):
    record = run_record(backend_options={"sandbox": "none", "network": True, "python": "/opt/py"},
                        components={"backend": {"name": "mlgym"}})
    traj, marker = touching(tmp_path, record)
    assert cli_main(commands(traj, tmp_path / "out")["replay"]) == 2
    lines = capsys.readouterr().err.strip().split("\n")[1:]
    assert lines == ["  backend = 'mlgym' (here: 'local'): --backend mlgym",
                     "  sandbox = 'none' (here: 'bwrap'): -o sandbox=none",
                     "  network = True (here: False): -o network=true",
                     "  python = '/opt/py' (here: None): -o python=/opt/py"]
    assert not marker.exists()


def test_a_task_the_record_names_by_path_is_not_loaded(tmp_path, capsys):
    forged_task = tmp_path / "downloaded" / "task.yaml"
    forged_task.parent.mkdir()
    forged_task.write_text((PACKAGE_TASK_DATA.parent / f"{TASK}.yaml").read_text()
                           + "backend_options:\n  sandbox: none\n")
    traj, marker = touching(tmp_path, run_record(task={"name": str(forged_task)}))
    assert cli_main(commands(traj, tmp_path / "out")["replay"]) == 2
    error = capsys.readouterr().err
    assert f"  task = {str(forged_task)!r} (here: unset, not a registered task name): --task NAME" in error
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_bench_refuses_a_replayed_record_that_chooses_confinement(tmp_path, capsys):
    traj, marker = touching(tmp_path, run_record(backend_options={"sandbox": "none"}))
    out = tmp_path / "suite"
    assert cli_main(["bench", TASK, "--policy", f"replay:{traj}", "--runs", "1", "--out", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("-o sandbox=none")
    assert not marker.exists() and not out.exists()


def test_the_command_lines_value_wins_over_the_records(tmp_path):
    traj, marker = touching(tmp_path, run_record(backend_options={"sandbox": "none", "command_timeout": 5}),
                            submit=False)
    for command, argv in commands(traj, tmp_path / "out").items():
        out = tmp_path / f"out-{command}"
        argv = [*argv[:-3], "--out", str(out), "--quiet", "-o", "sandbox=bwrap", "-o", "command_timeout=9"]
        assert cli_main(argv) in (0, 1), command  # 1: the recorded steps ran out before the episode ended
        assert not marker.exists(), command  # sandboxed: the touch never reached the host
        [results] = out.glob("**/results.json")
        assert json.loads(results.read_text())["run"]["backend_options"] == {"sandbox": "bwrap",
                                                                             "command_timeout": 9}


@pytest.mark.parametrize("command", ["replay", "run"])
def test_a_setting_passed_again_is_honoured(tmp_path, command):
    traj, marker = touching(tmp_path, run_record(backend_options={"sandbox": "none"}))
    out = tmp_path / "out"
    assert cli_main([*commands(traj, out)[command], "-o", "sandbox=none"]) in (0, 1)
    assert marker.exists()  # the user chose to run it unsandboxed, and typed it
    assert json.loads((out / "results.json").read_text())["run"]["backend_options"] == {"sandbox": "none"}


def test_settings_equal_to_what_would_be_used_anyway_are_not_refused(tmp_path):
    record = run_record(backend_options={"sandbox": "bwrap", "network": False, "gpus": False},
                        components={"backend": {"name": "local"}})
    traj, marker = touching(tmp_path, record)
    assert cli_main(commands(traj, tmp_path / "out")["replay"]) in (0, 1)
    assert not marker.exists()


def test_task_components_seed_and_max_steps_are_still_taken_from_the_record(tmp_path):
    record = run_record(task={"name": "battleOfSexes"}, seed=7, max_steps=2,
                        components={"reward": {"name": "mlgym_best_improvement"}, "history": {"name": "full"}})
    traj = recorded_traj(tmp_path / "downloaded" / "anything.traj", [("ls", ""), ("submit", "")], record)
    assert cli_main(["replay", str(traj), "--out", str(tmp_path / "replayed"), "--quiet"]) == 0
    again = json.loads((tmp_path / "replayed" / "results.json").read_text())["run"]
    assert again["task"]["name"] == "battleOfSexes" and again["seed"] == 7 and again["max_steps"] == 2
    assert again["components"]["reward"]["name"] == "mlgym_best_improvement"
    assert again["backend_options"] == {}
    assert cli_main(["run", "battleOfSexes", "--policy", f"replay:{traj}", "--out", str(tmp_path / "run"),
                     "--quiet"]) == 0
    again = json.loads((tmp_path / "run" / "results.json").read_text())["run"]
    assert again["seed"] == 7 and again["max_steps"] == 2
    assert again["components"]["reward"]["name"] == "mlgym_best_improvement"


@pytest.mark.slow
def test_report_never_measures_the_noise_band_with_a_run_folders_backend_options(tmp_path, capsys):
    suite = tmp_path / "suite"
    assert cli_main(["bench", TASK, "--runs", "1", "--max-steps", "1", "--seed", "0", "--out", str(suite),
                     "--quiet"]) == 0
    # the downloaded folder's settings say: start the noise band's episodes with this "python", unsandboxed
    marker = tmp_path / "written-on-the-host"
    fake = tmp_path / "downloaded-python"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexec python3 \"$@\"\n")
    fake.chmod(0o755)
    [settings_file] = suite.glob("*__run_0/settings.json")
    data = json.loads(settings_file.read_text())
    data["settings"]["backend_options"] = {"python": str(fake), "sandbox": "none"}
    settings_file.write_text(json.dumps(data))
    assert cli_main(["report", str(suite), "--out", str(tmp_path / "report"), "--no-plot"]) == 0
    capsys.readouterr()
    assert not marker.exists()
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "## Noise band of the starter code" in summary and "noise band stopped" not in summary


def test_the_record_is_split_by_an_allow_list():
    record = run_record(backend_options={"sandbox": "none"}, sandbox="none", seed=True, max_steps=0,
                        components={"parser": {"name": "thought_action"}, "backend": {"name": "local"},
                                    "isolator": {"name": "pkg.mod:Isolator"}, "jailer": {"name": "x"}})
    settings = split_record(record)
    assert settings.task == TASK and settings.components == {"parser": "thought_action"}
    assert settings.seed is None and settings.max_steps is None
    assert sorted((held.kind, held.name) for held in settings.held) == [
        ("backend", "backend"), ("component", "isolator"), ("max_steps", "max_steps"), ("option", "sandbox"),
        ("seed", "seed")]
    assert any("'sandbox' is not a setting this version takes" in warning for warning in settings.warnings)
    assert any("kind 'jailer'" in warning for warning in settings.warnings)


# -- starter files rebuilt from recorded windows -------------------------------------------------------------------
def window(name: str, text: str) -> str:
    """What ``open "name"`` shows of a whole file in MLGym's window."""
    lines = text.rstrip("\n").split("\n")
    return f"[File: /home/agent/workspace/{name} ({len(lines)} lines total)]\n" + "\n".join(
        f"{number}:{line}" for number, line in enumerate(lines, 1))


FORGED_EVALUATOR = 'import json\nprint(json.dumps({"Score": 99.0}))\n'
FORGED_PARTNER = "def target_column_strategy(history):\n    return 0  # always cooperates\n"
ALWAYS_DEFECT = "def row_strategy(history):\n    return 1\n"


@pytest.fixture
def mini_task(mini_spec):
    """``miniPrisonersDilemma`` registered as a task, so that ``replay --task`` plays on it (fewer games per score)."""
    registry.register("task", mini_spec.id, mini_spec.replace(components={}))
    try:
        yield mini_spec.id
    finally:
        registry.unregister("task", mini_spec.id)


def test_a_forged_evaluator_or_partner_in_a_window_is_never_a_starter_file(tmp_path, capsys, mini_task):
    # an MLGym-style run (no record): its windows are taken as the starter files the run saw
    traj = recorded_traj(tmp_path / "downloaded" / f"{TASK}.traj", [
        ('open "evaluate.py"', window("evaluate.py", FORGED_EVALUATOR)),
        ('open "target.py"', window("target.py", FORGED_PARTNER)),
        ('open "strategy.py"', window("strategy.py", ALWAYS_DEFECT)),
        ("submit", ""),
    ], record=None, environment="mlgym_main")
    out = tmp_path / "out"
    assert cli_main(["replay", str(traj), "--task", mini_task, "--starter-files", "recorded", "--seed", "0",
                     "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "replay-report.json").read_text())
    [score] = report["our_scores"]
    # the task's own evaluator and partner scored the recorded strategy (always defect): at most 5 a round, and
    # below 5 since the real partners do not all cooperate (against the forged partner it would be exactly 5)
    assert 0.0 <= score["Score"] < MAX_SCORE, score
    assert "started from the recorded versions of strategy.py" in report["warnings"]
    assert any(w.startswith("kept the task's own evaluate.py, target.py") for w in report["warnings"])
    assert sorted(path.name for path in (out / "recorded-starters").iterdir()) == ["strategy.py"]
    assert (out / "recorded-starters" / "strategy.py").read_text() == ALWAYS_DEFECT
