"""Forked envs (``LocalBackend.fork``): the contract (what carries over, what does not) and the attacks a fork opens.

A fork is a new surface: children share the parent's files copy-on-write, so the attacks are a child that reaches a
sibling's (or the parent's) later files or processes, a fork that shows the parent's hidden files, and a fork that
tells an agent more about an evaluation than the parent could learn. Everything is checked from the host, against the
real sandbox.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest

from mlgym_registry.backends.local import LocalBackend, forking, layers

from .helpers import HONEST, SEED, run, status, validate, write_file

pytestmark = pytest.mark.security


def layer_folders(backend) -> list[Path]:
    return [layer.folder for layer in backend._res.layers]


def removed(folders: list[Path], ceiling: float = 60.0) -> bool:
    """Whether ``folders`` are gone, waiting up to ``ceiling`` seconds: a letting go that meets a copy of its lock in
    a process being started (``layers._Reaper``) removes the layer once that process runs its program."""
    deadline = time.monotonic() + ceiling
    while any(folder.exists() for folder in folders) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(folder.exists() for folder in folders)


def holders(backend) -> list[int]:
    return [backend._res.view.holder.pid] if backend._res.view is not None else []


@pytest.fixture
def family(make):
    """A parent that made files, links and shell state, and two children forked from it (closed by the test)."""
    parent = make()
    status(parent, "mkdir -p sub && printf 'hello\\n' > sub/f.txt && chmod 640 sub/f.txt && ln -s f.txt sub/link "
                   "&& mkfifo sub/pipe")
    run(parent, "cd sub")
    run(parent, "export CARRIED='two words' && open f.txt")
    children = parent.fork(2)
    yield parent, children
    for env in children:
        env.close()


def test_a_child_starts_in_the_parents_state(family):
    parent, children = family
    for child in children:
        assert child.current_step == parent.current_step == 2
        assert child._episode_seeds == parent._episode_seeds and child.episode == parent.episode
        out, code = status(child, "pwd; echo \"$CARRIED\"; stat -c '%a %F' f.txt link pipe; readlink link; "
                                  "cat link; echo \"$CURRENT_FILE:$CURRENT_LINE:$WINDOW\"")
        assert code == 0, out
        lines = out.splitlines()
        assert lines[0] == "/home/agent/workspace/sub" and lines[1] == "two words"
        assert lines[2] == "640 regular file" and lines[3].endswith("symbolic link") and lines[4].endswith("fifo")
        assert lines[5:7] == ["f.txt", "hello"]
        assert lines[7].startswith("/home/agent/workspace/sub/f.txt:")
        assert lines[7].split(":")[1:] == parent.communicate("echo $CURRENT_LINE:$WINDOW").split(":")
        assert '"open_file": "/home/agent/workspace/sub/f.txt"' in child.communicate("state")


def test_children_and_parent_never_see_each_others_writes(family):
    parent, (first, second) = family
    for env, word in ((parent, "parent"), (first, "first"), (second, "second")):
        status(env, f"echo {word} > f.txt && echo {word} > only-{word} && rm link")
    for env, word in ((parent, "parent"), (first, "first"), (second, "second")):
        out, _ = status(env, "cat f.txt; ls")
        assert out.split() == [word, "f.txt", f"only-{word}", "pipe"], out
    # from the host too: the frozen layer is untouched, each view holds its own
    for env, word in ((parent, "parent"), (first, "first"), (second, "second")):
        assert (env.host_workspace / "sub" / "f.txt").read_text() == f"{word}\n"
    frozen = layer_folders(first)[0] / layers.TREE / "sub"
    assert (frozen / "f.txt").read_text() == "hello\n" and (frozen / "link").is_symlink()
    assert layer_folders(first) == layer_folders(second)


def test_closing_the_parent_leaves_the_children_and_the_last_one_cleans_up(make):
    parent = make()
    write_file(parent, "strategy.py", HONEST)
    children = parent.fork(2)
    folders, pids = layer_folders(children[0]), holders(parent) + [p for c in children for p in holders(c)]
    assert folders and all(holders(child) for child in children)
    parent.close()
    assert all(folder.is_dir() for folder in folders)
    obs, score = validate(children[0])
    assert score is not None, obs
    children[0].close()
    assert all(folder.is_dir() for folder in folders)  # the second child still stands on them
    assert "row_strategy" in run(children[1], "cat strategy.py")
    children[1].close()
    assert removed(folders)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "a holder outlived its env"


def test_a_fork_while_background_processes_run_is_refused_naming_them(make):
    parent = make()
    status(parent, "sleep 600 &")
    with pytest.raises(forking.ForkRefused, match=r"sleep 600"):
        parent.fork(1)
    status(parent, "kill %1; wait")
    (child,) = parent.fork(1)
    try:
        assert "sleep" not in run(child, "ps -eo comm")
    finally:
        child.close()


def test_a_process_read_while_it_executes_its_program_is_named_by_that_program(make, monkeypatch):
    """While the kernel executes a program, the process's command line reads empty (the new arguments are not in
    place yet): a fork then named the background ``sleep 600`` only ``sleep``, by its command's name. The kernel
    cannot be held in that window on demand, so the first reads of the background process come back empty here, as
    they do in it."""
    parent = make()
    status(parent, "sleep 600 &")
    real = forking._command_line
    empty_reads = {"left": 3}

    def executing(pid: int) -> str:
        if pid != parent._res.session.shell_pid and empty_reads["left"] > 0:
            empty_reads["left"] -= 1
            return ""
        return real(pid)

    monkeypatch.setattr(forking, "_command_line", executing)
    with pytest.raises(forking.ForkRefused, match=r"\(sleep 600\)"):
        parent.fork(1)
    assert empty_reads["left"] == 0
    status(parent, "kill %1; wait")


def test_a_child_cannot_reach_a_siblings_files_or_processes(family):
    parent, (first, second) = family
    token = "mlgr-sibling-" + secrets.token_hex(6)
    status(first, f"echo {token} > {token}.txt && (exec -a {token} sleep 600 &)")
    out, _ = status(second, f"ps -eo args | grep -c '^{token}'; find / -xdev -name '{token}*' 2>/dev/null | wc -l; "
                            "kill -9 -1 2>/dev/null; echo done")
    assert out.split() == ["0", "0", "done"], out  # grep counts itself only when it sees the process: it must not
    assert "alive" in run(first, f"ps -eo args | grep -q '^{token}' && echo alive")
    # the layers, the siblings' writable layers and the holders are nowhere in a child's sandbox
    paths = [*map(str, layer_folders(first)), str(second._res.root), str(parent._res.root)]
    out, _ = status(first, "for p in " + " ".join(paths) + "; do ls -d \"$p\" 2>/dev/null; done; echo end")
    assert out.split() == ["end"], out


def test_a_fork_does_not_show_the_parents_hidden_files(make, mini_spec):
    """The partner module made a secret: evaluations see it, the agent never does, nor a fork's child."""
    spec = mini_spec.replace(secret_files=["target.py"])
    parent = make(spec)
    assert "No such file" in run(parent, "cat target.py")
    write_file(parent, "strategy.py", HONEST)
    _, honest = validate(parent)
    (child,) = parent.fork(1)
    try:
        search = ("ls; grep -rl 'def target_column_strategy' / --include='*.py' --exclude-dir=proc --exclude-dir=usr "
                  "--exclude-dir=sys 2>/dev/null; echo end")
        out, _ = status(child, search)
        assert out.split() == ["evaluate.py", "strategy.py", "end"], out
        assert status(parent, search)[0] == out
        obs, score = validate(child)  # the evaluation still plays the hidden partner
        assert score == honest, obs
    finally:
        child.close()


