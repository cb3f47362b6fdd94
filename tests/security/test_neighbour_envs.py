"""One env cannot change another env's score: what an agent leaves running stays inside its own env's CPU, memory
and process envelope (``backends/local/cgroups.py``), and an evaluation's time limit counts only the time it could
run (``eval_clock.py``).

Env A is hostile: its agent leaves busy loops running (``setsid``, ``nohup``, a double fork), as many as its process
limit allows without hitting it. Env B, in the same process, validates the honest starter strategy of the real
prisonersDilemma with a short evaluation timeout. Everything is judged from the host: B's score against its score
alone, B's status, the cgroups of A's processes (``/proc/<pid>/cgroup``), and that none of them is left after A's
reset and close (psutil).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from mlgym_registry import registry
from mlgym_registry.backends.local import LocalBackend, cgroups, eval_clock

from .helpers import SEED, open_backend, squeeze, status, validate, write_file

pytestmark = [pytest.mark.security, pytest.mark.slow]

LOOPS = 90
"""Busy loops A's agent leaves running (its process limit is 128: the shell and its sandbox take a few more)."""
TIMEOUT = 10
"""B's evaluation timeout (``training_timeout``). Alone, its validate takes well under a second of CPU. With A's
loops competing one by one with it, as before envs had CPU cgroups, it ran out of this time on 2 cores
(``agent_error``, "the evaluation did not finish within 10 seconds"); now it takes about a second."""

HOSTILE = f"""\
for i in $(seq {LOOPS - 2}); do setsid sh -c 'while :; do :; done' >/dev/null 2>&1 & done
nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &
( ( exec sh -c 'while :; do :; done' >/dev/null 2>&1 & ) & )
echo started
"""


