"""The local backend under faults: hangs, dying shells, floods of output, tampering, fork bombs, leaks."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from test_local_backend import tiny_spec

from mlgym_registry.backends.local import LocalBackend, kernel_counts
from mlgym_registry.backends.local.limits import network_isolation_prefix
from mlgym_registry.records.observation_kinds import observation_kind


def session_tree(env: LocalBackend) -> list[psutil.Process]:
    """The backend's shell and everything below it."""
    shell = psutil.Process(env._res.session.shell_pid)
    return [shell, *shell.children(recursive=True)]


def make(tmp_path, **options) -> LocalBackend:
    env = LocalBackend(tiny_spec(tmp_path), **options)
    env.reset()
    env.install_tools()
    return env


def assert_usable(env: LocalBackend) -> None:
    assert env.step("echo ok")[0] == "ok"
    assert env.step('open "strategy.py"')[0].startswith(f"[File: {env.task_workspace}/strategy.py")
    assert json.loads(env.communicate("state"))["working_dir"] == str(env.task_workspace)


def test_hanging_command_is_killed_with_its_children(tmp_path):
    with make(tmp_path, command_timeout=1) as env:
        start = time.monotonic()
        obs, _, done, _ = env.step("sleep 1000 | cat & sleep 1000")
        assert time.monotonic() - start < 300  # a ceiling on a loaded machine: not killed, it would take 1000 s
        assert obs.endswith("\nEXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 1 SECONDS.")
        assert observation_kind(obs) == "timeout" and not done
        assert [p.name() for p in session_tree(env)] == ["bash"]
        env.step("true")  # bash may report the killed background job with the next command
        assert_usable(env)


def test_busy_shell_builtin_loop_restarts_the_session(tmp_path):
    with make(tmp_path, command_timeout=1) as env:
        env.communicate("cd data")
        obs, _, done, _ = env.step("while true; do :; done")
        assert "EXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 1 SECONDS." in obs
        assert "a new shell was started" in obs and not done
        assert_usable(env)


def test_no_output_timeout(tmp_path):
    with make(tmp_path) as env:
        with pytest.raises(TimeoutError) as caught:
            env.communicate("echo started; sleep 30", timeout_duration=20, no_output_timeout_duration=1)
        assert caught.value.kind == "no_output" and caught.value.partial.startswith("started")
        assert env.communicate("echo after") == "after"


def test_the_shell_cannot_be_killed_from_inside(tmp_path):
    """The shell is its sandbox's first process: a signal sent from inside the sandbox cannot end it."""
    with make(tmp_path) as env:
        old_pid = env._res.session.pid
        obs, _, done, _ = env.step("echo before; kill -9 $$; echo after")
        assert obs == "before\nafter" and not done
        assert env._res.session.pid == old_pid
        assert_usable(env)


@pytest.mark.parametrize("killer", ["exit 3", "exec true"])
def test_command_that_kills_the_shell(tmp_path, killer):
    with make(tmp_path) as env:
        old_pid = env._res.session.pid
        obs, _, done, _ = env.step(f"echo before; {killer}")
        assert obs.startswith("before\nNOTE: the shell session exited (")
        assert observation_kind(obs) == "session_restart" and not done
        assert env._res.session.pid != old_pid and not psutil.pid_exists(old_pid)
        assert_usable(env)


def test_huge_output_is_capped(tmp_path):
    with make(tmp_path, max_output_chars=10_000) as env:
        start = time.monotonic()
        obs, *_ = env.step("seq 1 3000000")
        assert time.monotonic() - start < 120  # a ceiling for a loaded machine: uncapped, it would not end at all
        assert len(obs) < 10_300
        assert obs.startswith("1\n2\n3\n") and obs.endswith("2999999\n3000000")
        assert "of output omitted" in obs
        assert_usable(env)


def test_long_command_printing_early_does_not_deadlock(tmp_path):
    with make(tmp_path) as env:
        command = "seq 1 200000\n" + "\n".join(f"echo line{i}" for i in range(20000))  # > 64 KiB each way
        obs = env.communicate(command, timeout_duration=60)
        assert obs.endswith("line19998\nline19999") and env.returncode == 0
        assert_usable(env)


