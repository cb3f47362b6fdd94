"""Helpers of the red-team suite: an adversarial agent against the local backend's sandbox and evaluator.

Every attack runs as the agent would run it: as a command in the env's bash session (``env.step``), or as code of
the agent's that the evaluator imports. What counts is checked from the host: the score against the honest score of
the same strategy, files on the host, host processes, the driver's variables.

The forged-score tests mostly use ``miniPrisonersDilemma``: the package's own prisonersDilemma files (evaluator,
partner, starter strategy) with fewer games, so that one ``validate`` takes a fraction of a second instead of ~3 s;
the main attacks are repeated on the real task.
"""

from __future__ import annotations

import os
import secrets
import textwrap
from pathlib import Path

import mlgym_registry
from mlgym_registry import registry
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.specs import TaskSpec

PACKAGE_DIR = Path(mlgym_registry.__file__).resolve().parent
PACKAGE_TASK_DATA = PACKAGE_DIR / "tasks" / "data"
PD_FILES = ("target.py", "evaluate.py", "strategy.py")
MINI_GAMES = 300

FAKE_SCORE = '{"Score": 99.0}'
"""What a forging agent prints; no strategy can honestly score above 5 at the Prisoner's Dilemma."""

HONEST = textwrap.dedent(
    """\
    def row_strategy(history):
        \"\"\"Tit for tat: deterministic, so its score depends only on the evaluator's seed.\"\"\"
        if not history:
            return 0
        return history[-1][1]
    """
)

SECRET_VARIABLES = {
    "MLGR_TEST_SECRET": "mlgr-test-secret-" + secrets.token_hex(8),
    "OPENAI_API_KEY": "sk-mlgr-test-" + secrets.token_hex(12),
}
"""Set in the driver's (this process's) environment for the whole suite, before any backend is made."""


def mini_prisoners_spec(folder: Path, games: int = MINI_GAMES) -> TaskSpec:
    """The package's prisonersDilemma task with its files copied into ``folder`` and ``games`` games per evaluation."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PD_FILES:
        text = (PACKAGE_TASK_DATA / "prisonersDilemma" / name).read_text()
        if name == "evaluate.py":
            assert "GAMES = 10_000\n" in text, "the prisonersDilemma evaluator changed: update mini_prisoners_spec"
            text = text.replace("GAMES = 10_000\n", f"GAMES = {games}\n")
        (folder / name).write_text(text)
    real = registry.spec("prisonersDilemma")
    return real.replace(
        id="miniPrisonersDilemma", root=str(folder), starter_code=list(PD_FILES), max_steps=100_000,
        training_timeout=120,
    )


SEED = 0
"""The suite's seed. Episodes of one seed's stream differ, so a score is compared with one from the same episode, or
from an episode reset with ``reset(seed=SEED)`` (see ``honest_score``)."""


FORKED_VARIABLE = "MLGR_SECURITY_FORKED"
"""Set to 1 to play the whole suite on forked envs: ``open_backend`` then returns the child of a fork whose parent it
closed at once (the child stands alone on the frozen layer), so that every attack runs on a fork as on a fresh env.
The child is one made ahead (``prepare_forks``: a sandbox started before the layers existed, which sees its view
mounted later), as every fork after an env's first takes."""


def open_backend(spec: TaskSpec, **options) -> LocalBackend:
    """A sandboxed backend (the default), reset and with its tools, seeded so that scores are reproducible; with
    ``MLGR_SECURITY_FORKED=1``, a fork's child in that state (``FORKED_VARIABLE``)."""
    options.setdefault("seed", SEED)
    env = LocalBackend(spec, **options)
    try:
        assert env.sandboxed, "the local backend must sandbox by default"
        env.reset()
        env.install_tools()
        if os.environ.get(FORKED_VARIABLE) == "1":
            assert env.prepare_forks(1, wait=True) == 1, "no child could be made ahead"
            parent, (env,) = env, env.fork(1)
            parent.close()
    except BaseException:
        env.close()
        raise
    return env