def busy_loops(env: LocalBackend) -> list[psutil.Process]:
    """The processes of ``env``'s session running its busy loops (``sh -c 'while ...'``), seen from the host."""
    root = psutil.Process(env._res.session.pid)
    found = []
    for process in root.children(recursive=True):
        try:
            if process.cmdline()[:2] == ["sh", "-c"] and "while" in process.cmdline()[2]:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def wait_for_loops(env: LocalBackend, count: int, within: float = 120) -> list[psutil.Process]:
    """``env``'s busy loops once ``count`` of them run (``setsid`` and ``nohup`` take a moment to become them)."""
    deadline = time.monotonic() + within
    while len(loops := busy_loops(env)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return loops


def wait_for_child(env: LocalBackend, name: str, within: float = 120) -> psutil.Process:
    """The first process called ``name`` among ``env``'s session's descendants (it may still be starting)."""
    deadline = time.monotonic() + within
    while True:
        for process in psutil.Process(env._res.session.pid).children(recursive=True):
            try:
                if process.name() == name:
                    return process
            except psutil.NoSuchProcess:
                continue
        assert time.monotonic() < deadline, f"no {name} process started"
        time.sleep(0.05)


def wait_for_member(env: LocalBackend, name: str, within: float = 120) -> list[int]:
    """The processes called ``name`` in ``env``'s agent cgroup (they may still be starting)."""
    deadline = time.monotonic() + within
    while True:
        found = []
        for pid in env._res.envelope.members(cgroups.AGENT):
            try:
                if psutil.Process(pid).name() == name:
                    found.append(pid)
            except psutil.NoSuchProcess:
                continue
        if found:
            return found
        assert time.monotonic() < deadline, f"no {name} process in the agent's cgroup"
        time.sleep(0.05)


def cgroup_paths(pid: int) -> dict[str, str]:
    """The cgroup of ``pid`` per hierarchy (``"cpu"``, ``"pids"``, ..., ``""`` for the unified one), as the host
    sees it."""
    paths = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            paths[name] = path
    return paths


def own_paths(env: LocalBackend) -> dict[str, str]:
    """The cgroups ``env``'s agent processes must be in, per hierarchy, as ``/proc/<pid>/cgroup`` names them."""
    res = env._res
    agent = res.envelope.folder_name(cgroups.AGENT)
    folders = [root / agent for root in res.envelope.roots.values()]
    folders += [c.path for c in (res.cgroup, res.memory) if c is not None and c.joinable]
    expected = {}
    for folder in folders:
        hierarchy = next(h for h in cgroups.hierarchies() if folder.is_relative_to(h.mount))
        for name in hierarchy.controllers or {""}:
            expected[name] = "/" + str(folder.relative_to(hierarchy.mount))
    assert "" in expected or "cpu" in expected, expected
    return expected


def gone(pids: list[int], within: float = 120.0) -> bool:
    """Whether none of ``pids`` runs any more (a zombie waiting for its reaper does not run) within ``within``
    seconds: a reset sends SIGKILL and does not wait for the processes to exit (``cgroups.Envelope.kill``), which on a
    loaded machine takes them a moment."""
    deadline = time.monotonic() + within
    while True:
        running = False
        for pid in pids:
            try:
                running = running or psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                continue
        if not running or time.monotonic() > deadline:
            return not running
        time.sleep(0.02)


@pytest.fixture
def honest_spec():
    """The real prisonersDilemma with a short evaluation timeout."""
    return registry.spec("prisonersDilemma").replace(training_timeout=TIMEOUT)


def test_busy_neighbour_cannot_change_an_honest_score(honest_spec, tmp_path):
    if not any(h.controllers & {"cpu"} or h.v2 for h in cgroups.hierarchies()):
        pytest.skip("no cgroup hierarchy with a cpu controller on this host")
    honest = open_backend(honest_spec, workspace_dir=str(tmp_path))
    hostile = None
    try:
        if honest._res.envelope is None or not honest._res.envelope.weighted:
            pytest.skip(f"this host gives envs no CPU weight: {honest.notes}")
        _, alone = validate(honest)
        assert alone is not None and "Score" in alone, alone

        hostile = open_backend(honest_spec, workspace_dir=str(tmp_path), max_processes=128)
        output, code = status(hostile, HOSTILE, timeout=60)
        assert code == 0 and "started" in output, output
        loops = wait_for_loops(hostile, LOOPS)
        assert len(loops) == LOOPS, f"only {len(loops)} busy loops started: {output}"
        expected = own_paths(hostile)
        for loop in loops:
            paths = cgroup_paths(loop.pid)
            assert {name: paths.get(name) for name in expected} == expected, (loop.pid, paths)
        assert hostile._res.limit_events() == 0, "the attack must stay under its limits, or its loops are stopped"

        honest.reset(seed=SEED)  # the same episode as the lone validate: the same evaluator seed
        hostile_cpu = hostile._res.envelope.usage(cgroups.AGENT).cpu
        started = time.monotonic()
        observation, _, _, info = honest.step("validate")
        took = time.monotonic() - started
        score, info_status = (info["score"] or [None])[-1], info.get("evaluation_status")
        hostile_used = hostile._res.envelope.usage(cgroups.AGENT).cpu - hostile_cpu

        assert score == alone, f"neighbour changed the score: {score} (alone {alone}), {took:.1f} s:\n{observation}"
        assert info_status == "ok", info_status
        still = [loop for loop in loops if loop.is_running() and loop.status() != psutil.STATUS_ZOMBIE]
        assert len(still) == len(loops), "the hostile env's loops must keep running during the test"
        assert hostile_used > 0.1 * took, f"the hostile loops hardly ran ({hostile_used:.2f} s of CPU in {took:.1f})"

        pids = [loop.pid for loop in loops]
        hostile.reset()
        assert gone(pids), "the hostile env's loops outlived its reset"
        # its old agent cgroup now holds the next episode's shell, started ahead, and nothing of the loops
        assert not set(pids) & hostile._res.envelope.members(cgroups.SPARE)
        folders = hostile._res.envelope._distinct_roots()
        hostile.close()
        assert not any(folder.exists() for folder in folders), folders
    finally:
        honest.close()
        if hostile is not None:
            hostile.close()


ESCAPES = r"""
ls /sys/fs/cgroup 2>&1
for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/cpu/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs; do
  (echo $$ > "$f") 2>/dev/null && echo "JOINED $f"
done
mkdir -p /tmp/cg
for how in "-t cgroup2 none" "-t cgroup -o cpu none" "-t cgroup -o pids none" "-t sysfs none"; do
  mount $how /tmp/cg 2>/dev/null && echo "MOUNTED $how"
  unshare -Urm sh -c "mount $how /tmp/cg && echo 0 > /tmp/cg/cgroup.procs && echo NESTED $how" 2>/dev/null
  unshare -Urmc sh -c "mount $how /tmp/cg && echo 0 > /tmp/cg/cgroup.procs && echo NESTED-NS $how" 2>/dev/null
done
cat /proc/self/cgroup
setsid sleep 300 >/dev/null 2>&1 &
echo done
"""


def test_processes_cannot_leave_their_cgroup(mini_spec, tmp_path):
    env = open_backend(mini_spec, workspace_dir=str(tmp_path))
    try:
        if env._res.envelope is None:
            pytest.skip(f"no cgroups on this host: {env.notes}")
        output, code = status(env, ESCAPES)
        assert "done" in output, output
        assert "No such file or directory" in output.splitlines()[0], output  # the sandbox shows no /sys/fs/cgroup
        for word in ("JOINED", "MOUNTED", "NESTED"):
            assert word not in output, output
        # its own cgroup namespace: every hierarchy's root is its own cgroup, nothing above it is named
        for line in output.splitlines():
            if line[:1].isdigit() and ":" in line:
                assert line.endswith(":/"), output
        sleeper = wait_for_child(env, "sleep")
        expected = own_paths(env)
        paths = cgroup_paths(sleeper.pid)
        assert {name: paths.get(name) for name in expected} == expected, paths
    finally:
        env.close()


def test_a_process_that_left_the_shell_is_killed_at_reset(mini_spec, tmp_path):
    """Unsandboxed, no PID namespace ends the shell's processes with it: a double-forked ``setsid`` sleeper outlives
    the shell, and only its cgroup still holds it. The reset kills it without waiting for it to exit, so it is
    given a moment to be reaped."""
    env = LocalBackend(mini_spec, sandbox="none", workspace_dir=str(tmp_path), seed=SEED)
    try:
        env.reset()
        if env._res.envelope is None:
            pytest.skip(f"no cgroups on this host: {env.notes}")
        output, _ = status(env, "(setsid sleep 300 >/dev/null 2>&1 &) ; echo started")
        assert "started" in output, output
        sleepers = wait_for_member(env, "sleep")
        env.reset()
        assert gone(sleepers), sleepers
    finally:
        env.close()


BUSY_STRATEGY = "def row_strategy(history):\n    while True:\n        pass\n"
SLEEPY_STRATEGY = "import time\n\n\ndef row_strategy(history):\n    time.sleep(3600)\n    return 0\n"


@pytest.mark.parametrize("strategy", [BUSY_STRATEGY, SLEEPY_STRATEGY], ids=["busy", "sleeping"])
def test_an_evaluation_that_uses_its_time_is_the_agents_failure(mini_spec, tmp_path, strategy):
    """Its own loops beside it, its code spinning or sleeping: the time ran out because of the agent, never the
    machine (an agent must not turn its failure into an ``infra_error``, which is not scored against it)."""
    env = open_backend(mini_spec.replace(training_timeout=3), workspace_dir=str(tmp_path), max_processes=128)
    try:
        write_file(env, "strategy.py", strategy)
        output, code = status(env, HOSTILE, timeout=60)
        assert code == 0, output
        assert len(wait_for_loops(env, LOOPS)) == LOOPS
        started = time.monotonic()
        observation, _, _, info = env.step("validate")
        took = time.monotonic() - started
        assert info["evaluation_status"] == "agent_error", observation
        assert "did not finish within 3 seconds" in observation, observation
        # its clock ran out before the backstop (how far before depends on the machine's load, not asserted)
        assert took < eval_clock.backstop(3), f"{took:.1f} s: its own loops' time was credited to it"
    finally:
        env.close()


def watched_clocks(monkeypatch) -> list[eval_clock.EvaluationClock]:
    """The evaluation clocks made from now on (each still the real clock), so that a failure can say what they read."""
    clocks: list[eval_clock.EvaluationClock] = []
    made = eval_clock.EvaluationClock.__post_init__

    def keep(clock: eval_clock.EvaluationClock) -> None:
        made(clock)
        clocks.append(clock)

    monkeypatch.setattr(eval_clock.EvaluationClock, "__post_init__", keep)
    return clocks


def clock_figures(clocks: list[eval_clock.EvaluationClock], evaluation: dict[str, float]) -> str:
    """What the last clock read: its stall, the CPU it counted, whether it could read the cgroup at all."""
    if not clocks:
        return "no evaluation clock was made"
    clock = clocks[-1]
    first = "none" if clock.first is None else "made"
    return (f"evaluation took {evaluation.get('took', float('nan')):.2f} s; its clock counted a stall of "
            f"{clock.stall:.2f} s and {clock.ran:.2f} s of CPU; first reading {first}")


def test_an_evaluation_the_machine_starves_is_an_infra_error(mini_spec, tmp_path, monkeypatch):
    """The host's squeeze (this env's CPU quota and weight lowered from the host: ``helpers.squeeze``) leaves an honest
    evaluation no CPU: at the wall-time backstop it is the machine's failure, not the agent's. The kernel starves it
    for real, and its clock reads the real counters; busy processes outside every env would add nothing to that but
    two cores' worth of CPU taken from the rest of the suite.

    The starvation starts once the agent's ``validate`` command has asked for the evaluation, so that what reaches the
    backstop is the evaluation (a starved command has a clock of its own: ``test_command_clock.py``)."""
    monkeypatch.setattr(eval_clock, "BACKSTOP_EXTRA", 0.0)  # a backstop of 4 x 2 s, not 4 x 2 + 60 s
    env = open_backend(mini_spec.replace(training_timeout=2), workspace_dir=str(tmp_path))
    evaluation: dict[str, float] = {}
    evaluate = env._evaluate
    clocks = watched_clocks(monkeypatch)

    def starved_evaluate(info, action):
        # the evaluation cannot get the CPU it needs (about 0.2 s) before the backstop
        squeeze(env)
        started = time.monotonic()
        try:
            return evaluate(info, action)
        finally:
            evaluation["took"] = time.monotonic() - started

    try:
        envelope = env._res.envelope
        if envelope is None or not envelope.weighted:
            pytest.skip(f"needs a CPU weight of the env's own on this host: {env.notes}")
        monkeypatch.setattr(env, "_evaluate", starved_evaluate)
        observation, _, _, info = env.step("validate")
        figures = clock_figures(clocks, evaluation)  # read on every run, so that a failure can always say them
        assert info["evaluation_status"] == "infra_error", f"{observation} ({figures})"
        assert "the machine's load, not the submission's fault" in observation, observation
        took = evaluation["took"]
        assert eval_clock.backstop(2) <= took < eval_clock.backstop(2) + 30, took  # stopping starved processes
    finally:
        env.close()


def test_without_cgroups_the_fallback_is_announced_and_timed(mini_spec, tmp_path, monkeypatch):
    """A host with no cgroup hierarchy this process may use (as ``cgroups.hierarchies`` finds none): the env says
    so in a warning and its notes, still scores, and still times its evaluations by its processes' own accounting."""
    monkeypatch.setattr(cgroups, "hierarchies", lambda: ())
    cgroups.warn_no_envelope.cache_clear()
    with pytest.warns(RuntimeWarning, match="no CPU cgroup could be made"):
        env = open_backend(mini_spec.replace(training_timeout=3), workspace_dir=str(tmp_path))
    try:
        assert env._res.envelope is None
        assert cgroups.NO_CPU_ENVELOPE in env.notes
        _, score = validate(env)
        assert score is not None and "Score" in score, score
        write_file(env, "strategy.py", SLEEPY_STRATEGY)
        observation, _, _, info = env.step("validate")
        assert info["evaluation_status"] == "agent_error", observation
        assert "did not finish within 3 seconds" in observation, observation
    finally:
        env.close()