def test_binary_output_is_decoded(tmp_path):
    with make(tmp_path) as env:
        obs, *_ = env.step("head -c 20000 /dev/urandom; printf '\\x00\\xff\\xfe end'")
        assert isinstance(obs, str) and obs.endswith("\\xff\\xfe end")
        assert_usable(env)


def test_tampering_with_evaluator_and_protected_file_does_not_count(tmp_path):
    with make(tmp_path) as env:
        ws = env.host_workspace
        assert oct((ws / "evaluate.py").stat().st_mode & 0o777) == "0o555"
        assert oct((ws / "target.py").stat().st_mode & 0o777) == "0o444"
        # as root the writes succeed; the evaluation must still use the pristine files
        env.step("chmod u+w evaluate.py target.py")
        env.step("""echo 'print("{\\"Score\\": 100.0}")' > evaluate.py""")
        env.step("printf 'def target_column_strategy(history):\\n    return 1\\n' > target.py")
        env.step("mkdir -p __pycache__ && echo junk > __pycache__/target.cpython-311.pyc")
        obs, _, _, info = env.step("validate")
        assert info["score"] == [{"Score": 3.0}], obs
        # the agent's own strategy still counts
        env.step("printf 'def row_strategy(history):\\n    return 1\\n' > strategy.py")
        _, _, _, info = env.step("validate")
        assert info["score"][-1] == {"Score": 5.0}
        assert "100.0" in env.communicate("cat evaluate.py")  # the agent sees its change; it just does not count
        for copy in env._files.pristine.values():
            assert ws not in copy.parents


def test_tampering_with_the_data_does_not_count(tmp_path):
    spec = tiny_spec(tmp_path)
    (tmp_path / "task_src" / "evaluate.py").write_text(
        "import json\nnumbers = open('data/numbers.txt').read().split()\n"
        "print(json.dumps({'Score': float(sum(map(int, numbers)))}))\n"
    )
    with LocalBackend(spec) as env:
        env.reset()
        env.install_tools()
        assert oct((env.host_workspace / "data" / "numbers.txt").stat().st_mode & 0o777) == "0o555"
        env.step("chmod -R u+w data && echo 100 > data/numbers.txt")
        assert env.communicate("cat data/numbers.txt") == "100"
        _, _, _, info = env.step("validate")
        assert info["score"] == [{"Score": 6.0}]


def test_evaluator_traceback_shows_workspace_paths(tmp_path):
    with make(tmp_path) as env:
        env.step("printf 'def row_strategy(history):\\n    return 7\\n' > strategy.py")
        obs, *_ = env.step("validate")
        assert obs.startswith("Failed to decode metrics from evaluation script. Output:\n---\nTraceback")
        assert f'File "{env.task_workspace}/evaluate.py"' in obs
        assert "scratch" not in obs


def test_fork_bomb_is_limited(tmp_path):
    with make(tmp_path, max_processes=64, command_timeout=5) as env:
        if env._res.cgroup is None and os.geteuid() == 0:
            pytest.skip("no pids cgroup available and RLIMIT_NPROC does not bind root")
        start = time.monotonic()
        obs, _, done, _ = env.step(":(){ :|:& };:")
        env.step("sleep 1")
        assert not done and time.monotonic() - start < 120  # a ceiling for a loaded machine, not a timing
        peak = max(len(session_tree(env)) for _ in range(5))
        assert peak <= 64
        deadline = time.monotonic() + 120  # a ceiling for a loaded machine
        while env._res.session.processes() and time.monotonic() < deadline:
            env.step("true")
        assert env._res.session.processes() == set()
        sandbox = {env._res.session.pid, env._res.session.shell_pid} | env._res.session._wrappers
        assert env._res.cgroup is None or env._res.cgroup.members() == sandbox
        assert_usable(env)


