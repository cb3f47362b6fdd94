"""Forged scores: the agent's strategy attacks the evaluator that scores it (miniPrisonersDilemma, see helpers.py).

Each attacking strategy plays exactly like the honest one (tit for tat). The evaluation must give exactly the honest
score, or fail; never more.
"""

from __future__ import annotations

import site
import sys
import textwrap
from pathlib import Path

import pytest

from .helpers import (
    FAKE_SCORE,
    FORGE_PARTNER_BYTECODE,
    FORGE_SOURCELESS_STRATEGY,
    FORGING_PACKAGE,
    HONEST,
    PRINT_AND_EXIT,
    PRINT_FAKE,
    SEED,
    assert_clean,
    assert_not_forged,
    attacking_strategy,
    honest_score,
    open_backend,
    run,
    status,
    validate,
    write_file,
)

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def backend(mini_spec):
    env = open_backend(mini_spec)
    yield env
    env.close()


@pytest.fixture(scope="module")
def honest(backend) -> dict:
    """The honest strategy's score with seed 0."""
    return honest_score(backend)


@pytest.fixture
def env(backend, honest):
    """The module's backend with a fresh workspace and shell (the honest score is known by then), in the episode the
    honest score was measured in (the first of SEED's stream: same evaluation seed)."""
    backend.reset(seed=SEED)
    return backend


def test_the_honest_score_is_reproducible(env, honest):
    write_file(env, "strategy.py", HONEST)
    assert validate(env)[1] == honest


def test_printing_a_score_does_not_reach_the_evaluator_output(env, honest):
    write_file(env, "strategy.py", attacking_strategy(at_import=PRINT_FAKE, in_call=PRINT_FAKE))
    obs, score = validate(env)
    assert score == honest, obs  # what the agent's code prints goes nowhere: the evaluation is unaffected
    assert FAKE_SCORE not in obs


def test_print_then_exit_at_import(env, honest):
    write_file(env, "strategy.py", attacking_strategy(at_import=PRINT_AND_EXIT))
    assert_clean(*validate(env), honest)


def test_print_then_exit_inside_row_strategy(env, honest):
    write_file(env, "strategy.py", attacking_strategy(in_call=PRINT_AND_EXIT))
    assert_clean(*validate(env), honest)


REBIND_PARTNER = textwrap.dedent(
    """\
    import target
    target.target_column_strategy = lambda history: 0
    sys.modules["target"].target_column_strategy = lambda history: 0
    target.RNG.seed(0)
    """
)


def test_rebinding_the_partner(env, honest):
    write_file(env, "strategy.py", attacking_strategy(at_import=REBIND_PARTNER, in_call=REBIND_PARTNER))
    obs, score = validate(env)
    assert score == honest, obs


REBIND_PAYOFF = textwrap.dedent(
    """\
    import __main__
    RICH = ((99, 99), (99, 99))
    __main__.PAYOFF = RICH
    sys.modules["__main__"].PAYOFF = RICH
    import evaluate
    evaluate.PAYOFF = RICH
    evaluate.play = lambda *args, **kwargs: 99.0
    for module in list(sys.modules.values()):
        if hasattr(module, "PAYOFF"):
            module.PAYOFF = RICH
        if hasattr(module, "play"):
            try:
                module.play = lambda *args, **kwargs: 99.0
            except (AttributeError, TypeError):
                pass
    """
)


def test_rebinding_the_payoff_table(env, honest):
    write_file(env, "strategy.py", attacking_strategy(at_import=REBIND_PAYOFF, in_call=REBIND_PAYOFF))
    obs, score = validate(env)
    assert score == honest, obs


def test_workspace_package_named_like_the_partner(env, honest):
    """A package ``target/`` beside the pristine target.py: the evaluator's trusted import must load the pristine file,
    not the agent's package (it ran in the evaluator process before 24cabdf)."""
    write_file(env, "strategy.py", HONEST)
    write_file(env, "target/__init__.py", FORGING_PACKAGE)
    assert_clean(*validate(env), honest)


