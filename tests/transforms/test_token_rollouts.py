"""Token-faithful rollouts and the context policy, through ``registry.make`` and TorchRL's ``TransformersWrapper``.

Per turn the tensordict and the ``.traj`` hold the prompt's and the response's token ids, the log-probs the policy
gave and a policy version; a reply cut by ``max_new_tokens`` (``length``) and a conversation over its budget
(``overflow``) are recorded and do what ``on_length=``/``on_overflow=`` say. The tiny model is built in code.
"""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
from standin import registered_standin
from torchrl.envs.llm.transforms import PolicyVersion
from torchrl.modules.llm import TransformersWrapper

from mlgym_registry import EnvMisuseError, TaskSpec, registry
from mlgym_registry.episodes.episode import run_episode
from mlgym_registry.options import InvalidOptionError
from mlgym_registry.policies.transformers import TransformersPolicy
from mlgym_registry.records.trajectories import TrajectoryWriter, load_traj
from mlgym_registry.testing.tiny_model import save_tiny_checkpoint, tiny_model, tiny_tokenizer
from mlgym_registry.transforms.context_policy import outcome_of
from mlgym_registry.transforms.tokens import TemplateNotPrefixPreserving

SPEC = TaskSpec(id="tokenTask", description="Improve the strategy.", baseline_scores=[{"Score": 1.0}], max_steps=30)
COMMAND = "DISCUSSION\nLook around.\n```\nls\n```"
CUT = 6  # the policy's max_new_tokens

# chatml, except that an assistant turn followed by another message loses its reasoning (as Qwen3's template does)
DROPS_PAST_REASONING = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['role'] == 'assistant' and not loop.last and '</think>' in message['content'] %}"
    "{{ message['content'].split('</think>')[-1] }}{% else %}{{ message['content'] }}{% endif %}"
    "{{'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer)


@pytest.fixture
def standin():
    with registered_standin("standin_tokens") as backends:
        yield backends


def make(tokenizer, **options):
    options.setdefault("max_format_errors", None)  # the tiny model's garbage never ends an episode here
    return registry.make(SPEC, backend="standin_tokens", tokenizer=tokenizer, **options)


def sampler(model, tokenizer, input_mode="tokens"):
    return TransformersWrapper(model, tokenizer=tokenizer, input_mode=input_mode, generate=True, return_log_probs=True,
                               generate_kwargs={"max_new_tokens": CUT, "do_sample": True})


def outcomes(rollout):
    """The outcome flags of each step of a one-env rollout, as the ``.traj`` names them."""
    return [outcome_of(rollout[0, t]["next"]) for t in range(rollout.shape[-1])]


def writer_of(tokenizer, text):
    """A policy that answers ``text`` every turn, as token ids and text, the way TorchRL's wrappers write them."""
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])

    def policy(td):
        td["tokens", "response"] = ids.expand(*td.batch_size, -1).clone()
        td["text", "response"] = text
        return td

    return policy


# -- token-faithful rollouts -----------------------------------------------------------------------------------------
def test_tokens_mode_keeps_the_sampled_ids_log_probs_and_policy_version(tokenizer, model, standin):
    env = make(tokenizer, input_mode="tokens", max_turn_tokens=CUT)
    version = PolicyVersion()  # what LLMCollector(track_policy_version=True) appends
    env = env.append_transform(version)
    try:
        torch.manual_seed(0)
        rollout = env.rollout(3, sampler(model, tokenizer))
        for t in range(3):
            step = rollout[0, t]
            prompt, response = step["tokens", "prompt"], step["tokens", "response"]
            assert torch.equal(step["tokens", "full"], torch.cat([prompt, response]))
            assert step["log_probs", "response"].shape == response.shape == (CUT,)
            # the next prompt starts with this turn's whole sequence, exactly as sampled
            next_prompt = step["next", "tokens", "prompt"]
            assert torch.equal(next_prompt[: len(prompt) + CUT], torch.cat([prompt, response]))
        assert rollout["policy_version"].tolist() == [[0, 0, 0]]
        assert outcomes(rollout) == ["length"] * 3  # every reply was cut at max_new_tokens
        assert not rollout["next", "masked"].any() and not rollout["next", "done"].any()
        version.increment_version()
        assert env.rollout(1, sampler(model, tokenizer))["policy_version"].tolist() == [[1]]
    finally:
        env.close()


def test_history_mode_rollout_holds_the_policy_tokens_and_the_length_outcome(tokenizer, model, standin):
    env = make(tokenizer, input_mode="history")
    try:
        rollout = env.rollout(2, sampler(model, tokenizer, "history"))
        assert rollout["tokens", "response"].shape == rollout["log_probs", "response"].shape == (1, 2, CUT)
        assert outcomes(rollout) == ["length", "length"]
    finally:
        env.close()


