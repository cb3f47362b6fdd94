"""Starter files rebuilt from a recorded run's first file windows, and recorded observation kinds."""

from __future__ import annotations

from mlgym_registry import TaskSpec
from mlgym_registry.records.observation_kinds import recorded_kind
from mlgym_registry.records.recorded_files import first_windows, with_recorded_starters

WINDOW = (
    "[File: /home/agent/workspace/strategy.py (3 lines total)]\n1:import random\n2:\n3:def row_strategy(h): return 0"
)


def test_first_whole_window_of_each_file_before_it_is_touched():
    steps = [
        ("ls -a", "./\n../\nstrategy.py\ntarget.py"),
        ('open "strategy.py"', WINDOW),
        ("edit 3:3\ndef row_strategy(h): return 1\nend_of_edit", WINDOW.replace("return 0", "return 1")),
        ('open "strategy.py"', WINDOW.replace("return 0", "return 1")),  # later windows are not the original
        ("cat target.py", "def target(h): return 0"),
        ('open "target.py"', "[File: /home/agent/workspace/target.py (1 lines total)]\n1:def target(h): return 1"),
    ]
    assert first_windows(steps) == {"strategy.py": "import random\n\ndef row_strategy(h): return 0\n"}


def test_a_partial_window_is_not_a_file():
    partial = "[File: /home/agent/workspace/big.py (2000 lines total)]\n1:x = 1\n(1999 more lines below)"
    assert first_windows([('open "big.py"', partial)]) == {}


def test_spec_with_recorded_starters(tmp_path):
    (tmp_path / "task").mkdir()
    for name in ("strategy.py", "evaluate.py"):
        (tmp_path / "task" / name).write_text(f"# ours: {name}\n")
    spec = TaskSpec(id="t", root=str(tmp_path / "task"), starter_code=["strategy.py", "evaluate.py"])
    new, replaced = with_recorded_starters(spec, {"strategy.py": "recorded\n"}, tmp_path / "recorded")
    assert replaced == ["strategy.py"]
    assert (tmp_path / "recorded" / "strategy.py").read_text() == "recorded\n"
    assert new.starter_code == [str(tmp_path / "recorded" / "strategy.py"), str(tmp_path / "task" / "evaluate.py")]
    assert spec.starter_code == ["strategy.py", "evaluate.py"]  # the original spec is unchanged


def test_recorded_kind_reads_older_mlgym_empty_endings():
    assert recorded_kind("", "submit") == "submitted"
    assert recorded_kind("", "echo", final=True, exit_status="autosubmission (max_steps)") == "exit"
    assert recorded_kind("", "echo") == "empty"
    assert recorded_kind("Exited (submit)", "submit") == "submitted"
