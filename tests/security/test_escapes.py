"""Escapes: the agent's shell attacking the host, the driver, the network, other envs. Checked from the host."""

from __future__ import annotations

import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from mlgym_registry.backends.local import LocalBackend

from .helpers import SECRET_VARIABLES, open_backend, run, status, upload

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def backend(mini_spec):
    env = open_backend(mini_spec)
    yield env
    env.close()


@pytest.fixture
def env(backend):
    backend.reset()
    return backend


@pytest.fixture
def host_process():
    """A process of the host's, outside every sandbox, that no agent may touch."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def assert_usable(env: LocalBackend) -> None:
    assert run(env, "echo ok") == "ok"
    assert run(env, "cat strategy.py").startswith('"""')


def assert_running(pid: int) -> None:
    process = psutil.Process(pid)
    assert process.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD), process


def wrapper_pids(env: LocalBackend) -> set[int]:
    """The host pids of the sandbox around the agent's shell (bwrap's processes)."""
    session = env._res.session
    return set(session._wrappers) | {session.pid}


def test_kill_everything_visible(env, host_process):
    run(env, "kill -9 -1; sleep 1")
    assert_running(os.getpid())
    assert_running(host_process.pid)
    assert_usable(env)


def test_stopping_the_parent_and_the_sandbox_init(env, host_process):
    run(env, "kill -STOP $PPID; kill -STOP 1; kill -STOP -1")
    assert_usable(env)
    for pid in wrapper_pids(env) | {os.getpid(), host_process.pid}:
        assert_running(pid)


def test_signalling_host_pids(env, host_process):
    targets = " ".join(str(pid) for pid in (os.getpid(), os.getppid(), host_process.pid, 1))
    output = run(env, f"for sig in STOP KILL; do for pid in {targets}; do kill -$sig $pid; done; done 2>&1; true")
    for pid in (os.getpid(), os.getppid(), host_process.pid):
        assert_running(pid)
    assert_usable(env)
    assert output is not None


def test_the_driver_environment_is_not_visible(env):
    output = run(
        env,
        "env; cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; ps eww -A 2>/dev/null; "
        "python -c 'import os; print(dict(os.environ))'",
    )
    assert output
    for name, value in SECRET_VARIABLES.items():
        assert os.environ[name] == value
        assert value not in output, f"{name} leaked into the sandbox"


def test_system_folders_are_read_only(env):
    python_root = Path(sys.base_prefix)
    for folder in ("/etc", "/usr", "/usr/local", "/bin", "/lib", str(python_root), str(Path(sys.prefix)),
                   "/opt/mlgym-registry/tools"):
        name = f"mlgr-probe-{secrets.token_hex(4)}"
        output, code = status(env, f"touch '{folder}/{name}'")
        assert code != 0 and ("Read-only file system" in output or "No such file" in output), (folder, output)
        assert not Path(folder, name).exists()


def test_writes_outside_the_workspace_never_reach_the_host(env):
    name = f"mlgr-probe-{secrets.token_hex(4)}"
    host_folders = ["/", "/root", "/etc", "/usr", tempfile.gettempdir(), str(env._res.root),
                    str(env.host_workspace.parent), str(Path.home()), "/var/tmp", "/home"]
    for folder in host_folders:
        run(env, f"mkdir -p '{folder}'; echo planted > '{folder}/{name}'; ln -s /etc/passwd '{folder}/{name}.lnk'")
    for folder in host_folders:
        assert not os.path.lexists(Path(folder) / name), folder
        assert not os.path.lexists(Path(folder) / f"{name}.lnk"), folder


def test_the_sandbox_root_is_read_only(env):
    for folder in ("/", "/root"):
        output, code = status(env, f"touch '{folder}/mlgr-probe'")
        assert code != 0, (folder, output)


def test_no_network_to_the_host_loopback_or_outside(env):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"mlgr-test-{secrets.token_hex(4)}"
    abstract.bind("\0" + name)
    abstract.listen(8)
    abstract.settimeout(0.5)
    try:
        connects = [
            f"socket.create_connection(('127.0.0.1', {port}), timeout=3)",
            f"socket.create_connection(('localhost', {port}), timeout=3)",
            "socket.create_connection(('1.1.1.1', 53), timeout=3)",
            f"s = socket.socket(socket.AF_UNIX); s.connect('\\0{name}')",
        ]
        for connect in connects:
            for prefix in ("", "nsenter --net=/proc/1/ns/net ", "nsenter --net=/proc/$PPID/ns/net ",
                           "nsenter -t 1 -n "):
                output, code = status(env, f"{prefix}python -c \"import socket; {connect}; print('CONNECTED')\"")
                assert code != 0 and "CONNECTED" not in output, (prefix, connect, output)
        for server in (listener, abstract):
            with pytest.raises(TimeoutError):
                server.accept()
    finally:
        listener.close()
        abstract.close()