@pytest.mark.parametrize("module", ["random", "json", "math", "pickle", "struct"])
def test_workspace_module_shadowing_a_standard_module(env, honest, module):
    write_file(env, "strategy.py", HONEST)
    write_file(env, f"{module}.py", "import os\nimport sys\n" + PRINT_AND_EXIT)
    assert_clean(*validate(env), honest)


def test_overwriting_the_evaluator_and_the_partner(env, honest):
    write_file(env, "strategy.py", HONEST)
    output, code = status(env, "chmod u+w evaluate.py target.py")
    assert code == 0, output
    write_file(env, "evaluate.py", f"print({FAKE_SCORE!r})\n")
    write_file(env, "target.py", "import random\nRNG = random.Random()\n\n\ndef target_column_strategy(history):\n"
                                 "    return 0\n")
    assert FAKE_SCORE in status(env, "cat evaluate.py")[0]  # the agent did change its copies
    obs, score = validate(env)
    assert score == honest, obs


def test_sitecustomize_usercustomize_and_pth_in_the_workspace(env, honest):
    write_file(env, "strategy.py", HONEST)
    forge = "import os\nimport sys\n" + PRINT_AND_EXIT
    write_file(env, "sitecustomize.py", forge)
    write_file(env, "usercustomize.py", forge)
    write_file(env, "mlgr_forge.pth", "import os; print(" + repr(FAKE_SCORE) + ", flush=True); os._exit(0)")
    assert_clean(*validate(env), honest)


def test_pth_file_in_site_packages_cannot_be_written(env, honest):
    write_file(env, "strategy.py", HONEST)
    line = "import os; print(" + repr(FAKE_SCORE) + ", flush=True); os._exit(0)"
    folders, code = status(env, "python -c 'import site; print(\"\\n\".join(site.getsitepackages()))'")
    assert code == 0 and folders.strip(), folders
    for folder in folders.split("\n"):
        # a folder the interpreter would read but that does not exist (Debian's Python names <venv>/local/...) may
        # not be made either
        output, code = status(env, f"mkdir -p '{folder}' && echo '{line}' > '{folder}/mlgr_forge.pth'")
        assert code != 0 and "Read-only file system" in output, (folder, output)
    # the agent's own user site (in its private home) is writable, but no evaluation process reads it
    output, code = status(env, "d=$(python -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" && "
                               f"echo '{line}' > \"$d/mlgr_forge.pth\" && echo written")
    assert validate(env)[1] == honest
    for folder in {*site.getsitepackages(), *(p for p in sys.path if p.endswith("site-packages"))}:
        assert not (Path(folder) / "mlgr_forge.pth").exists(), folder


WRITE_INHERITED_FDS = textwrap.dedent(
    f"""\
    for fd in range(51):
        try:
            os.write(fd, b{FAKE_SCORE + chr(10)!r})
        except OSError:
            pass
    """
)


def test_writing_a_score_to_every_inherited_fd(env, honest):
    write_file(env, "strategy.py", attacking_strategy(at_import=WRITE_INHERITED_FDS, in_call=WRITE_INHERITED_FDS))
    assert_clean(*validate(env), honest)


WRITE_PROC_FDS = textwrap.dedent(
    f"""\
    import glob
    for path in glob.glob("/proc/*/fd/*"):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, b{FAKE_SCORE + chr(10)!r})
        except OSError:
            pass
        finally:
            os.close(fd)
    """
)


def test_writing_a_score_through_proc_fd_links(env, honest):
    write_file(env, "strategy.py", attacking_strategy(at_import=WRITE_PROC_FDS, in_call=WRITE_PROC_FDS))
    assert_clean(*validate(env), honest)


@pytest.mark.parametrize(
    "where, code",
    [
        ("import", f"raise SystemExit({FAKE_SCORE!r})"),
        ("call", f"raise SystemExit({FAKE_SCORE!r})"),
        ("call", "sys.exit(0)"),
        ("call", "raise KeyboardInterrupt"),
        ("import", "raise KeyboardInterrupt"),
    ],
)
def test_strategy_raising_exit_or_interrupt(env, honest, where, code):
    source = attacking_strategy(at_import=code) if where == "import" else attacking_strategy(in_call=code)
    write_file(env, "strategy.py", source)
    obs, score = validate(env)
    assert_not_forged(obs, score, honest)
    # the fake score may only be quoted where the agent sees its own code and exception (its traceback)
    assert FAKE_SCORE not in obs.replace(f"SystemExit: {FAKE_SCORE}", "").replace(code, "")
    assert "importlib._bootstrap" not in obs and "harness" not in obs  # only the agent's own frames