def test_a_child_learns_nothing_the_parent_could_not(make):
    """The evaluation seed is carried: a child's validate is the parent's (same rows, same randomness), so forking
    and re-validating teaches an agent nothing new; submit still scores the rows validate never sees."""
    parent = make()
    write_file(parent, "strategy.py", HONEST)
    _, first = validate(parent)
    children = parent.fork(2)
    try:
        for child in children:
            assert child.row_split() == parent.row_split()
            _, again = validate(child)
            assert again == first
    finally:
        for child in children:
            child.close()


def test_a_reset_child_is_a_plain_env_again(make):
    parent = make()
    (child,) = parent.fork(1)
    try:
        held = layer_folders(child)
        child.reset()
        assert child._res.view is None and child.host_workspace == child._res.root / "workspace"
        assert child.current_step == 0 and "No such file" not in run(child, "cat strategy.py")
        parent.close()
        assert removed(held)
    finally:
        child.close()


def test_a_child_forks_again_and_keeps_the_disk_quota(make):
    parent = make(max_disk_mb=64, max_file_mb=16)
    write_file(parent, "strategy.py", HONEST)
    status(parent, "head -c 1000000 /dev/zero > base.bin")
    (child,) = parent.fork(1)
    (grandchild,) = child.fork(1)
    try:
        status(child, "head -c 3000000 /dev/zero > child.bin")
        assert run(grandchild, "ls *.bin") == "base.bin"
        assert child._disk.limit == parent._disk.limit == grandchild._disk.limit
        output, code = status(grandchild, "for i in 1 2 3; do head -c 12000000 /dev/zero > big$i.bin; done")
        assert code == 0, output
        obs, score = validate(grandchild)
        assert score is None and "disk quota of 64 MB" in obs, obs
        for env in (parent, child):  # the others' files were not the grandchild's
            obs, score = validate(env)
            assert score is not None, obs
    finally:
        grandchild.close()
        child.close()