def test_memory_and_cpu_limits(tmp_path):
    # command timeouts far above the CPU limit: on a loaded machine 2 s of CPU can take a minute of wall time, and the
    # limit, not the timeout, must end the loop (its exit status says which did)
    with make(tmp_path, memory_limit_mb=400, cpu_seconds=2, command_timeout=300, long_timeout=300) as env:
        obs, *_ = env.step("python -c 'x = bytearray(2_000_000_000)'")
        if env._res.memory is not None:  # one limit for the whole env: the kernel kills the process that exceeds it
            assert "Killed" in obs and "NOTE: the command ran out of memory" in obs and "400 MB" in obs, obs
        else:  # address space per process
            assert "MemoryError" in obs
        start = time.monotonic()
        obs, *_ = env.step("python -c 'while True: pass'; echo status $?")
        assert time.monotonic() - start < 240  # a ceiling, not a timing: without the limit the loop meets the timeout
        assert "TIMED OUT" not in obs, obs
        assert obs.split("\n")[-1] in ("status 152", "status 137")  # SIGXCPU (or SIGKILL at the hard limit)
        assert_usable(env)


def test_network_is_blocked_or_noted(tmp_path):
    with make(tmp_path) as env:
        if network_isolation_prefix() is None:
            assert any("network" in note for note in env.notes)
            return
        ours = env.communicate("readlink /proc/$$/ns/net")
        assert ours != os.readlink("/proc/self/ns/net")
        obs = env.communicate(
            "python -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=3)'"
        )
        assert "Network is unreachable" in obs or "OSError" in obs
    with LocalBackend(tiny_spec(tmp_path / "open"), network=True) as env:
        env.reset()
        assert env.communicate("readlink /proc/$$/ns/net") == os.readlink("/proc/self/ns/net")


def _leftovers(pids, root) -> list:
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    return alive + ([str(root)] if root.exists() else [])


def gone_within(pids, root, ceiling: float = 60.0) -> list:
    """``_leftovers`` once they are gone, or what is left after ``ceiling`` seconds (a ceiling for a loaded machine:
    an owner that ends sends its kills as it goes, and the kernel takes the processes down after)."""
    deadline = time.monotonic() + ceiling
    while _leftovers(pids, root) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _leftovers(pids, root)


def named(pids, name: str) -> list[int]:
    """Those of ``pids`` that run the program ``name``."""
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).name() == name:
                found.append(pid)
        except psutil.Error:
            pass
    return found


def wait_for_sleeps(shell_pid: int, count: int, ceiling: float = 60.0) -> list[int]:
    """The ``sleep`` processes below the shell once ``count`` of them run (a ``&`` returns before its program has
    started)."""
    deadline = time.monotonic() + ceiling
    while True:
        sleeps = named([p.pid for p in psutil.Process(shell_pid).children(recursive=True)], "sleep")
        if len(sleeps) >= count or time.monotonic() > deadline:
            return sleeps
        time.sleep(0.02)


