"""The driver survives anything the agent does: ``step``, ``reset`` and ``close`` never raise or hang because of what
the agent printed, created or left running, and an evaluation never fills the host's disk.

Every attack runs as the agent would run it (commands through ``env.step``); what counts is measured from the host:
how long a step took, whether it raised, how much disk the backend's folder used, what is left after ``close``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.backends.local import LocalBackend, eval_clock
from mlgym_registry.backends.local.resources import OWNER_FILE, ROOT_PREFIX, MemoryOvercommitWarning

from .helpers import HONEST, run, status, validate, write_file

pytestmark = pytest.mark.security

DEEP = 3000
"""Folders nested this deep broke every recursive walk (Python's recursion limit is 1000)."""

MAKE_DEEP = f"python -c \"import os\nfor _ in range({DEEP}): os.mkdir('d'); os.chdir('d')\""



def timed_step(env: LocalBackend, action: str) -> tuple[str, dict, float]:
    start = time.monotonic()
    obs, _reward, _done, info = env.step(action)
    return obs or "", info, time.monotonic() - start


def allocated_mb(folder: Path) -> float:
    """Disk really used under ``folder`` (allocated blocks, so sparse files count what they hold), without recursion."""
    total = 0
    stack = [str(folder)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total / (1 << 20)


class PeakDisk:
    """Samples the disk used under a folder in a thread while the block runs; ``peak`` in MB."""

    def __init__(self, folder: Path):
        self.folder, self.peak = folder, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, allocated_mb(self.folder))
            self._stop.wait(0.05)

    def __enter__(self) -> PeakDisk:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, allocated_mb(self.folder))


# -- parsing what the agent prints ------------------------------------------------------------------------------------
def test_a_state_function_printing_deeply_nested_json_is_an_unreadable_state(mini_spec):
    env = registry.make(mini_spec, batch_size=(), command_timeout=10)
    try:
        td = env.reset()
        deep = "'[' * 100000 + ']' * 100000"
        command = (f"state() {{ python -c \"print('{{\\\"open_file\\\": ' + {deep} + ', \\\"working_dir\\\": "
                   f"\\\"/\\\"}}')\"; }}")
        td.set(("text", "response"), f"DISCUSSION\nNext.\n```\n{command}\n```")
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="no state JSON line"):
            out = env.step(td)
        assert time.monotonic() - start < 300  # a ceiling for a loaded machine, not a timing
        state = json.loads(str(out["next", "state"]))
        assert set(state) >= {"open_file", "working_dir"}
    finally:
        env.close()


def test_echoed_scores_and_markers_cost_linear_time(mini_spec):
    """After a real validate (so the reward compares printed and real scores), pathological score lines and
    thousands of unclosed markers return at once."""
    env = registry.make(mini_spec, batch_size=(), command_timeout=10)
    try:
        td = env.reset()

        def act(command: str) -> tuple[object, float]:
            nonlocal td
            td.set(("text", "response"), f"DISCUSSION\nNext.\n```\n{command}\n```")
            start = time.monotonic()
            out = env.step(td)
            took = time.monotonic() - start
            td = env.step_mdp(out)
            return out["next"], took

        after, _ = act("validate")
        assert "Evaluation Score:" in str(after["observation"])
        act("echo ok")
        attacks = [
            "python -c \"print('Evaluation Score: np.a(' + ' ' * 30000)\"",
            "python -c \"print('Evaluation Score: np.a(' + ' ' * 30000 + 'x')\"",
            "python -c \"print('Baseline Score: ' + ' ' * 30000 + 'x'); print('Evaluation Score: {1: 2}')\"",
            "python -c \"print('<<VALIDATION||' * 7000)\"",
            "python -c \"print('<<SUBMISSION||' * 7000)\"",
        ]
        for command in attacks:
            after, took = act(command)
            assert took < 30, (command, took)  # a ceiling for a loaded machine: quadratic time is minutes here
            assert float(after["reward"].sum()) == 0.0
            assert not after["done"].item()
    finally:
        env.close()