def test_without_overlayfs_a_child_gets_a_copy(make, monkeypatch):
    monkeypatch.setattr(layers, "overlay_supported", lambda parent: "no overlay on this host (test)")
    parent = make()
    run(parent, "mkdir sub && echo hi > sub/f && ln -s f sub/l && cd sub")
    (child,) = parent.fork(1)
    try:
        assert child._res.view is None and parent._res.view is None
        assert run(child, "pwd; cat l").split() == ["/home/agent/workspace/sub", "hi"]
        status(child, "echo child > f")
        assert run(parent, "cat f") == "hi"
    finally:
        child.close()


def test_unsandboxed_fork_copies_and_rebases_the_working_directory(mini_spec):
    parent = LocalBackend(mini_spec, sandbox="none", seed=SEED)
    try:
        parent.reset()
        parent.install_tools()
        run(parent, "mkdir sub && cd sub && echo hi > f")
        (child,) = parent.fork(1)
        try:
            assert run(child, "pwd") == str(child.host_workspace / "sub")
            assert run(child, "cat f") == "hi"
        finally:
            child.close()
    finally:
        parent.close()


@pytest.mark.parametrize("copy_limit", [0, forking.COPY_LIMIT_BYTES])
def test_a_parent_forked_at_every_turn_keeps_a_bounded_stack_of_layers(make, monkeypatch, copy_limit):
    """Each generation forks the last one's child after a turn that wrote and removed a file: the stack stays
    bounded whether the files are frozen themselves (limit 0) or copied (``_freeze_a_copy``, whiteouts included)."""
    monkeypatch.setattr(forking, "MAX_LAYERS", 2)
    monkeypatch.setattr(forking, "COPY_LIMIT_BYTES", copy_limit)
    env = make()
    envs = [env]
    try:
        for turn in range(4):
            run(env, f"echo {turn} > turn{turn}.txt && rm -f turn{turn - 1}.txt")
            (env,) = env.fork(1)
            envs.append(env)
            assert all(len(each._res.layers) <= 2 for each in envs)
            assert run(env, "ls turn*.txt; cat turn*.txt").split() == [f"turn{turn}.txt", str(turn)]
        assert run(envs[-2], "ls turn*.txt").split() == ["turn3.txt"]
    finally:
        for each in envs[1:]:
            each.close()


def test_a_parent_unchanged_since_its_last_fork_keeps_its_shell(make, monkeypatch):
    monkeypatch.setattr(forking, "COPY_LIMIT_BYTES", 0)  # the files themselves are frozen, the shell restarted
    parent = make()
    run(parent, "echo once > f.txt")
    first = parent.fork(1)
    shell = parent._res.session.shell_pid
    second = parent.fork(1)  # nothing written since: the same layers, the same shell
    try:
        assert parent._res.session.shell_pid == shell
        assert [layer.folder for layer in second[0]._res.layers] == [layer.folder for layer in parent._res.layers]
        assert run(second[0], "cat f.txt") == "once"
        status(second[0], "echo twice > f.txt")
        assert run(parent, "cat f.txt") == run(first[0], "cat f.txt") == "once"
    finally:
        for child in first + second:
            child.close()


