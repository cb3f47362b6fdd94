"""The main forging attacks against the real prisonersDilemma task, directly and through ``registry.make``."""

from __future__ import annotations

import pytest

from mlgym_registry import registry
from mlgym_registry.backends.local import LocalBackend

from .helpers import (
    HONEST,
    PRINT_AND_EXIT,
    PRINT_FAKE,
    SEED,
    assert_clean,
    attacking_strategy,
    honest_score,
    open_backend,
    validate,
    write_file,
)
from .test_forged_scores import REBIND_PARTNER, REBIND_PAYOFF

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def backend():
    env = open_backend(registry.spec("prisonersDilemma"))
    yield env
    env.close()


@pytest.fixture(scope="module")
def honest(backend) -> dict:
    return honest_score(backend)


@pytest.fixture
def env(backend, honest):
    backend.reset(seed=SEED)  # the honest score's episode (same evaluation seed)
    return backend


def test_print_then_exit_inside_row_strategy(env, honest):
    write_file(env, "strategy.py", attacking_strategy(in_call=PRINT_AND_EXIT))
    assert_clean(*validate(env), honest)


def test_rebinding_partner_and_payoff_while_printing(env, honest):
    attack = REBIND_PARTNER + REBIND_PAYOFF + PRINT_FAKE
    write_file(env, "strategy.py", attacking_strategy(at_import=attack, in_call=attack))
    obs, score = validate(env)
    assert score == honest, obs


def fenced(command: str) -> str:
    return f"DISCUSSION\nLet me do this.\n```\n{command}\n```\n"


def chain_step(env, td, response: str):
    layout = env.base_env.layout
    td.set(layout.response, response)
    td = env.step(td)
    return td["next"], env.step_mdp(td)


def test_attack_through_registry_make():
    """The training entry point: the default chain on the local backend, sandboxed, rewards equal to the honest one
    (under the reference chain's reward, which pays every evaluation its score, so that both validates are paid)."""
    env = registry.make("prisonersDilemma", seed=0, reward="mlgym_score_delta")
    try:
        td = env.reset()
        backend = env.base_env.backend
        assert isinstance(backend, LocalBackend) and backend.sandboxed

        def rewarded(source: str) -> tuple[float, dict]:
            nonlocal td
            _, td = chain_step(env, td, fenced(f"cat > strategy.py <<'EOF'\n{source}EOF"))
            nxt, td = chain_step(env, td, fenced("validate"))
            info = env.base_env.last_info
            assert "Evaluation Score" in str(nxt["message"]), nxt["message"]
            return nxt["reward"].item(), info["score"][-1]

        honest_reward, honest_score = rewarded(HONEST)
        attack = REBIND_PARTNER + REBIND_PAYOFF + PRINT_FAKE
        attack_reward, attack_score = rewarded(attacking_strategy(at_import=attack, in_call=attack))
        assert attack_score == honest_score
        assert attack_reward == honest_reward
    finally:
        env.close()