def cgroups_named(name: str) -> list[str]:
    """The host's cgroup folders called ``name``. ``os.walk`` passes over a folder that vanishes while it walks:
    other tests' envs, running beside this one, remove their cgroups when they close."""
    return [os.path.join(root, name) for root, folders, _ in os.walk("/sys/fs/cgroup") if name in folders]


def test_cgroups_cannot_be_changed(env):
    cgroup = env._res.cgroup
    limit = (cgroup.path / "pids.max").read_text() if cgroup is not None else None
    name = f"mlgr-probe-{secrets.token_hex(4)}"
    output, _ = status(
        env,
        f"ls /sys/fs/cgroup 2>&1; mkdir /sys/fs/cgroup/{name} 2>&1; echo $$ > /sys/fs/cgroup/cgroup.procs 2>&1; "
        f"echo max > /sys/fs/cgroup/pids.max 2>&1; mkdir -p /tmp/cg && mount -t cgroup2 none /tmp/cg 2>&1; "
        f"unshare -rm sh -c 'mount -t cgroup2 none /tmp/cg && mkdir /tmp/cg/{name}' 2>&1; "
        f"unshare -rm sh -c 'mount -t cgroup -o pids none /tmp/cg && echo max > /tmp/cg/pids.max' 2>&1; true",
    )
    assert not cgroups_named(name)
    if cgroup is not None:
        assert (cgroup.path / "pids.max").read_text() == limit
        assert env._res.session.shell_pid in cgroup.members()


def test_global_kernel_settings_cannot_be_written(env):
    """Writes back the value each setting already has, so that the host is never changed even when the write works."""
    written = []
    for setting in ("kernel/core_pattern", "vm/swappiness", "kernel/panic"):
        path = Path("/proc/sys") / setting
        if not path.exists():
            continue
        value = path.read_text()
        output, code = status(env, f"v=$(cat /proc/sys/{setting}) && echo \"$v\" > /proc/sys/{setting} && echo WROTE")
        assert path.read_text() == value
        if "WROTE" in output:
            written.append(setting)
    output, _ = status(env, "test -w /proc/sysrq-trigger && echo SYSRQ-WRITABLE")
    assert "SYSRQ-WRITABLE" not in output
    assert written == [], f"the agent could write {written}"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the agent script injects x86-64 machine code")
def test_the_sandbox_init_cannot_be_taken_over(mini_spec):
    """The namespace's first process is the agent's own shell (bwrap runs ``--as-pid-1``), and the sandbox's
    ``/proc`` is read-only, so its memory cannot be written through ``/proc/1/mem``; were it taken over anyway, that
    would only break the agent's own session, which the next timeout replaces, sandbox and all."""
    with open_backend(mini_spec, command_timeout=2, long_timeout=2) as env:
        wrappers = wrapper_pids(env)
        hijack = upload(env, "hijack_init.py")
        obs = run(env, f"python {hijack} /bin/sleep 987001")
        hijacked = [p.pid for p in psutil.process_iter(["cmdline"]) if "987001" in (p.info["cmdline"] or [])]
        if "EXECUTION TIMED OUT" in obs:
            assert "a new shell was started" in obs, obs
            assert hijacked == [], "the agent's program outlived the session it took over"
            assert not any(psutil.pid_exists(pid) for pid in wrappers), "the old sandbox is still there"
        else:
            assert "Read-only file system: '/proc/1/mem'" in obs, obs
            assert hijacked == [], "the agent's program took the sandbox's first process over"
        assert run(env, "echo usable") == "usable"


