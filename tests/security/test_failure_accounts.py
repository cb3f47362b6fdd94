"""Whose failure it is comes from the env's own accounts, never from a clock or a resource the agent can inflate.

- The evaluation clock: a herd of the agent's sleepers (processes or threads of its code) waking together makes their
  run-queue waits overlap, far past the wall clock, while they use almost no CPU. A blocking strategy beside such a
  herd must still end as the agent's failure (``agent_error``, the floor) at its time limit, not hours later as an
  ``infra_error`` (which is never paid and so worth more than the floor).
- The disk: an env over its fair share of a disk it shares with others owns a full-disk failure; an env within it
  does not, and a quota the disk cannot hold is lowered at ``make`` with a warning.

Judged from the host: the evaluation's status, and how long the step took.
"""

from __future__ import annotations

import time

import pytest

from mlgym_registry.backends.local import eval_clock

from .helpers import attacking_strategy, open_backend, write_file

pytestmark = pytest.mark.security

HERDS = {
    # 300 processes (each a fork of the agent's code) that sleep and wake together every 0.3 s
    "processes": """\
        import time
        for _ in range(300):
            if os.fork() == 0:
                while True:
                    time.sleep(0.3 - time.time() % 0.3)
        """,
    # the same herd as threads of the agent's code's own process
    "threads": """\
        import threading, time
        def _sleeper():
            while True:
                time.sleep(0.3 - time.time() % 0.3)
        for _ in range(300):
            threading.Thread(target=_sleeper, daemon=True).start()
        """,
}

BLOCK = "import time\ntime.sleep(100000)\n"


@pytest.mark.parametrize("herd", sorted(HERDS))
def test_a_herd_of_sleepers_cannot_buy_an_infra_error(mini_spec, tmp_path, herd):
    timeout = 5
    env = open_backend(mini_spec.replace(training_timeout=timeout), workspace_dir=str(tmp_path), max_processes=1024)
    try:
        write_file(env, "strategy.py", attacking_strategy(at_import=HERDS[herd], in_call=BLOCK))
        started = time.monotonic()
        observation, _, _, info = env.step("validate")
        took = time.monotonic() - started
        assert info["evaluation_status"] == "agent_error", observation
        assert f"did not finish within {timeout} seconds" in observation, observation
        # its clock ran out before the wall-time backstop (4 x 5 + 60 s): the herd's waits were not counted as a stall
        # (how far before depends on the machine's load, whose waits are a stall: no wall time is asserted)
        assert took < eval_clock.backstop(timeout), f"{took:.1f} s: the herd's waits were counted as a stall"
    finally:
        env.close()


# -- the disk ---------------------------------------------------------------------------------------------------------
FILL = ("python -c \"\nimport itertools\ntry:\n    for i in itertools.count():\n        open(f'f{i}.bin', 'wb')"
        ".write(b'x' * (4 << 20))\nexcept OSError:\n    pass\n\" 2>&1 | tail -1")
POOR = "def row_strategy(history):\n    return 0\n"


def validate_status(env) -> tuple[str, str]:
    observation, _, _, info = env.step("validate")
    return observation or "", info.get("evaluation_status", "")


def test_the_env_over_its_fair_share_owns_a_full_shared_disk(mini_spec, small_disk, tmp_path):
    """Two envs share a 96 MB disk, each with the default quota (10 GB, far more than the disk): each is admitted
    with its fair share at most, and when one fills the disk, its own evaluation is its failure and its
    neighbour's is the host's (never paid), not both the host's."""
    with pytest.warns(RuntimeWarning, match="lowered from 10240 to"):
        filler = open_backend(mini_spec, workspace_dir=str(small_disk))
    neighbour = open_backend(mini_spec, workspace_dir=str(small_disk))
    try:
        # the first env's quota is the whole disk until the second comes, then both have half of it
        assert filler._disk.limit_mb <= 48 and neighbour._disk.limit_mb <= 48
        write_file(filler, "strategy.py", POOR)
        filler.communicate(FILL, timeout_duration=120)
        observation, state = validate_status(filler)
        assert state in ("invalid_submission", "agent_error"), observation  # its failure: the floor
        # never charged to the honest neighbour: scored when the disk guard stopped the filler at its share in time,
        # else the host's failure (the disk is full), never paid
        observation, state = validate_status(neighbour)
        assert state in ("ok", "infra_error"), observation
    finally:
        filler.close()
        neighbour.close()


def test_an_env_the_disk_has_no_room_for_is_refused_at_make(mini_spec, small_disk):
    from mlgym_registry.backends.local.quota import MIN_SHARE_MB, DiskShareTooSmall

    hog = small_disk / "someone-elses.bin"
    with open(hog, "wb") as handle:
        handle.write(b"\1" * ((96 - MIN_SHARE_MB // 2) << 20))
    with pytest.raises(DiskShareTooSmall, match="MB an env needs at least"):
        open_backend(mini_spec, workspace_dir=str(small_disk))
    assert not [p for p in small_disk.iterdir() if p.name.startswith("mlgym-registry-")]