def _start_stragglers(env: LocalBackend) -> list[int]:
    env.communicate("sleep 1000 >/dev/null 2>&1 &")
    env.communicate("setsid sleep 1001 >/dev/null 2>&1 &")  # leaves the shell's session
    cgroup = env._res.cgroup
    if cgroup is None:  # the setsid one is no longer below the shell: only the first is awaited
        wait_for_sleeps(env._res.session.shell_pid, 1)
    else:
        deadline = time.monotonic() + 60
        while len(named(cgroup.members(), "sleep")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    pids = [p.pid for p in session_tree(env)]
    cgroup = env._res.cgroup
    return pids + (sorted(cgroup.members()) if cgroup else [])


def test_close_leaves_nothing_and_is_idempotent(tmp_path):
    env = make(tmp_path)
    root, pids = env._res.root, _start_stragglers(env)
    assert len(pids) >= 3
    env.close()
    env.close()
    assert _leftovers(pids, root) == []


def test_garbage_collection_leaves_nothing(tmp_path):
    env = make(tmp_path)
    root, pids = env._res.root, _start_stragglers(env)
    del env
    gc.collect()
    assert _leftovers(pids, root) == []


def test_cgroups_left_by_killed_processes_are_swept(tmp_path):
    with make(tmp_path) as env:
        if env._res.cgroup is None:
            pytest.skip("no pids cgroup on this machine")
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = env._res.cgroup.path.parent / f"mlgym-registry-{dead.pid}-deadbeef"
        stale.mkdir()
    with make(tmp_path / "second"):
        assert not stale.exists()


def test_forked_child_exiting_does_not_release_the_parents_backend(tmp_path):
    with make(tmp_path) as env:
        child = os.fork()
        if child == 0:  # what a child's normal interpreter exit would do: run the inherited finalizer
            try:
                env.close()
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        assert env.host_workspace.exists()
        assert_usable(env)


def owner_script(src, ending: str) -> str:
    """A program that opens a backend with a background process, prints its pids and root, then runs ``ending``."""
    return textwrap.dedent(
        f"""
        import json, sys
        sys.path[:0] = [{str(os.path.dirname(__file__))!r}, {str(os.path.dirname(os.path.dirname(__file__)))!r}]
        from test_local_backend import tiny_spec
        from pathlib import Path
        from mlgym_registry.backends.local import LocalBackend
        env = LocalBackend(tiny_spec(Path({str(src)!r})))
        env.reset()
        env.communicate("sleep 1000 >/dev/null 2>&1 &")
        from test_local_faults import wait_for_sleeps
        (sleep,) = wait_for_sleeps(env._res.session.shell_pid, 1)
        print(json.dumps({{"root": str(env._res.root), "shell": env._res.session.shell_pid, "sleep": sleep}}),
              flush=True)
        {ending}
        """
    )


@pytest.mark.parametrize("ending", ["pass", "raise KeyboardInterrupt"])
def test_interpreter_exit_leaves_nothing(tmp_path, ending):
    src = tmp_path / "src"
    src.mkdir()
    script = owner_script(src, ending)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout, done.stderr
    facts = json.loads(done.stdout.splitlines()[0])
    assert gone_within([facts["shell"], facts["sleep"]], Path(facts["root"])) == []


def test_sigkilled_owner_leaves_nothing_once_the_next_backend_starts(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    script = owner_script(src, "import time; time.sleep(1000)")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(owner.stdout.readline())
    finally:
        owner.kill()  # SIGKILL: no close(), no finalizer, no atexit
        owner.wait()
    deadline = time.monotonic() + 60  # a ceiling for a loaded machine: the loop ends when the shell is gone
    while psutil.pid_exists(facts["shell"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(facts["shell"])  # the shell dies with its owner (parent-death signal)
    (tmp_path / "next").mkdir()
    with LocalBackend(tiny_spec(tmp_path / "next")) as env:
        env.reset()  # starting a backend sweeps what the dead owner left
        has_cgroup = env._res.cgroup is not None
    assert not os.path.exists(facts["root"])
    if has_cgroup:  # the dead owner's background processes are found through its cgroup
        assert gone_within([facts["sleep"]], Path(facts["root"])) == []


def test_a_sweep_while_another_backend_takes_its_owner_lock_spares_it(tmp_path, monkeypatch):
    """Envs starting together (a thread pool's resets) sweep each other's folders: the owner file may only appear
    already locked. A sweep is forced into the moment between creating the lock file and locking it."""
    import fcntl

    from mlgym_registry.backends.local import resources as resources_module

    real_flock = fcntl.flock
    swept = []

    def flock_after_a_sweep(fd, operation):
        if operation == fcntl.LOCK_EX:  # the owner's own blocking lock, not a sweep's try
            swept.append(True)
            resources_module.sweep_orphans(tmp_path)  # another env starting right now
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_sweep)
    env = LocalBackend(tiny_spec(tmp_path / "spec"), workspace_dir=str(tmp_path))
    try:
        env.reset()
        assert swept and env.step("echo ok")[0] == "ok"
    finally:
        env.close()



def test_a_process_in_its_exit_or_a_zombie_is_nobodys_running_process():
    # a killed process is taken down by the kernel for as long as a loaded machine takes: meanwhile it is still in
    # its cgroup and its parent's tree, and a fork must not be refused for it (CI: "processes running: 29754 (bash)")
    from mlgym_registry.backends.local import procs

    with open("/proc/self/stat", "rb") as handle:
        line = handle.read()
    head, _, rest = line.rpartition(b") ")
    fields = rest.split(b" ")
    assert procs.runs_code(line) and procs.alive(os.getpid())
    # no process can be held in its exit on demand: this one's own line, with the kernel's PF_EXITING flag set
    fields[6] = str(int(fields[6]) | procs.PF_EXITING).encode()
    assert not procs.runs_code(head + b") " + b" ".join(fields))
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 120
    while open(f"/proc/{zombie.pid}/stat", "rb").read().split(b") ")[1][:1] != b"Z":
        assert time.monotonic() < deadline, "`true` never ended"
        time.sleep(0.01)
    assert not procs.alive(zombie.pid)
    zombie.wait()
    assert not procs.alive(zombie.pid)


def test_ending_a_session_that_forks_while_it_is_killed_leaves_nothing():
    """A process killed while it forks may leave a child the look before the kill did not see (bwrap killed in its
    start-up left its half-made sandbox waiting forever, outside every cgroup where the driver makes none): a leader
    that starts a child every moment stands in for that window, which no real bwrap opens on demand."""
    from mlgym_registry.backends.local import procs

    forks = "import os, time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(1000)\n    time.sleep(0.0005)\n"
    leader = subprocess.Popen([sys.executable, "-S", "-c", forks], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(procs.session_processes(leader.pid)) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        procs.end_session(leader.pid, lambda: leader.poll() is None)
        leader.wait(timeout=60)
        left = [pid for pid in procs.session_processes(leader.pid) if procs.alive(pid)]
        assert left == [], left
    finally:
        if leader.poll() is None:
            leader.kill()
        for pid in procs.session_processes(leader.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_processes_that_start_sandboxes_leave_one_filter_file_however_they_end(tmp_path):
    """Every sandbox loads its seccomp filter from a file (``kernel_counts``): owners that exit, leave by
    ``os._exit`` (as every multiprocessing worker does, exit handlers unrun) or are killed share one file, in one
    folder of the user's, and leave no folder of their own in the temporary folder."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    environ = {**os.environ, "TMPDIR": str(temp)}
    for index, ending in enumerate(("pass", "import os; os._exit(0)", "import time; time.sleep(1000)")):
        src = tmp_path / f"src{index}"
        src.mkdir()
        owner = subprocess.Popen([sys.executable, "-c", owner_script(src, ending)], stdout=subprocess.PIPE,
                                 text=True, env=environ)
        try:
            assert json.loads(owner.stdout.readline())["root"]
            if index < 2:
                assert owner.wait(timeout=60) == 0
        finally:
            owner.kill()  # the last one: SIGKILL, no close(), no finalizer, no atexit
            owner.wait()
    filters = [path.relative_to(temp) for path in temp.rglob("*.bpf")]
    assert filters == [Path(f"mlgr-seccomp-{os.getuid()}") / filters[0].name], sorted(temp.iterdir())
    assert [path.name for path in temp.iterdir() if path.name.startswith("mlgr-seccomp")] == [filters[0].parts[0]]
    assert (temp / filters[0].parts[0]).stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("taken", ["others may enter it", "a link to a private folder"])
def test_a_filter_folder_that_is_not_the_users_alone_is_never_used(tmp_path, monkeypatch, taken):
    """Whoever could write in the shared filter folder could swap the filter every sandbox loads: one that others
    may enter, or a link, is left alone, and the process writes the filter in a new folder of its own."""
    shared = tmp_path / f"mlgr-seccomp-{os.getuid()}"
    if taken == "others may enter it":
        shared.mkdir()
        shared.chmod(0o755)
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        shared.symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kernel_counts._folder.cache_clear()
    try:
        path = Path(kernel_counts.filter_path())
        assert path.parent.parent == tmp_path and path.parent.name.startswith("mlgr-seccomp-")
        assert path.parent != shared and path.read_bytes() == kernel_counts.program()
        assert list(shared.iterdir()) == []
    finally:
        kernel_counts._folder.cache_clear()
