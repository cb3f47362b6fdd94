"""``ChainEnv`` hands its outputs to whoever drives it in the form that driver asked for (``hand_outputs_to``), told
once: only the outermost call's outputs, never the calls the env makes of itself, and nothing when nobody asked."""

from __future__ import annotations

from tensordict import TensorDict

from mlgym_registry import registry

TASK = "prisonersDilemma"
COMMAND = "DISCUSSION\nLook around.\n```\nls\n```"


def test_an_env_nobody_drives_returns_the_chains_own_outputs():
    with registry.make(TASK, max_turns=2) as env:
        td = env.reset()
        assert type(td) is TensorDict
        td["text", "response"] = COMMAND
        out, following = env.step_and_maybe_reset(td)
        assert type(out) is TensorDict and type(following) is TensorDict


def test_only_the_outermost_calls_outputs_pass_through_the_drivers_adapter():
    handed = []

    def adapter(output, env):
        handed.append(output)
        return output

    with registry.make(TASK, max_turns=1) as env:
        env.hand_outputs_to(adapter)
        td = env.reset()
        assert len(handed) == 1 and handed[0] is td
        td["text", "response"] = COMMAND
        out, following = env.step_and_maybe_reset(td)  # a step, then a reset (the episode ended): both inside
        assert len(handed) == 3 and handed[1] is out and handed[2] is following
        env.hand_outputs_to(None)
        env.reset()
        assert len(handed) == 3