def test_another_env_is_invisible_and_untouchable(env, mini_spec):
    unique = f"mlgr-other-{secrets.token_hex(6)}.txt"
    with open_backend(mini_spec) as other:
        run(other, f"echo mine > {unique}")
        target = other.host_workspace / unique
        assert target.read_text() == "mine\n"
        names = sorted(p.name for p in other.host_workspace.iterdir())
        view = env._confinement.sandbox_spec(env.host_workspace, writable=True)
        binds = [b.target for b in view.binds if not b.writable]
        prune = " ".join(f"-path '{path}' -prune -o" for path in binds)
        output, _ = status(env, f"find / -path /proc -prune -o {prune} -name '{unique}' -print 2>/dev/null", 120)
        assert output.strip() == "", output
        run(env, f"echo stolen > '{target}'; rm -f '{target}'; ls /tmp /tmp/mlgym-registry-* 2>&1")
        assert target.read_text() == "mine\n"
        assert sorted(p.name for p in other.host_workspace.iterdir()) == names
        assert run(other, f"cat {unique}") == "mine"


def test_owner_file_is_out_of_reach_and_cannot_be_forged(env, mini_spec):
    from mlgym_registry.backends.local.resources import OWNER_FILE

    owner = env._res.root / OWNER_FILE
    content = owner.read_text()
    view = env._confinement.sandbox_spec(env.host_workspace, writable=True)
    binds = [b.target for b in view.binds if not b.writable]
    prune = " ".join(f"-path '{path}' -prune -o" for path in binds)
    output, _ = status(env, f"find / -path /proc -prune -o {prune} -name '{OWNER_FILE}' -print 2>/dev/null", 120)
    assert output.strip() == "", output
    fake = Path(tempfile.gettempdir()) / "mlgym-registry-forged"
    run(env, f"echo 1 > '{owner}'; mkdir -p '{fake}' && echo 1 > '{fake}/{OWNER_FILE}'")
    assert owner.read_text() == content and not fake.exists()
    with open_backend(mini_spec):  # a new backend sweeps orphans: this live env's folder must survive
        pass
    assert env._res.root.is_dir() and owner.read_text() == content
    assert_usable(env)


def test_setuid_files_are_out_of_other_users_reach(env):
    run(env, "cp /bin/sh suid-sh && chmod 4755 suid-sh")
    made = env.host_workspace / "suid-sh"
    mode = made.stat().st_mode if made.exists() else 0
    if mode & 0o4000:
        # the agent's uid may be the host's root: a set-user-id copy is harmless only where no other user can reach it
        assert env._res.root.stat().st_mode & 0o077 == 0, oct(env._res.root.stat().st_mode)
    output, _ = status(env, "./suid-sh -p -c 'id -u'")
    assert output.strip() == "1000", output


@pytest.mark.parametrize("hijack_init", [False, True], ids=["daemons", "daemons-and-hijacked-init"])
def test_close_leaves_no_process_behind(mini_spec, hijack_init):
    if hijack_init and platform.machine() != "x86_64":
        pytest.skip("the agent script injects x86-64 machine code")
    tag = f"98{secrets.randbelow(10**6):06d}"
    env = open_backend(mini_spec)
    try:
        run(env, f"setsid nohup sleep {tag}1 >/dev/null 2>&1 & ( ( sleep {tag}2 & ) & ) ; "
                 f"nohup python -c 'import os, time; os.setsid(); time.sleep({tag}3)' >/dev/null 2>&1 &")
        if hijack_init:  # the taken-over shell times out: the session is replaced, and nothing of it may remain
            env.long_timeout = env.command_timeout = 2
            hijack = upload(env, "hijack_init.py")
            run(env, f"python {hijack} /bin/sleep {tag}4")
            run(env, f"sleep {tag}5 &")
        time.sleep(0.5)
        shell = env._res.session.shell_pid
        seen = wrapper_pids(env) | {shell} | {p.pid for p in psutil.Process(shell).children(recursive=True)}
        if env._res.cgroup is not None:
            seen |= env._res.cgroup.members()
        tagged = {p.pid for p in psutil.process_iter(["cmdline"]) if any(tag in a for a in p.info["cmdline"] or [])}
        assert len(tagged) >= (1 if hijack_init else 3), tagged
        seen |= tagged
    finally:
        env.close()
    deadline = time.monotonic() + 60  # a ceiling: killed processes take a moment to go on a loaded machine
    alive = seen
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"}
        time.sleep(0.05)
    assert alive == set(), [psutil.Process(pid).cmdline() for pid in alive if psutil.pid_exists(pid)]
    assert not any(tag in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