# -- folders the agent nests deep -------------------------------------------------------------------------------------
def test_deep_folders_do_not_break_validate_reset_or_close(make):
    env = make()
    root = env._res.root
    assert status(env, MAKE_DEEP)[1] == 0
    obs, info, took = timed_step(env, "validate")
    assert took < 30 and "Evaluation Score" not in obs, obs
    assert "nested more than" in obs, obs
    # the partial copy was deleted: what is left is the next evaluation, started ahead with empty views
    assert [sorted(p.name for p in folder.iterdir() if any(p.iterdir())) for folder in (root / "scratch").iterdir()] \
        in ([], [[]])
    env.reset()  # deletes the workspace, deep folders and all
    assert run(env, "ls") == "evaluate.py\nstrategy.py\ntarget.py"
    assert status(env, MAKE_DEEP)[1] == 0
    env.close()
    assert not root.exists()


def test_an_abandoned_deep_folder_of_a_dead_owner_does_not_stop_a_new_env(mini_spec, tmp_path):
    abandoned = tmp_path / f"{ROOT_PREFIX}abandoned"
    abandoned.mkdir()
    (abandoned / OWNER_FILE).write_text("999999999")  # nobody holds its lock: its owner is dead
    folder = abandoned / "workspace"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY)
    for _ in range(DEEP):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    (folder / "read-only").mkdir()
    (folder / "read-only" / "file").write_text("x")
    os.chmod(folder / "read-only", 0o555)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the sweep deletes it: nothing to warn about
        warnings.simplefilter("ignore", MemoryOvercommitWarning)  # the machine's state: other tests' envs beside it
        env = LocalBackend(mini_spec, workspace_dir=str(tmp_path))
    try:
        env.reset()
        assert not abandoned.exists()
    finally:
        env.close()
    assert not any(tmp_path.iterdir())


# -- the workspace's copy for an evaluation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "links",
    [
        "for i in 1 2 3 4 5; do ln -s . loop$i; done",
        "mkdir -p d && ln -s .. d/x",
        "mkdir -p a b && ln -s ../b a/to_b && ln -s ../a b/to_a",
    ],
    ids=["five-links-to-dot", "link-to-parent", "two-folders-linking-each-other"],
)
def test_links_never_multiply_the_copy(make, links):
    env = make()
    write_file(env, "strategy.py", HONEST)
    assert status(env, "head -c 4000000 /dev/urandom > blob.bin && " + links)[1] == 0
    with PeakDisk(env._res.root / "scratch") as disk:
        obs, score = validate(env)
    assert score is not None, obs
    assert disk.peak < 40, f"the evaluation's copy used {disk.peak:.0f} MB for a 4 MB workspace"


def test_links_to_files_inside_the_workspace_still_work(make):
    env = make()
    write_file(env, "real_strategy.py", HONEST)
    links = "rm strategy.py && ln -s real_strategy.py strategy.py && mkdir -p sub && ln -s ../sub to_sub"
    assert status(env, links)[1] == 0
    obs, score = validate(env)
    assert score is not None, obs


def test_sparse_files_cost_no_disk_in_the_copy(make):
    env = make()
    write_file(env, "strategy.py", HONEST)
    assert status(env, "truncate -s 1G sparse1 sparse2")[1] == 0
    with PeakDisk(env._res.root / "scratch") as disk:
        obs, score = validate(env)
    assert score is not None, obs
    assert disk.peak < 40, f"two empty sparse files became {disk.peak:.0f} MB of disk"


def test_a_workspace_over_the_copy_bound_fails_with_a_clear_message(make):
    env = make(max_snapshot_mb=4)
    assert status(env, "head -c 6000000 /dev/urandom > big.bin")[1] == 0
    with PeakDisk(env._res.root / "scratch") as disk:
        obs, info, took = timed_step(env, "validate")
    assert "too large to evaluate" in obs and "4 MB" in obs, obs
    assert len(info["score"]) == 0
    assert disk.peak < 10
    obs, info, _ = timed_step(env, "submit")
    assert info["exit_status"].endswith("(submit)") and not info["score"], info


