"""The host's shared accounts are never the agent's to spend: the trainer is never the OOM killer's choice, and the
kernel's per-user counts (user namespaces, inotify instances, keys, message queues) cannot be used up from inside a
sandbox, so neither the trainer nor a neighbour env's reset fails because of what an agent holds.

Each attack runs as the agent would run it (commands in its sandboxed shell, or code an evaluation runs); what counts
is read from the host: ``/proc/<pid>/oom_score_adj`` of the sandboxed processes, and whether this process (the
trainer) and a neighbour env can still do what the agent tried to use up.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlgym_registry.backends.local import limits as limits_mod
from mlgym_registry.backends.local import resources

from .helpers import attacking_strategy, status, validate, write_file

pytestmark = pytest.mark.security

psutil = pytest.importorskip("psutil")


def sandboxed_processes(marker: str) -> list[psutil.Process]:
    """This process's descendants whose command line holds ``marker`` and that live in a PID namespace of their own
    (inside a sandbox)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if marker not in " ".join(proc.cmdline()):
                continue
            nspid = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                     if line.startswith("NSpid:")]
            if nspid and len(nspid[0].split()) > 2:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def wait_for(check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    return check()


# -- the OOM killer ---------------------------------------------------------------------------------------------------
LOWER = {
    "echo": "echo 0 > /proc/self/oom_score_adj",
    "echo -1000 to the shell's": "echo -1000 > /proc/$$/oom_score_adj",
    "python": "python -c \"open('/proc/self/oom_score_adj', 'w').write('-1000')\"",
    "choom": "command -v choom >/dev/null && choom -n -1000 -p $$",
}


def test_every_process_of_the_agent_is_the_oom_killers_first_choice(make):
    trainer = oom_score_adj(os.getpid())
    env = make()
    # background, double-forked, setsid and nohup children, as a memory-spreading agent would start them
    output, code = status(env, "sleep 7771 & (sleep 7772 &) ; setsid sleep 7773 & nohup sleep 7774 >/dev/null 2>&1 &"
                               " echo started")
    assert code == 0, output
    for name, command in LOWER.items():
        output, _ = status(env, f"{command}; echo rc=$?")
        assert "rc=0" not in output, (name, output)
    sleepers = wait_for(lambda: len(found := sandboxed_processes("sleep 777")) >= 4 and found)
    assert len(sleepers) >= 4
    shells = [p.parent() for p in sleepers if p.parent() is not None]
    for proc in [*sleepers, *shells]:
        assert oom_score_adj(proc.pid) == limits_mod.OOM_SCORE_ADJ, proc.cmdline()
    assert oom_score_adj(os.getpid()) == trainer  # the trainer keeps its own


def test_an_evaluations_processes_are_the_oom_killers_first_choice(make):
    env = make()
    # the agent's code, run by the evaluation, starts a child and lingers so the host can look at both
    write_file(env, "strategy.py", attacking_strategy(
        at_import="import subprocess, time\nsubprocess.Popen(['sleep', '7781'])\ntime.sleep(4)\n"))
    seen: dict[int, int] = {}

    def watch() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(seen) < 3:
            for proc in sandboxed_processes("sleep 7781") + sandboxed_processes("harness"):
                try:
                    seen[proc.pid] = oom_score_adj(proc.pid)
                except OSError:
                    pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    validate(env)
    watcher.join()
    assert seen, "no process of the evaluation was seen from the host"
    assert set(seen.values()) == {limits_mod.OOM_SCORE_ADJ}, seen


def test_make_warns_when_the_envs_memory_limits_pass_the_machines_memory(tmp_path):
    total = resources.machine_memory_mb()
    if total is None:
        pytest.skip("no /proc/meminfo here")
    each = total // 2 + 1  # two envs, each within the machine, together past it
    code = (
        "import warnings\nfrom mlgym_registry import registry\nfrom mlgym_registry.backends.local import LocalBackend\n"
        "warnings.simplefilter('always')\nspec = registry.spec('prisonersDilemma')\n"
        f"envs = [LocalBackend(spec, memory_limit_mb={each}, workspace_dir={str(tmp_path)!r}) for _ in range(2)]\n"
        "for env in envs:\n    env.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("more than its") == 1, done.stderr  # once per process, not once per env
    # every env on the machine counts (other processes' too), these two at least
    promised = re.search(r"the memory limits of the (\d+) envs on this machine add up to (\d+) MB", done.stderr)
    assert promised and int(promised[1]) >= 2 and int(promised[2]) >= 2 * each, done.stderr


# -- the kernel's per-user counts -------------------------------------------------------------------------------------
HOARD_INOTIFY = (
    "python - <<'EOF'\nimport ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nmade = 0\n"
    "while made < 100000 and libc.inotify_init1(0) >= 0:\n    made += 1\n"
    "print('inotify', made, os.strerror(ctypes.get_errno()))\nEOF"
)


def inotify_works() -> bool:
    """Whether this process (the trainer) can still make an inotify instance."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_the_agent_cannot_spend_the_trainers_inotify_instances(make):
    env = make()
    neighbour = make()
    # the agent takes every inotify instance it can get (and a process of it that stays holds them)
    status(env, f"({HOARD_INOTIFY}; sleep 600) >/dev/null 2>&1 &")
    output, _ = status(env, HOARD_INOTIFY)
    assert "inotify 0 Too many open files" in output, output
    assert inotify_works()  # the trainer's inotify_init still works
    output, _ = status(neighbour, HOARD_INOTIFY)
    assert "inotify 0 Too many open files" in output, output  # the neighbour is bounded alike, not by the first
    neighbour.reset()  # and its reset works
    assert status(neighbour, "tail -n 1 /etc/hostname")[1] == 0


def test_no_nested_user_namespace_and_a_neighbours_reset_still_works(make):
    env = make()
    neighbour = make()
    output, code = status(env, "unshare -U true; echo rc=$?; unshare -Ur true; echo rc=$?")
    assert output.count("rc=1") == 2, output
    # a namespace-hungry agent: many processes each trying to make and keep one
    status(env, "for i in $(seq 50); do (unshare -U sleep 600 &) 2>/dev/null; done; echo done")
    neighbour.reset()
    output, _ = status(neighbour, "echo alive")
    assert output.strip() == "alive"


def test_keys_and_message_queues_are_refused_inside(make):
    env = make()
    output, _ = status(env, "python - <<'EOF'\nimport ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                            "print('keyctl', libc.syscall(250 if os.uname().machine == 'x86_64' else 219, 0, 0),"
                            " os.strerror(ctypes.get_errno()))\n"
                            "import ctypes.util\nrt = ctypes.CDLL(ctypes.util.find_library('rt') or None, "
                            "use_errno=True)\n"
                            "print('mq', rt.mq_open(b'/mlgr', 0o100 | 2, 0o600, None), "
                            "os.strerror(ctypes.get_errno()))\nEOF")
    assert "keyctl -1 Operation not permitted" in output, output
    assert "mq -1" in output, output
    status(env, "sleep 7791 &")
    (sleeper,) = wait_for(lambda: sandboxed_processes("sleep 7791"))
    limits = Path(f"/proc/{sleeper.pid}/limits").read_text()  # read from the host
    assert re.search(r"Max msgqueue size\s+0\s+0", limits), limits
    assert re.search(rf"Max pending signals\s+{limits_mod.SANDBOX_PENDING_SIGNALS}\s", limits), limits


def test_no_process_of_the_agent_can_lower_its_own_scheduling(make):
    """A process that lowered its priority would wait behind every other env's work, and the evaluation clock counts
    an evaluation's waiting as the machine's: the agent's code could buy an ``infra_error`` on a busy machine."""
    env = make()
    status(env, "(nice -n 19 sleep 7801 &) 2>/dev/null; sleep 7802 & renice -n 19 -p $! >/dev/null 2>&1; "
                "(chrt -i 0 sleep 7803 &) 2>/dev/null; python -c 'import os; os.nice(19)' 2>/dev/null; echo done")
    sleepers = wait_for(lambda: len(found := sandboxed_processes("sleep 780")) >= 2 and found)
    assert sleepers, "no sleeper of the agent's was found"
    for proc in sleepers:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
        nice, policy = int(fields[16]), int(fields[38])  # stat fields 19 and 41
        assert (nice, policy) == (0, 0), (proc.cmdline(), nice, policy)
