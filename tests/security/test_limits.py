"""Crashes and hangs: resource attacks run inside the sandbox they test; the env must stay usable and the host fine."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.local import limits as limits_mod

from .helpers import run, status

pytestmark = pytest.mark.security



def assert_usable(env: LocalBackend) -> None:
    assert run(env, "echo ok") == "ok"
    assert run(env, "python -c 'print(6 * 7)'") == "42"
    assert run(env, "open strategy.py").startswith(f"[File: {env.task_workspace}/strategy.py")


def assert_host_fine() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0
    assert psutil.Process().status() != psutil.STATUS_STOPPED


def timed(env: LocalBackend, command: str) -> tuple[str, float]:
    start = time.monotonic()
    obs = run(env, command)
    return obs, time.monotonic() - start


@pytest.mark.parametrize(
    "command",
    ["head -c 5000000 /dev/zero | tr '\\0' x; echo", "python -c \"print('x' * 5_000_000)\""],
    ids=["shell", "python"],
)
def test_a_five_megabyte_line_returns_within_the_command_timeout(make, command):
    env = make(command_timeout=10, long_timeout=10, max_output_chars=20_000)
    obs = run(env, command)
    assert "EXECUTION TIMED OUT" not in obs  # within the command timeout: the driver's own clock says so, not ours
    assert obs.startswith("xxxx") and len(obs) < 21_000, len(obs)
    assert_usable(env)


def test_a_fork_bomb_stops_at_the_process_limit(make):
    env = make(max_processes=32, command_timeout=10)
    # counted in this process's tree (the sandbox's PID namespace keeps every process of the bomb in it), not on the
    # whole machine, where other tests' processes come and go meanwhile
    before = len(psutil.Process().children(recursive=True))
    bomb = run(env, ":(){ :|:& };:")  # the bomb goes to the background at once
    time.sleep(1)
    assert len(psutil.Process().children(recursive=True)) < before + 64
    if env._res.cgroup is not None:
        assert len(env._res.cgroup.members()) <= 32
    obs = run(env, "echo ok")  # within the command timeout, or a shell the bomb took times out and fails here
    assert "ok" in obs.split("\n"), obs
    # the limit is noticed when the bomb's own command returns or, if it hit the limit later, with the next one
    assert any("limit of 32 processes" in text or "EXECUTION TIMED OUT" in text for text in (bomb, obs)), (bomb, obs)
    assert_usable(env)
    assert_host_fine()


def test_allocating_more_memory_than_the_limit(make):
    env = make(memory_limit_mb=512, command_timeout=30)
    obs = run(env, "python -c 'x = bytearray(6 * 2**30); print(\"ALLOC\" + \"ATED\")'")
    assert "ALLOCATED" not in obs, obs
    if env._res.memory is not None:  # one limit for the whole env: the kernel kills the process that goes over
        assert "ran out of memory" in obs, obs
    else:  # per-process address space (RLIMIT_AS): the allocation fails
        assert "MemoryError" in obs, obs  # within the command timeout: a kill that never came times out instead
    assert_usable(env)
    assert_host_fine()


FILL_TMPFS = (
    "for i in $(seq 150); do head -c 9000000 /dev/zero > {folder}/fill$i 2>/dev/null || break; "
    "echo $((i * 9)) > /home/agent/workspace/written_mb; done"
)
"""Fills a memory-backed folder with files of 9 MB (under max_file_mb) up to 1350 MB, counting on the disk."""


def written_mb(env: LocalBackend) -> int:
    path = env.host_workspace / "written_mb"
    return int(path.read_text()) if path.exists() else 0


@pytest.mark.parametrize("folder", ["/tmp", "/home/agent", "/var/tmp", ""], ids=["tmp", "home", "var-tmp", "root"])
def test_memory_backed_folders_are_bounded_by_the_memory_limit(make, folder):
    env = make(memory_limit_mb=256, max_file_mb=10, command_timeout=60)
    if env._res.memory is None:
        pytest.skip("no memory cgroup on this host: see the RLIMIT_AS variant")
    obs = run(env, FILL_TMPFS.format(folder=folder))
    assert written_mb(env) <= 256 + 20, obs  # the kernel killed the writer (or the shell) at the limit
    run(env, f"rm -f {folder}/fill*")
    assert_usable(env)


def test_memory_backed_folders_are_bounded_without_a_memory_cgroup(make, monkeypatch):
    monkeypatch.setattr(limits_mod.MemoryCgroup, "create", classmethod(lambda cls, limit_mb: None))
    env = make(memory_limit_mb=256, max_file_mb=10, command_timeout=60)
    assert env._res.memory is None
    try:
        obs = run(env, FILL_TMPFS.format(folder=""))  # the sandbox's root: at most 150 x 9 MB
        assert written_mb(env) <= 256 + 20, obs
    finally:
        run(env, "rm -f /fill*")


def test_writing_a_huge_file_stops_at_max_file_mb(make):
    env = make(max_file_mb=10)
    obs = run(env, "head -c 20000000 /dev/zero > big.bin")
    assert "File size limit exceeded" in obs, obs
    obs = run(env, "python -c \"open('big2.bin', 'wb').write(b'x' * 20_000_000)\"")
    assert "File too large" in obs, obs
    run(env, "truncate -s 1G sparse.bin; fallocate -l 1G alloc.bin; dd if=/dev/zero of=/tmp/t.bin bs=1M count=20")
    for path in env.host_workspace.iterdir():
        if path.is_file():
            assert path.stat().st_size <= 10 * 2**20, (path.name, path.stat().st_size)
    output, _ = status(env, "stat -c %s /tmp/t.bin")
    assert int(output) <= 10 * 2**20
    assert_usable(env)


@pytest.mark.parametrize(
    "command",
    ["sleep 12 # python", "echo python; sleep 12", "sleep 12 && echo torchrun", "sleep 12 # python train.py"],
)
def test_the_word_python_does_not_buy_the_long_timeout(make, command):
    env = make(command_timeout=2, long_timeout=60)
    obs, took = timed(env, command)
    # cut at the command timeout (2 s), as the message says, never given the long one (60 s) nor the sleep's 12 s
    assert "EXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 2 SECONDS." in obs, obs
    assert took < 60, took
    assert_usable(env)


def test_running_python_gets_the_long_timeout(make):
    env = make(command_timeout=2, long_timeout=60)
    obs, took = timed(env, "python -c 'import time; time.sleep(3); print(\"done\")'")
    assert obs == "done" and took >= 3


def test_the_memory_limit_leaves_the_driver_alone(make):
    """The limits apply to the sandbox's processes only, never to the driver that made them."""
    env = make(memory_limit_mb=256, max_processes=16, max_file_mb=1)
    run(env, "python -c 'x = bytearray(2**30)'")
    data = os.urandom(2 * 2**20)
    path = env._res.root / "driver-file.bin"
    path.write_bytes(data)  # more than max_file_mb: the driver is not limited
    assert path.read_bytes() == data
    procs = [subprocess.Popen(["sleep", "5"]) for _ in range(20)]  # more than max_processes
    for proc in procs:
        proc.kill()
        proc.wait()
    assert bytearray(300 * 2**20)  # more than memory_limit_mb