# -- memory folders ---------------------------------------------------------------------------------------------------
def test_dev_shm_and_dev_are_capped_without_a_memory_cgroup(make):
    env = make(memory_limit_mb=256, command_timeout=20)
    output, _ = status(env, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=600 2>&1 | tail -1; du -sm /dev/shm")
    copied = re.match(r"(\d+) bytes", output)  # dd's summary; its timing may hold any digits ("0.0176008 s")
    assert copied is not None and int(copied.group(1)) <= 64 << 20, output
    used = int(output.strip().split("\n")[-1].split()[0])
    assert used <= 64, output
    output, code = status(env, "touch /dev/fill")
    assert code != 0 and "Read-only" in output, output
    assert run(env, "echo ok > /dev/null && head -c 4 /dev/urandom | wc -c") == "4"


# -- the step's deadline ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "times_out"),
    [
        ("kill -STOP $$", False),  # the shell is the sandbox's first process: the signal does not reach it
        ("sh -c 'kill -STOP $PPID'; sleep 1000", True),
        ("exec >/dev/null 2>&1", True),
        ("yes", True),
        ("(trap '' TERM HUP; sleep 1000) & disown; sleep 1000", True),
    ],
    ids=["stop-the-shell", "stopped-by-a-child", "shell-output-redirected", "endless-output", "pipes-held-open"],
)
def test_a_step_returns_soon_after_its_timeout_whatever_the_command_does(make, command, times_out):
    env = make(command_timeout=3, max_output_chars=10_000)
    obs, _info, took = timed_step(env, command)
    assert took < 3 + 60, took  # a ceiling for a loaded machine: each command would run for 1000 s or for ever
    assert ("EXECUTION TIMED OUT" in obs) == times_out, obs
    assert run(env, "echo ok").endswith("ok")


def test_an_evaluation_that_never_ends_returns_within_its_timeout(make, mini_spec):
    env = make(mini_spec.replace(training_timeout=4))
    write_file(env, "strategy.py", "import time\ntime.sleep(1000)\n" + HONEST)
    obs, info, took = timed_step(env, "validate")
    # its clock ended it, before the wall-time backstop and far before the sleep (how long the clock runs on a loaded
    # machine depends on the load: a starved evaluation is given its time)
    assert took < eval_clock.backstop(4), took
    assert "Evaluation Score" not in obs and not info["score"], obs
    assert run(env, "echo ok") == "ok"


def test_a_workspace_removed_from_under_the_shell_does_not_break_a_restart(make):
    env = make(command_timeout=3)
    obs, _info, took = timed_step(env, "cd /tmp && chmod 000 /home/agent/workspace; exit")
    assert took < 60  # ceilings for a loaded machine, not timings
    obs, _info, took = timed_step(env, "echo ok")
    assert took < 90
    assert run(env, "chmod 755 /home/agent/workspace; echo ok").endswith("ok")


# -- report and replay on hostile JSON --------------------------------------------------------------------------------
def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlgym_registry.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, check=False)


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, "[" * 500 + "]" * 500, "1" * 10_000],
                         ids=["deeper-than-the-interpreter", "deeper-than-the-bound", "huge-integer"])
def test_report_and_replay_name_the_file_and_the_problem_in_one_line(tmp_path, content):
    run_folder = tmp_path / "runs" / "model__prisonersDilemma__x"
    run_folder.mkdir(parents=True)
    (run_folder / "results.json").write_text(content)
    (run_folder / "prisonersDilemma.traj").write_text(content)
    # replay stops: one error line
    done = cli("replay", str(run_folder / "prisonersDilemma.traj"), "--task", "prisonersDilemma", cwd=tmp_path)
    assert done.returncode != 0, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "prisonersDilemma.traj" in lines[0] and "JSON" in lines[0], lines[0]
    # report warns about each unreadable file in one line (its policy for any unusable file) and reports the rest
    done = cli("report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--no-plot", cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines and all(line.startswith("mlgym-registry: ") for line in lines), done.stderr
    for name in ("results.json", "prisonersDilemma.traj"):
        assert any(name in line for line in lines), (name, done.stderr)
