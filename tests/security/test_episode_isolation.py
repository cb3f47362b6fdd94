"""Episodes: nothing the agent leaves in one episode is there in the next, whatever reset does to be fast."""

from __future__ import annotations

import psutil
import pytest

from .helpers import open_backend, run, status

pytestmark = pytest.mark.security

MARK = "episode-one-was-here"
WRITABLE = ("/home/agent/workspace", "/home/agent/workspace/data", "/tmp", "/var/tmp", "/home/agent", "/dev/shm")
"""Every folder the agent may write to (the workspace's data folder is read-only by mode, which the agent owns)."""

LEAVE_TRACES = f"""
for folder in {' '.join(WRITABLE)}; do
    chmod u+w "$folder" 2>/dev/null
    echo {MARK} > "$folder/.{MARK}"; echo {MARK} > "$folder/{MARK}"
done
chmod u+w evaluate.py 2>/dev/null; echo '# {MARK}' >> evaluate.py; echo '# {MARK}' >> strategy.py
mkdir -p deep/er && echo {MARK} > deep/er/file
export MLGR_LEFT={MARK}; PLAIN_LEFT={MARK}
left_function() {{ echo {MARK}; }}
alias left_alias='echo {MARK}'
cd() {{ echo {MARK}; }}
trap 'echo {MARK}' EXIT
shopt -s expand_aliases
(sleep 300 &) ; nohup sleep 301 >/dev/null 2>&1 &
setsid sleep 302 >/dev/null 2>&1 < /dev/null &
sleep 303 &
disown -a
echo done
"""


def test_nothing_of_an_episode_reaches_the_next(mini_spec):
    env = open_backend(mini_spec)
    try:
        fresh_listing = run(env, "builtin cd /home/agent/workspace && ls -laR --time-style=+ . | sort")
        output, code = status(env, LEAVE_TRACES)
        assert code == 0 and output.endswith("done"), output
        assert run(env, f"cat /tmp/{MARK} /dev/shm/{MARK}").split() == [MARK, MARK]
        left = env._res.session.processes()
        assert len(left) >= 4, left  # the sleeps, seen from the host
        old_shell = env._res.session.shell_pid

        env.reset()

        for pid in left | {old_shell}:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
        assert not env.host_workspace.joinpath(MARK).exists()
        found, _ = status(env, f"find {' '.join(WRITABLE)} -name '*{MARK}*' 2>/dev/null; grep -rl {MARK} . 2>/dev/null")
        assert found == "", found
        assert run(env, "builtin cd /home/agent/workspace && ls -laR --time-style=+ . | sort") == fresh_listing
        processes = run(env, "ps -e -o comm=").split()
        assert processes == ["bash", "ps"], processes
        shell_state, _ = status(
            env,
            "echo \"[$MLGR_LEFT$PLAIN_LEFT]\"; declare -F left_function cd; alias left_alias 2>/dev/null; "
            "trap -p EXIT; shopt expand_aliases | grep -c on",
        )
        assert shell_state.split("\n") == ["[]", "0"], shell_state
        assert run(env, "cd /tmp && pwd") == "/tmp"
    finally:
        env.close()