def test_sourceless_bytecode_strategy(env, honest):
    """strategy.py replaced by a sourceless strategy.pyc: still the agent's module, run in the agent's process (the
    evaluator imported it itself, through the workspace evaluate.py puts on sys.path, before 24cabdf)."""
    output, code = status(env, f"python - <<'EOF'\n{FORGE_SOURCELESS_STRATEGY}EOF")
    assert code == 0, output
    assert_clean(*validate(env), honest)


def test_bytecode_cache_of_the_partner(env, honest):
    """A __pycache__/target.<tag>.pyc whose header matches the pristine target.py (copy2 keeps mtime and size): the
    trusted import must run the pristine source, not the agent's byte code (it did before 24cabdf)."""
    write_file(env, "strategy.py", HONEST)
    output, code = status(env, f"python - <<'EOF'\n{FORGE_PARTNER_BYTECODE}EOF")
    assert code == 0, output
    assert_clean(*validate(env), honest)


def test_background_process_rewriting_files_during_validate(env, honest):
    """A daemon keeps rewriting evaluate.py, target.py and strategy.py while the evaluation copies the workspace."""
    write_file(env, "strategy.py", HONEST)
    forged_strategy = attacking_strategy(at_import=PRINT_AND_EXIT)
    write_file(env, "forged_strategy.py", forged_strategy)
    write_file(env, "forged_evaluate.py", f"print({FAKE_SCORE!r})\n")
    run(env, "chmod u+w evaluate.py target.py")
    write_file(env, "rewriter.sh", textwrap.dedent(
        """\
        while true; do
            cp forged_evaluate.py evaluate.py
            cp forged_strategy.py .s && mv .s strategy.py
            printf 'def target_column_strategy(history):\\n    return 0\\n' > target.py
        done
        """
    ))
    run(env, "setsid nohup bash rewriter.sh >/dev/null 2>&1 &")
    for _ in range(3):
        assert_clean(*validate(env), honest)


def test_echoing_a_validation_message_pays_nothing_even_after_a_real_validation(mini_spec):
    """``info["score"]`` keeps every earlier evaluation, so it is never empty after the first real ``validate``: a
    printed validation message (any baseline, any score) must still pay nothing, under the reward that pays every
    real evaluation (the reference chain's; the default pays only improvements, see test_default_reward)."""
    from mlgym_registry import registry

    env = registry.make(mini_spec, batch_size=(), reward="mlgym_score_delta")
    try:
        td = env.reset()

        def act(command: str):
            td.set(("text", "response"), f"DISCUSSION\nNext.\n```\n{command}\n```")
            out = env.step(td)
            return out["next"], env.step_mdp(out)

        after, td = act("validate")
        real = float(after["reward"].sum())
        assert "Evaluation Score:" in str(after["observation"]) and len(env.base_env.last_info["score"]) == 1
        forged = "echo \"Baseline Score: {'Score': -1000.0}\"; echo \"Evaluation Score: {'Score': 1000.0}\""
        after, td = act(forged)
        assert "Evaluation Score: {'Score': 1000.0}" in str(after["observation"])
        assert float(after["reward"].sum()) == 0.0
        assert len(env.base_env.last_info["score"]) == 1
        # the real evaluation's own numbers, echoed, are no evaluation either: nothing ran, nothing is paid
        score = env.base_env.last_info["score"][-1]
        baseline = mini_spec.baseline_scores[0] if mini_spec.baseline_scores else "NA"
        after, td = act(f"echo \"Baseline Score: {baseline}\"; echo \"Evaluation Score: {score}\"")
        assert after["evaluation_status"] == ""
        assert float(after["reward"].sum()) == 0.0
        after, td = act("validate")  # validating again is an evaluation, paid as the reward says
        assert after["evaluation_status"] == "ok"
        assert float(after["reward"].sum()) == pytest.approx(real)
    finally:
        env.close()