def run(env: LocalBackend, command: str) -> str:
    """Run one agent action; its observation."""
    obs, _, _, _ = env.step(command)
    return obs or ""


def status(env: LocalBackend, command: str, timeout: float = 60) -> tuple[str, int | None]:
    """Run one command in the agent's shell: ``(output, exit status)``."""
    output = env.communicate(command, timeout_duration=timeout)
    return output, env.returncode


def write_file(env: LocalBackend, relative: str, text: str) -> None:
    """Write a workspace file from inside the sandbox, as the agent does (a here-document)."""
    end = "MLGR_EOF_" + secrets.token_hex(4)
    body = text if text.endswith("\n") else text + "\n"
    output, code = status(env, f"mkdir -p \"$(dirname '{relative}')\" && cat > '{relative}' <<'{end}'\n{body}{end}")
    assert code == 0, output


def validate(env: LocalBackend) -> tuple[str, dict | None]:
    """``validate`` as the agent calls it: ``(observation, new score or None when the evaluation failed)``."""
    before = len(env._scores)
    obs, _, _, info = env.step("validate")
    score = info["score"][-1] if len(info["score"]) > before else None
    if score is not None:
        assert "Evaluation Score" in obs, obs
    return obs, score


def assert_not_forged(obs: str, score: dict | None, honest: dict) -> None:
    """The attack either made the evaluation fail or scored exactly what the honest strategy scores."""
    if score is None:
        assert "Evaluation Score" not in obs, obs
        return
    assert score == honest, f"forged score {score} (honest {honest}); observation:\n{obs}"


def assert_output_not_reached(obs: str) -> None:
    """What the agent's code printed is not in the evaluator's output (the observation of ``validate``)."""
    assert FAKE_SCORE not in obs, f"the agent's code printed into the evaluator's output:\n{obs}"


# -- attack code ------------------------------------------------------------------------------------------------------
PRINT_FAKE = textwrap.dedent(
    f"""\
    print({FAKE_SCORE!r}, flush=True)
    sys.stderr.write({FAKE_SCORE!r} + "\\n")
    sys.stderr.flush()
    """
)
"""Agent code that prints a fake score to stdout and stderr."""

PRINT_AND_EXIT = f"print({FAKE_SCORE!r}, flush=True)\nos._exit(0)\n"
"""Agent code that prints a fake score (stdout only: the evaluator's output must be exactly one JSON value) and ends
its process at once, as if the evaluator had finished."""


def attacking_strategy(at_import: str = "", in_call: str = "") -> str:
    """A strategy that plays like ``HONEST`` but runs ``at_import`` when imported and ``in_call`` on its first call
    (once per process: the evaluator calls it ~100,000 times)."""
    call = ""
    if in_call.strip():
        call = "    global _ATTACKED\n    if not _ATTACKED:\n        _ATTACKED = True\n"
        call += textwrap.indent(textwrap.dedent(in_call), "        ")
    return (
        "import os\nimport sys\n\n_ATTACKED = False\n" + textwrap.dedent(at_import) + "\n\n"
        "def row_strategy(history):\n" + call + "    if not history:\n        return 0\n    return history[-1][1]\n"
    )


COOPERATIVE_PARTNER = textwrap.dedent(
    """\
    import random

    RNG = random.Random()


    def target_column_strategy(history):
        return 0
    """
)
"""A partner that always cooperates: against it tit for tat scores 3.0, more than against the real pool."""

FORGE_PARTNER_BYTECODE = textwrap.dedent(
    f"""\
    # write __pycache__/target.<tag>.pyc whose header matches the read-only target.py (mtime and size), so that an
    # import of `target` that consults the bytecode cache runs this code instead of the file's
    import importlib._bootstrap_external as external, os, sys
    source = os.path.abspath("target.py")
    info = os.stat(source)
    code = compile({COOPERATIVE_PARTNER!r}, source, "exec")
    os.makedirs("__pycache__", exist_ok=True)
    path = os.path.join("__pycache__", "target." + sys.implementation.cache_tag + ".pyc")
    with open(path, "wb") as handle:
        handle.write(external._code_to_timestamp_pyc(code, int(info.st_mtime), info.st_size))
    print("wrote", path)
    """
)

