"""The agent cannot buy ``infra_error``: a failure its own actions caused is its failure, paid the task's floor.

``infra_error`` pays 0 and is masked as "not the agent's", so it is worth more than a poor honest score. Each attack
runs as the agent would run it (commands in its sandboxed shell, then ``validate``), and is judged from the host:
the evaluation's status, what the reward pays for it (``rewards.step_outcome``), the modes of the workspace's files
on the host. The attacks on file modes run under this process's driver and under a driver of the user ``nobody``
(where the agent's files belong to the driver's user, so a mode the agent set can shut the driver out): the copy an
evaluation makes reads them anyway and gives every mode back. The disk attacks go past the env's own disk quota
(``max_disk_mb``), and fill a small file system that two envs share.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import mlgym_registry
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.components.rewards import failure_reward, step_outcome

from .helpers import HONEST, status, write_file

pytestmark = pytest.mark.security

WORKSPACE = "/home/agent/workspace"

LOCKS = {
    # the workspace folder itself shut to everyone: the copy reads it anyway, the agent's code is as it was
    "workspace 000": (f"chmod 000 {WORKSPACE}", "scored"),
    # every file and folder, deepest first (chmod -R stops at the first folder it shuts), the workspace last
    "everything 000": (f"mkdir -p pkg/sub && echo x > pkg/sub/f && find {WORKSPACE} -depth -exec chmod 000 {{}} +",
                       "failed"),
    # folders that can be listed but not entered (no x bit), the code file unreadable
    "no x on folders": (f"mkdir -p pkg/sub && chmod 000 strategy.py && chmod a-x pkg/sub pkg {WORKSPACE}", "failed"),
    # links that loop, and the strategy replaced by a link to itself
    "link loops": ("ln -s loop loop && ln -s a b && ln -s b a && ln -s . here && rm strategy.py && "
                   "ln -s strategy.py strategy.py", "failed"),
}



def validate_outcome(env: LocalBackend) -> tuple[str, str, str, list]:
    """``validate``: (observation, evaluation status, what the reward makes of it, the episode's scores)."""
    obs, _, _, info = env.step("validate")
    return obs or "", info.get("evaluation_status", ""), step_outcome(obs, info, env.spec).kind, list(info["score"])


def honest_score(env: LocalBackend) -> dict:
    """The score of the honest strategy in this episode (the same seed: the same score)."""
    write_file(env, "strategy.py", HONEST)
    obs, state, _, scores = validate_outcome(env)
    assert state == "ok", obs
    return scores[-1]


# -- file modes -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_locking_the_workspace_is_never_an_infra_error(make, lock):
    command, expected = LOCKS[lock]
    env = make()
    honest = honest_score(env)
    output, code = status(env, command)
    obs, state, outcome, scores = validate_outcome(env)
    assert state != "infra_error", obs
    assert outcome == expected, (state, obs)
    if expected == "scored":
        assert scores[-1] == honest, obs  # the agent's code as it was: locking the folder changes nothing
    else:
        assert state in ("agent_error", "invalid_submission"), obs
        assert env.notes == [], env.notes
    assert failure_reward(env.spec) < 0  # what "failed" is paid: the task's floor, below any honest score's worth


def test_locked_modes_are_given_back_after_the_evaluation(make):
    """The copy reads what the agent locked without changing it: every mode is the agent's again afterwards."""
    env = make()
    status(env, f"mkdir -p pkg/sub && echo x > pkg/sub/f && chmod 000 pkg/sub/f pkg/sub && chmod 100 pkg && "
                f"chmod 000 strategy.py && chmod 300 {WORKSPACE}")
    before = _modes(env.host_workspace)
    validate_outcome(env)
    assert _modes(env.host_workspace) == before


def _modes(workspace: Path) -> dict[str, int]:
    modes = {".": stat.S_IMODE(os.lstat(workspace).st_mode)}
    for relative in ("pkg", "strategy.py"):
        modes[relative] = stat.S_IMODE(os.lstat(workspace / relative).st_mode)
    return modes


NOBODY = 65534

DRIVER = textwrap.dedent(
    """\
    # a driver as the user nobody: each lock of the agent's, then validate; one JSON line per lock
    import json, os, stat, sys
    from mlgym_registry import registry
    from mlgym_registry.backends.local import LocalBackend
    from mlgym_registry.components.rewards import failure_reward, step_outcome

    def workspace_mode(env):
        # read while no walk of the driver's runs: the disk guard's walk, like an evaluation's copy, opens a folder
        # the agent shut by giving it its owner's bits back for a moment, and both hold this lock meanwhile
        with env._disk.lock:
            return stat.S_IMODE(os.lstat(env.host_workspace).st_mode)

    folder, locks = sys.argv[1], json.loads(sys.argv[2])
    real = registry.spec("prisonersDilemma")
    spec = real.replace(id="miniPrisonersDilemma", root=os.path.join(folder, "task"), max_steps=1000,
                        starter_code=["target.py", "evaluate.py", "strategy.py"], training_timeout=120)
    env = LocalBackend(spec, seed=0, workspace_dir=os.path.join(folder, "envs"))
    try:
        for name, command in locks.items():
            env.reset(seed=0)
            env.install_tools()
            env.communicate(command, timeout_duration=30)
            mode = workspace_mode(env)
            obs, _, _, info = env.step("validate")
            print(json.dumps({"lock": name, "uid": os.geteuid(), "status": info.get("evaluation_status"),
                              "outcome": step_outcome(obs, info, spec).kind, "score": info["score"], "obs": obs,
                              "mode_kept": workspace_mode(env) == mode, "floor": failure_reward(spec)}), flush=True)
    finally:
        env.close()
    """
)


def _blocked_folders(paths: list[str]) -> list[str]:
    """The folders above ``paths`` that other users cannot enter (a home folder of mode 0700 holding the
    interpreter), outermost first."""
    blocked = []
    for path in paths:
        for parent in reversed(Path(path).parents):
            if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH and str(parent) not in blocked:
                blocked.append(str(parent))
    return sorted(blocked, key=lambda folder: folder.count("/"))


def _as_nobody(argv: list[str], home: str, needed: list[str]) -> list[str]:
    """``argv`` run as the user nobody (``HOME`` the folder ``home``), in a mount namespace of its own where each
    folder above the ``needed`` paths that nobody could not enter is covered by an open in-memory folder showing only
    the way to them."""
    lines = ["set -e", f"hold=$(mktemp -d -p '{home}')"]
    for index, folder in enumerate(_blocked_folders(needed)):
        children = sorted({Path(path).relative_to(folder).parts[0] for path in needed
                           if Path(path).is_relative_to(folder) and path != folder})
        lines += [f"mkdir $hold/{index}", f"mount --bind '{folder}' $hold/{index}",
                  f"mount -t tmpfs -o mode=0755,size=1m tmpfs '{folder}'"]
        for child in children:
            kind = "mkdir" if os.path.isdir(os.path.join(folder, child)) else "touch"
            lines += [f"{kind} '{folder}/{child}'", f"mount --bind $hold/{index}/'{child}' '{folder}/{child}'"]
    lines.append(f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups env HOME={home} "$@"')
    return ["unshare", "-m", "--propagation", "private", "bash", "-c", "\n".join(lines), "as-nobody", *argv]


@pytest.fixture
def nobody_folder():
    """A folder of the user nobody's, with a copy of the miniPrisonersDilemma task files in ``task``."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"):
        pytest.skip("running a driver as another user needs root, setpriv and unshare")
    folder = Path(tempfile.mkdtemp(prefix="mlgr-nobody-"))
    try:
        from .helpers import mini_prisoners_spec

        mini_prisoners_spec(folder / "task")
        (folder / "envs").mkdir()
        for path in (folder, *folder.rglob("*")):
            os.chown(path, NOBODY, NOBODY)
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_locking_the_workspace_under_a_driver_that_is_not_root(nobody_folder):
    """The driver is nobody: the agent's files are nobody's on the host, and ``chmod 000`` shuts nobody out."""
    package = str(Path(mlgym_registry.__file__).resolve().parent.parent)
    needed = [os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, package]
    env = {**os.environ, "PYTHONPATH": package, "PYTHONWARNINGS": "ignore"}
    probe = subprocess.run(_as_nobody([sys.executable, "-c", "import mlgym_registry"], str(nobody_folder), needed),
                           capture_output=True, text=True, timeout=60, check=False, env=env)
    if probe.returncode != 0:
        pytest.skip(f"cannot run a driver as nobody here: {probe.stderr.strip()[-300:]}")
    argv = [sys.executable, "-c", DRIVER, str(nobody_folder), json.dumps({k: v[0] for k, v in LOCKS.items()})]
    done = subprocess.run(_as_nobody(argv, str(nobody_folder), needed), capture_output=True, text=True, timeout=240,
                          check=False, env=env)
    results = {r["lock"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(results) == sorted(LOCKS), done.stderr[-3000:]
    honest_scores = {tuple(sorted(r["score"][-1].items())) for r in results.values() if r["outcome"] == "scored"}
    for name, result in results.items():
        assert result["uid"] == NOBODY
        assert result["status"] != "infra_error", result
        assert result["outcome"] == LOCKS[name][1], result
        assert result["mode_kept"], result
        if result["outcome"] == "failed":
            assert result["floor"] < 0  # what a failure is paid: the task's floor
    assert len(honest_scores) == 1  # the starter strategy under the episode's seed, however locked its folder was


# -- disk -------------------------------------------------------------------------------------------------------------
def test_writing_past_the_disk_quota_is_the_agents_failure(make):
    env = make(max_disk_mb=64, max_file_mb=16)
    output, code = status(env, "for i in 1 2 3; do head -c 12000000 /dev/zero > big$i.bin; done; du -sm .")
    assert code == 0, output
    obs, state, outcome, _ = validate_outcome(env)
    assert (state, outcome) == ("invalid_submission", "failed"), obs
    assert "disk quota of 64 MB" in obs, obs
    status(env, "rm big*.bin")
    assert validate_outcome(env)[1] == "ok"  # the agent's own files were the trouble


def test_data_hidden_in_the_tasks_own_files_counts_against_the_quota(make):
    """The task's files (its evaluator, its data) are not the agent's, but what the agent adds to them is."""
    env = make(max_disk_mb=64, max_file_mb=40)
    assert status(env, "head -c 20000000 /dev/zero > big.bin")[1] == 0
    assert validate_outcome(env)[1] == "ok"  # 20 MB and their copy: within 64 MB
    output, code = status(env, "chmod u+w evaluate.py && head -c 30000000 /dev/zero >> evaluate.py")
    assert code == 0, output
    obs, state, outcome, _ = validate_outcome(env)  # 20 MB, their copy and 30 MB more: over it
    assert (state, outcome) == ("invalid_submission", "failed"), obs
    assert "disk quota of 64 MB" in obs, obs


def test_one_env_over_its_quota_does_not_fail_another_envs_evaluation(make, tmp_path):
    filler = make(max_disk_mb=32, max_file_mb=16, workspace_dir=str(tmp_path))
    other = make(workspace_dir=str(tmp_path))
    honest = honest_score(other)
    status(filler, "for i in 1 2 3 4; do head -c 15000000 /dev/urandom > big$i.bin; done")
    assert validate_outcome(filler)[1] == "invalid_submission"
    obs, state, _, scores = validate_outcome(other)
    assert state == "ok" and scores[-1] == honest, obs


def shell_answers(env) -> bool:
    """Whether the env's shell still runs commands. Its answer may carry the guard's note once more: under load a
    write in flight when the guard stopped the writer can land after it, and the guard then stops what is left."""
    return status(env, "echo still here")[0].splitlines()[0] == "still here"


def endless_writer(prefix: str) -> str:
    """A loop that writes 4 MB files named ``prefix<N>.bin`` four times a second (over 400 names) for far longer than
    any test or timeout: only the disk guard ends it."""
    return f"for i in $(seq 100000); do head -c 4000000 /dev/zero > {prefix}$((i % 400)).bin; sleep 0.25; done"


def assert_writer_stopped(env, prefix: str) -> None:
    """The files ``endless_writer(prefix)`` wrote take more than the 32 MB quota and no longer change. How much it
    wrote before the guard stopped it depends on how busy the machine is (the guard is a thread of the driver), so
    no amount beyond the quota is asserted."""
    sizes = written(env, f"{prefix}*.bin")
    assert sizes >= 32 << 20, sizes
    time.sleep(2)  # a writer that still ran would have written 8 more files by now
    assert written(env, f"{prefix}*.bin") == sizes


def written(env, pattern: str) -> int:
    """Bytes in the workspace's files that match ``pattern``."""
    return sum(path.stat().st_size for path in env.host_workspace.glob(pattern))


def test_a_command_writing_past_the_quota_is_stopped_while_it_runs(make):
    """Not only at the next evaluation: the disk guard stops the writer while it runs, long before the command's
    timeout, with the quota's note."""
    env = make(max_disk_mb=32, max_file_mb=8, command_timeout=600)
    obs, _, _, _ = env.step(endless_writer("f") + "; echo finished")
    assert "disk quota of 32 MB" in obs and "finished" not in obs, obs
    assert "EXECUTION TIMED OUT" not in obs, obs
    assert_writer_stopped(env, "f")
    assert shell_answers(env)  # the shell itself was spared


def test_a_background_writer_past_the_quota_is_stopped_too(make):
    env = make(max_disk_mb=32, max_file_mb=8, command_timeout=60)
    status(env, f"({endless_writer('bg')}) >/dev/null 2>&1 &")
    # the guard's note comes with the first command after it stopped the writer: wait for that event (a loaded
    # machine slows the writer down, so no fixed wait would do), with a ceiling far above what it takes
    obs, deadline = "", time.monotonic() + 180
    while "disk quota of 32 MB" not in obs and time.monotonic() < deadline:
        obs, _ = status(env, "sleep 1")
    assert "disk quota of 32 MB" in obs, obs
    assert_writer_stopped(env, "bg")
    assert shell_answers(env)
    assert validate_outcome(env)[1] == "invalid_submission"  # still over: its files stay until it deletes them


def _fill(path: Path) -> None:
    """Write to ``path`` until the disk is full (as another program of the host would)."""
    chunk = b"\1" * (1 << 20)
    with open(path, "wb") as handle:
        try:
            while True:
                handle.write(chunk)
                handle.flush()
        except OSError:
            pass


def test_a_disk_filled_by_someone_else_is_an_infra_error(make, small_disk):
    env = make(workspace_dir=str(small_disk))
    honest = honest_score(env)
    _fill(small_disk / "someone-elses.bin")
    obs, state, outcome, _ = validate_outcome(env)
    assert (state, outcome) == ("infra_error", "infra"), obs
    assert "disk is full" in obs, obs
    (small_disk / "someone-elses.bin").unlink()
    obs, state, _, scores = validate_outcome(env)
    assert state == "ok" and scores[-1] == honest, obs


def test_a_command_that_took_the_env_over_its_quota_is_stopped_as_it_ends_so_the_next_action_runs(make, small_disk):
    """However late the guard's thread looks (it is one thread of a driver on a busy machine), a command that ended
    over the quota gets the quota's note itself, and the env's processes are stopped then: the agent's next action
    runs in a new shell, never killed by a stop meant for the command before (under load a late guard killed the
    shell running the agent's ``validate``, and the action was lost). Writing 24 MB takes a few hundredths of a
    second, far less than the guard's half-second look: it is the command's end that finds the env over."""
    env = make(workspace_dir=str(small_disk), max_disk_mb=16, max_file_mb=8)
    obs, _ = status(env, "for i in 1 2 3; do head -c 8000000 /dev/zero > g$i.bin; done; echo written")
    assert "disk quota of 16 MB" in obs, obs
    assert status(env, "echo still here") == ("still here", 0)
    obs, state, outcome, _ = validate_outcome(env)
    assert (state, outcome) == ("invalid_submission", "failed"), obs
    assert "shell session exited" not in obs, obs
    status(env, "rm g*.bin")
    assert validate_outcome(env)[1] == "ok"  # its own files were the trouble, and the env goes on


def test_a_disk_the_agent_filled_is_its_own_failure(make, small_disk):
    """The agent fills the small disk in one go (faster than the disk guard looks, or stopped by it): either way its
    files take more than its quota, and the evaluation that finds the disk full is its failure."""
    env = make(workspace_dir=str(small_disk), max_disk_mb=16, max_file_mb=8)
    filler = ("python -c \"\nimport itertools\nfor i in itertools.count():\n    open(f'f{i}.bin', 'wb').write(b'x' * "
              "(8 << 20))\n\" 2>&1 | tail -1")
    status(env, filler)
    assert sum(path.stat().st_size for path in env.host_workspace.glob("f*.bin")) > 16 << 20
    obs, state, outcome, _ = validate_outcome(env)
    assert (state, outcome) == ("invalid_submission", "failed"), obs
    assert env.notes == [], env.notes
