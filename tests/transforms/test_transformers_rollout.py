"""A real rollout: TorchRL's ``TransformersWrapper`` over a tiny random model drives the chain.

The tokenizer is built in code and the model from a config with random weights: nothing is downloaded. The model
writes garbage, so every step is a format error: retry, penalty, the backend is never stepped, nothing crashes.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from standin import registered_standin  # noqa: E402
from torchrl.modules.llm import TransformersWrapper  # noqa: E402

from mlgym_registry import TaskSpec, registry  # noqa: E402
from mlgym_registry.testing.tiny_model import tiny_model, tiny_tokenizer  # noqa: E402

PENALTY = -1.0


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)  # the sampled garbage is the same every run
    return tiny_model(tokenizer)


@pytest.fixture
def standin_backend():
    with registered_standin("standin_rollout") as backends:
        yield backends


SPEC = TaskSpec(id="tinyTask", description="Improve the strategy.", baseline_scores=[{"Score": 1.0}], max_steps=20)


@pytest.mark.parametrize("input_mode", ["history", "text", "tokens"])
def test_rollout_with_transformers_wrapper(tokenizer, model, standin_backend, input_mode):
    # max_format_errors=None: garbage never ends the episode here (test_training_shapes.py checks the rule)
    env = registry.make(SPEC, backend="standin_rollout", tokenizer=tokenizer, reward_wrong_format=PENALTY,
                        input_mode=input_mode, max_format_errors=None)
    policy = TransformersWrapper(
        model,
        tokenizer=tokenizer,
        input_mode=input_mode,
        generate=True,
        generate_kwargs={"max_new_tokens": 12, "do_sample": True},
        chat_template_name="chatml_format",
    )
    try:
        steps = 3
        rollout = env.rollout(steps, policy)
        assert rollout.batch_size == (1, steps)  # TorchRL's ChatEnv shape: one env, then time
        # garbage in: every step is a retry with the penalty, and the backend never ran anything
        assert rollout["next", "retry"].all()
        assert torch.equal(rollout["next", "reward"], torch.full((1, steps, 1, 1), PENALTY))
        assert not rollout["next", "done"].any()
        backend = standin_backend[-1]
        assert backend.actions == []
        # the conversation goes on: assistant turn + format-error message each step
        last = rollout[0, -1]["next", "history", "prompt"]
        assert last.shape[0] == 2 + 2 * steps
        assert last.role[-2:] == ["assistant", "user"]
        assert "could not be used" in last.content[-1]
        # the text prompt is what the tokenizer's template renders from that history
        expected = tokenizer.apply_chat_template(
            [{"role": r, "content": c} for r, c in zip(last.role, last.content, strict=True)],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert rollout[0, -1]["next", "text", "prompt"] == expected
    finally:
        env.close()
    assert backend.closed


def test_tokenizer_from_a_local_path(tmp_path, tokenizer, standin_backend):
    tokenizer.save_pretrained(tmp_path / "tok")
    env = registry.make(SPEC, backend="standin_rollout", tokenizer=str(tmp_path / "tok"))
    try:
        td = env.reset()
        assert td["text", "prompt"].startswith("<|im_start|>system\n")
        assert td["text", "prompt"].endswith("<|im_start|>assistant\n")
    finally:
        env.close()