def test_a_pickled_fork_point_makes_children_until_its_layers_are_gone(make):
    import pickle

    parent = make()
    run(parent, "echo kept > f.txt && mkdir /tmp/mine && cd /tmp/mine")  # not carried
    point = parent.fork_point()
    copy = pickle.loads(pickle.dumps(point))  # as a worker process gets it: no hold of its own yet
    child = copy.make()
    try:
        assert run(child, "pwd; cat /home/agent/workspace/f.txt").split() == ["/home/agent/workspace", "kept"]
    finally:
        child.close()
        copy.close()
    point.close()
    parent.close()
    with pytest.raises(forking.ForkRefused, match="keep the ForkPoint open"):
        pickle.loads(pickle.dumps(point)).make()


def _processes_of(env) -> list[int]:
    session, view = env._res.session, env._res.view
    return [pid for pid in (session.pid if session else None, view.holder.pid if view else None) if pid]


def test_children_made_ahead_start_in_the_parents_state_and_nothing_outlives_close(make):
    """``prepare_forks`` makes children ahead (their holder waiting, their sandbox started before any layer
    existed): a fork takes them, and they carry the state and isolation of any child; the workspace they see later
    is mounted without set-user-id files or devices, as the sandbox binds a folder; closing the parent closes the
    ones no fork took."""
    parent = make()
    run(parent, "mkdir sub && echo hello > sub/f.txt && cd sub && export CARRIED='two words'")
    assert parent.prepare_forks(3, wait=True) == 3
    spares = list(parent._res.spares._ready)
    made_ahead = [pid for spare in spares for pid in _processes_of(spare)]
    children = parent.fork(2)
    try:
        assert children == spares[:2]
        for child in children:
            out, code = status(child, "pwd; echo \"$CARRIED\"; cat f.txt; "
                                      "grep ' /home/agent/workspace ' /proc/self/mountinfo | tail -1")
            assert code == 0, out
            lines = out.splitlines()
            assert lines[:3] == ["/home/agent/workspace/sub", "two words", "hello"], out
            assert "nosuid" in lines[3] and "nodev" in lines[3], lines[3]
        status(children[0], "echo first > f.txt")
        assert run(children[1], "cat f.txt") == run(parent, "cat f.txt") == "hello"
        out, _ = status(children[1], "for p in " + " ".join(map(str, layer_folders(children[0]))) +
                        f" {children[0]._res.root} {parent._res.root}; do ls -d \"$p\" 2>/dev/null; done; echo end")
        assert out.split() == ["end"], out
    finally:
        for child in children:
            child.close()
    assert parent._res.spares.wait(60) >= 1  # the fork asked for as many as it made
    parent.close()
    assert not [pid for pid in made_ahead if os.path.exists(f"/proc/{pid}")], "a process made ahead outlived close"
    assert not any(spare._res.root.exists() for spare in spares)



@pytest.mark.parametrize("how", ["fork", "fork_point"])
def test_a_shell_never_starts_before_its_view_is_mounted(make, monkeypatch, how):
    # on a busy machine a holder's mount can finish after a sandbox could start: one started then binds the empty
    # mount point, and the agent's files are not there (an audit on forked envs lost its baseline's submission so)
    monkeypatch.setattr(forking, "COPY_LIMIT_ENTRIES", -1)  # the files themselves are frozen, the parent's shell
    monkeypatch.setattr(layers, "HOLDER_SCRIPT", "sleep 1; " + layers.HOLDER_SCRIPT)  # restarted on a new view
    parent = make()
    run(parent, "echo kept > f.txt")
    if how == "fork":
        children = parent.fork(1)
    else:
        point = parent.fork_point()
        children = [point.make()]
        point.close()
    try:
        for env in (parent, *children):
            assert run(env, "cat f.txt; echo new > g.txt; cat g.txt").split() == ["kept", "new"]
            assert (env.host_workspace / "g.txt").read_text() == "new\n"
    finally:
        for child in children:
            child.close()