def test_the_traj_of_a_transformers_policy_holds_its_tokens(tmp_path, tokenizer, standin):
    policy = TransformersPolicy(save_tiny_checkpoint(tmp_path / "ckpt"), max_new_tokens=CUT)
    policy.version = 7
    env = make(tokenizer, max_turns=3)
    writer = TrajectoryWriter(tmp_path / "run", SPEC.id)
    try:
        result = run_episode(env, policy, writer=writer)
    finally:
        env.close()
        policy.close()
    loaded = load_traj(writer.traj_path)
    assert len(loaded.steps) == len(result.turns) == 3
    for turn, step, tokens in zip(result.turns, loaded.steps, loaded.turn_tokens(), strict=True):
        prompt, response, log_probs = tokens
        assert prompt == turn.prompt_tokens and response == turn.response_tokens and len(response) == CUT
        assert len(log_probs) == CUT and step.policy_version == 7 and step.outcome == "length"
        assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    assert loaded.info["outcomes"] == {"length": 3}
    # on disk a prompt is stored after what it keeps of the previous step's sequence
    entries = json.loads(writer.traj_path.read_text())["trajectory"]
    assert entries[0]["prompt_tokens_kept"] == 0 and entries[1]["prompt_tokens_kept"] > 0


# -- prefix preservation ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("drops", [True, False])
def test_tokens_mode_warns_once_about_a_template_that_rewrites_past_turns(tokenizer, standin, drops):
    tok = copy.deepcopy(tokenizer)
    if drops:
        tok.chat_template = DROPS_PAST_REASONING
    env = make(tok, input_mode="tokens")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.rollout(3, writer_of(tok, "<think>plan</think>" + COMMAND + "<|im_end|>"))
        flagged = [w for w in caught if issubclass(w.category, TemplateNotPrefixPreserving)]
        assert len(flagged) == (1 if drops else 0)
        if drops:
            assert "not prefix-preserving" in str(flagged[0].message)
            assert "tokenizer's own" in str(flagged[0].message)
    finally:
        env.close()


# -- the context policy ----------------------------------------------------------------------------------------------
def test_a_reply_that_ends_its_turn_has_no_outcome(tokenizer, standin):
    env = make(tokenizer, input_mode="tokens", max_turn_tokens=CUT)
    try:
        rollout = env.rollout(2, writer_of(tokenizer, COMMAND + "<|im_end|>"))
        assert outcomes(rollout) == ["", ""]
    finally:
        env.close()


@pytest.mark.parametrize("on_length, masked, reward, done", [
    ("record", False, 0.0, False),
    ("mask", True, 0.0, False),
    (-0.5, False, -0.5, False),
    (("mask", -0.25), True, -0.25, False),
    ("end", False, 0.0, True),
])
def test_a_cut_reply_does_what_on_length_says(tokenizer, standin, on_length, masked, reward, done):
    env = make(tokenizer, input_mode="history", max_turn_tokens=4, on_length=on_length)
    try:
        td = env.reset()
        policy = writer_of(tokenizer, COMMAND)  # no end-of-turn token, more than 4 tokens: cut
        out = env.step(policy(td))["next"]
        assert out["length"].all() and not out["overflow"].any()
        assert bool(out["masked"].all()) is masked
        assert out["reward"].item() == reward
        assert bool(out["done"].all()) is done and bool(out["truncated"].all()) is done
        if done:
            with pytest.raises(EnvMisuseError, match="length"):
                env.step(policy(env.step_mdp(env.step(policy(env.reset())))))
    finally:
        env.close()


@pytest.mark.parametrize("input_mode", ["tokens", "history"])
def test_a_conversation_over_the_context_window_ends_truncated(tokenizer, standin, input_mode):
    env = make(tokenizer, input_mode=input_mode)
    first = len(tokenizer(env.reset()["text", "prompt"], add_special_tokens=False)["input_ids"])
    env.close()
    env = make(tokenizer, input_mode=input_mode, max_turn_tokens=CUT, context_window=first + 40)
    try:
        rollout = env.rollout(5, writer_of(tokenizer, COMMAND + "<|im_end|>"))
        assert rollout.shape[-1] < 5  # the rollout stopped when the episode ended
        assert outcomes(rollout)[-1] == "overflow"
        assert rollout["next", "truncated"][0, -1].all() and not rollout["next", "terminated"].any()
    finally:
        env.close()


def test_overflow_can_be_masked_instead_and_the_episode_budget_counts_generated_tokens(tokenizer, standin):
    env = make(tokenizer, input_mode="tokens", max_turn_tokens=CUT, max_episode_tokens=2 * CUT,
               on_overflow="mask", on_length="record")
    try:
        rollout = env.rollout(3, writer_of(tokenizer, "a b c d e f g h"))  # 8 tokens or more, cut
        assert outcomes(rollout) == ["length+overflow"] * 3
        assert rollout["next", "masked"].all() and not rollout["next", "done"].any()
    finally:
        env.close()


def test_context_options_are_checked(tokenizer, standin):
    with pytest.raises(InvalidOptionError, match="on_length"):
        make(tokenizer, on_length="drop")
    with pytest.raises(InvalidOptionError, match="context_window"):
        make(tokenizer, context_window=0)
    with pytest.raises(ValueError, match="tokenizer"):
        registry.make(SPEC, backend="standin_tokens", context_window=100)
    with pytest.raises(ValueError, match="layout='default'"):
        make(tokenizer, layout="seed", max_turn_tokens=8)