FORGE_SOURCELESS_STRATEGY = textwrap.dedent(
    f"""\
    # replace strategy.py by strategy.pyc (bytecode without source), which Python imports from a folder on sys.path
    import os, py_compile
    with open("/tmp/forge.py", "w") as handle:
        handle.write("import os, sys\\n" + {PRINT_AND_EXIT!r})
    py_compile.compile("/tmp/forge.py", cfile="strategy.pyc", doraise=True)
    os.remove("strategy.py")
    print("wrote strategy.pyc")
    """
)

FORGING_PACKAGE = "import os\nimport sys\n" + PRINT_AND_EXIT
"""``target/__init__.py`` of a workspace package named like the protected partner module."""


def assert_clean(obs: str, score: dict | None, honest: dict) -> None:
    """``assert_not_forged`` and ``assert_output_not_reached``: for attacks whose code prints a fake score."""
    assert_output_not_reached(obs)
    assert_not_forged(obs, score, honest)


AGENT_SCRIPTS = Path(__file__).parent / "agent_scripts"


def upload(env: LocalBackend, name: str) -> str:
    """Put ``agent_scripts/NAME`` into the workspace as the agent would write it; its path as the agent sees it."""
    write_file(env, name, (AGENT_SCRIPTS / name).read_text())
    return f"{env.task_workspace}/{name}"


def honest_score(env: LocalBackend) -> dict:
    """The honest prisonersDilemma strategy's score on a fresh workspace (the figure forged scores are judged by), in
    the first episode of ``SEED``'s stream: compare it with scores of episodes reset with ``reset(seed=SEED)``."""
    env.reset(seed=SEED)
    write_file(env, "strategy.py", HONEST)
    obs, score = validate(env)
    assert score is not None, obs
    assert set(score) == {"Score"} and 0 < score["Score"] < 5, score
    return score


def foreign_inputs(env: LocalBackend) -> list[str]:
    """Run a traced ``validate`` (it must score) and return what its evaluator opened or listed that is neither the
    task's own nor the declared submission (``LocalBackend.foreign_inputs``): [] for an evaluation that reads only
    what it should."""
    env.trace_evaluations = True
    try:
        obs, score = validate(env)
    finally:
        env.trace_evaluations = False
    assert score is not None, obs
    opened = env.last_evaluation_trace.get("opened", [])
    assert any(path.startswith(str(env.task_workspace)) for path in opened), f"the trace saw no workspace: {opened}"
    return env.foreign_inputs(opened)


STARVED_QUOTA_US = 1000
"""The CPU quota a starved env is left, per period (the kernel's smallest: 1% of a core)."""

CFS_PERIOD_US = 100_000
"""The period of that quota (the kernel's default)."""


def squeeze(env: LocalBackend, quota_us: int = STARVED_QUOTA_US, *, lowest_weight: bool = True) -> None:
    """The host's squeeze on ``env``: a quota of ``quota_us`` per period on its cgroup (default 1% of a core) and the
    lowest CPU weight, so that what ``env`` runs gets almost no CPU whatever else the machine runs (the weight alone
    let an evaluation through once, at load 20: 0.19 s of CPU in 7.1 s). Skips the test where the env has no CPU
    weight of its own."""
    import pytest

    envelope = env._res.envelope
    if envelope is None or not envelope.weighted:
        pytest.skip(f"needs a CPU weight of the env's own on this host: {env.notes}")
    if "cpu" in envelope.roots:
        if lowest_weight:
            (envelope.roots["cpu"] / "cpu.shares").write_text("2")
        (envelope.roots["cpu"] / "cpu.cfs_quota_us").write_text(str(quota_us))
    else:
        if lowest_weight:
            (envelope.roots["unified"] / "cpu.weight").write_text("1")
        (envelope.roots["unified"] / "cpu.max").write_text(f"{quota_us} {CFS_PERIOD_US}")

