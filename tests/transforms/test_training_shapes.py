"""TorchRL 0.14's LLM conventions, as ``registry.make`` gives them: ``ChatEnv``'s shapes, its input modes, a GRPO group
key, episodes that always end, and factories that work in TorchRL's batched envs and collectors."""

from __future__ import annotations

import functools
import multiprocessing
import pickle
import time

import pytest
import torch
from standin import registered_standin
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torchrl.envs.utils import check_env_specs

from mlgym_registry import EnvMisuseError, PolicyOutputError, TaskSpec, registry
from mlgym_registry.options import InvalidOptionError
from mlgym_registry.testing.tiny_model import tiny_model, tiny_tokenizer
from mlgym_registry.transforms.layout import LAYOUTS

SPEC = TaskSpec(id="shapeTask", description="Improve the strategy.", baseline_scores=[{"Score": 1.0}], max_steps=30)
OTHER = SPEC.replace(id="otherShapeTask", description="Another task.")
COMMAND = "DISCUSSION\nLook around.\n```\nls\n```"


@pytest.fixture
def made():
    with registered_standin("standin_shapes") as backends:
        yield backends


def make(task=SPEC, **options):
    return registry.make(task, backend="standin_shapes", **options)


def respond(env, td, text=COMMAND):
    td["text", "response"] = text
    td = env.step(td)
    return td["next"], env.step_mdp(td)


# -- ChatEnv's shapes ------------------------------------------------------------------------------------------------
def test_default_env_has_chat_env_shapes(made):
    env = make()
    assert env.batch_size == (1,)
    td = env.reset()
    assert td.batch_size == (1,)
    history = td["history", "prompt"]
    assert history.batch_size == (1, 2)
    assert list(history[0].role) == ["system", "user"]
    assert td["text", "prompt"].endswith("<|im_start|>assistant\n")
    assert td["query"] == "shapeTask"
    nxt, td = respond(env, td)
    assert nxt["reward"].shape == (1, 1, 1)  # batch + (1, 1), as TorchRL's LLM reward transforms write it
    assert nxt["done"].shape == nxt["terminated"].shape == nxt["truncated"].shape == (1, 1)
    assert nxt["history", "prompt"].batch_size == (1, 4)
    assert made[-1].actions == ["ls"]
    check_env_specs(env)
    env.close()
    assert made[-1].closed


def test_other_one_element_batch_shapes_and_the_unbatched_chain(made):
    env = make(batch_size=(1, 1))
    td = env.reset()
    assert td.batch_size == (1, 1) and td["history", "prompt"].batch_size == (1, 1, 2)
    nxt, _ = respond(env, td)
    assert nxt["reward"].shape == (1, 1, 1, 1)
    check_env_specs(env)
    env.close()
    env = make(batch_size=())
    td = env.reset()
    assert td.batch_size == () and td["history", "prompt"].batch_size == (2,)
    nxt, _ = respond(env, td)
    assert nxt["reward"].shape == (1, 1)
    env.close()


def test_seed_layout_keeps_the_reference_shapes(made):
    env = make(layout="seed")
    td = env.reset()
    assert env.batch_size == () and td["history"].batch_size == (2,)
    td["text_response"] = COMMAND
    assert env.step(td)["next", "reward"].shape == (1,)
    env.close()
    with pytest.raises(ValueError, match="need layout='default'"):
        make(layout="seed", batch_size=(1,))


def test_batch_sizes_of_several_episodes_are_refused_with_the_way_to_run_several(made):
    with pytest.raises(InvalidOptionError, match=r"batch_size \(a chain option\) must be a shape of one element"):
        make(batch_size=(2,))
    with pytest.raises(InvalidOptionError, match=r"input_mode \(a chain option\) must be 'history', 'text' or"):
        make(input_mode="chat")


# -- the group key -----------------------------------------------------------------------------------------------
def test_query_is_the_task_for_every_instance_and_differs_between_tasks(made):
    first, second = make(), make()
    assert first.reset()["query"] == second.reset()["query"] == "shapeTask"
    first.close()
    second.close()
    env = registry.make(tasks=[SPEC, OTHER], backend="standin_shapes")
    env.set_seed(0)
    seen = {}
    for _ in range(6):
        td = env.reset()
        seen[td["task"]] = td["query"]
        nxt, _ = respond(env, td)
        assert nxt["query"] == td["query"]  # every step of a trajectory tells its group
    env.close()
    assert seen == {"shapeTask": "shapeTask", "otherShapeTask": "otherShapeTask"}


def test_the_first_prompt_holds_no_machine_specific_path():
    env = registry.make("prisonersDilemma")
    try:
        td = env.reset()
        host_folder = str(env.base_env.backend.host_workspace)
        assert host_folder not in td["text", "prompt"]
        assert "/home/agent/workspace" in td["text", "prompt"]
    finally:
        env.close()


# -- episodes always end -----------------------------------------------------------------------------------------
def test_three_format_errors_in_a_row_end_the_episode_with_exit_format(made):
    env = make(reward_wrong_format=-1.0, scores=[{"Score": 1.5}])
    td = env.reset()
    for _ in range(2):
        nxt, td = respond(env, td, "no command here")
        assert nxt["retry"].item() and not nxt["done"].item()
    nxt, td = respond(env, td, "no command here either")
    assert nxt["done"].item() and nxt["terminated"].item() and not nxt["truncated"].item()
    assert made[-1].actions == ["exit_format"]  # MLGym's special action: the backend autosubmits
    # the penalty, and the task's floor: the autosubmission of an episode of garbage is not paid its score
    assert nxt["reward"].item() == pytest.approx(-1.0 + -1.0)
    env.close()
    env = make(reward_wrong_format=-1.0, scores=[{"Score": 1.5}], score_format_exit=True)
    td = env.reset()
    for _ in range(3):
        nxt, td = respond(env, td, "no command here")
    assert nxt["reward"].item() == pytest.approx(-1.0 + (1.5 - 1.0))  # asked for: the autosubmission's score
    env.close()


def test_a_good_command_resets_the_format_error_count(made):
    env = make()
    td = env.reset()
    for text in ("bad", "bad", COMMAND, "bad", "bad"):
        nxt, td = respond(env, td, text)
        assert not nxt["done"].item()
    assert made[-1].actions == ["ls"]
    env.close()


def test_the_turn_cap_truncates_whatever_the_policy_writes(made):
    env = make(max_format_errors=None, max_turns=4)
    td = env.reset()
    dones = []
    for _ in range(4):
        nxt, td = respond(env, td, "never a command")
        dones.append(nxt["done"].item())
    assert dones == [False, False, False, True]
    assert nxt["truncated"].item() and not nxt["terminated"].item()
    assert env.base_env.stop_reason == "max_turns"
    env.close()


def test_the_default_cap_allows_every_step_with_its_format_errors(made):
    env = make()
    assert env.base_env.max_turns == 3 * (SPEC.max_steps + 1) + 1
    env.close()


# -- input modes -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_tokens_mode_prompts_continue_the_sampled_sequence(made, tokenizer):
    from torchrl.modules.llm import TransformersWrapper

    torch.manual_seed(0)
    policy = TransformersWrapper(tiny_model(tokenizer), tokenizer=tokenizer, input_mode="tokens", generate=True,
                                 generate_kwargs={"max_new_tokens": 6, "do_sample": True})
    env = make(input_mode="tokens", tokenizer=tokenizer, max_format_errors=None)
    rollout = env.rollout(4, policy)
    env.close()
    tokens, following = rollout["tokens"], rollout["next", "tokens"]
    # (in tokens mode TorchRL's wrapper replaces the step's ("text", ...) with its own, which has no prompt text)
    prompts = [tokenizer.decode(tokens[0, 0].prompt.tolist())]
    prompts += [rollout["next", "text"][0, t].prompt for t in range(4)]
    assert tokens[0, 0].prompt.tolist() == tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
    for turn in range(4):
        full, next_prompt = tokens[0, turn].full, following[0, turn].prompt
        # the prompt of turn t+1 starts with everything turn t saw and sampled (the sampled ids, which need not be
        # how the tokenizer would split their text), then the tokenizer's own tokens of what the template added
        assert torch.equal(next_prompt[: full.shape[0]], full)
        response = tokenizer.decode(tokens[0, turn].response.tolist())  # the wrapper writes no text in tokens mode
        added = prompts[turn + 1][len(prompts[turn]) + len(response):]
        assert next_prompt[full.shape[0]:].tolist() == tokenizer(added, add_special_tokens=False)["input_ids"]
    mask = rollout["next", "masks"][0, -1].all_attention_mask
    assert mask.shape == following[0, -1].prompt.shape and mask.all()


def test_tokens_mode_needs_a_tokenizer_and_token_ids(made, tokenizer):
    with pytest.raises(ValueError, match="input_mode='tokens' needs a tokenizer"):
        make(input_mode="tokens")
    env = make(input_mode="tokens", tokenizer=tokenizer)
    td = env.reset()
    td["tokens", "response"] = "ls"  # a string where token ids are expected
    with pytest.raises(PolicyOutputError, match=r"\('tokens', 'response'\).*token ids.*\('text', 'response'\)"):
        env.step(td)
    td = env.reset()
    ids = torch.tensor([tokenizer(COMMAND, add_special_tokens=False)["input_ids"]])
    td["tokens", "response"] = ids  # token ids only: the env decodes them
    assert "could not be used" not in env.step(td)["next", "message"]
    assert made[-1].actions == ["ls"]
    env.close()


def test_a_step_without_a_response_or_with_ids_as_text_names_the_key_and_the_fix(made):
    env = make()
    env.reset()
    with pytest.raises(PolicyOutputError, match=r"no model response at \('text', 'response'\).*TransformersWrapper"):
        env.step(TensorDict(batch_size=(1,)))
    td = env.reset()
    td["text", "response"] = torch.tensor([[5, 6, 7]])
    with pytest.raises(PolicyOutputError, match=r"holds a Tensor.*input_mode='tokens'"):
        env.step(td)
    env.close()


def test_a_step_of_the_wrong_batch_size_names_the_fix(made):
    env = make()
    env.reset()
    wrong = TensorDict({("text", "response"): [COMMAND, COMMAND]}, batch_size=(2,))
    with pytest.raises((PolicyOutputError, RuntimeError), match="batch"):
        env.step(wrong)
    env.close()


# -- factories in TorchRL's batched envs and collectors -----------------------------------------------------------
class Submit(TensorDictModuleBase):
    """A policy that submits at once: every episode is one turn long."""

    in_keys = ["query"]
    out_keys = [("text", "response")]

    def forward(self, tensordict):
        tensordict["text", "response"] = "DISCUSSION\nDone.\n```\nsubmit\n```"
        return tensordict


def test_the_process_registry_pickles_as_a_reference():
    assert pickle.loads(pickle.dumps(registry)) is registry
    make_env = pickle.loads(pickle.dumps(functools.partial(registry.make, "prisonersDilemma")))
    assert make_env.func.__self__ is registry


def test_llm_collector_over_a_threaded_env_pool_groups_episodes_by_query(made):
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs import AsyncEnvPool

    pool = AsyncEnvPool([functools.partial(make, SPEC)] * 2, backend="threading")
    collector = LLMCollector(pool, policy=Submit(), dialog_turns_per_batch=2, total_dialog_turns=4,
                             yield_completed_trajectories=True)
    episodes = list(collector)
    collector.shutdown()
    pool.close()
    assert len(episodes) >= 2
    assert all(bool(e["next", "done"][-1].all()) and e["query"][0] == "shapeTask" for e in episodes)
    # TorchRL 0.14's threading pool does not close its envs itself: the envs it built make its close() do it
    assert made and all(backend.closed for backend in made)


@pytest.mark.slow
def test_factories_work_in_spawned_workers_with_torchrl_defaults():
    """``functools.partial(registry.make, ...)`` in a multiprocessing env pool, and ``EnvFactory`` in a multi-process
    collector, with TorchRL's default settings; nothing is left running after close. One worker each: what is checked
    is that a spawned interpreter rebuilds the env from what it was given (each worker costs a fresh interpreter's
    imports), and test_pools and test_collectors play several workers side by side."""
    from torchrl.collectors import Collector
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs import AsyncEnvPool

    from mlgym_registry.interop.torchrl.env_factory import EnvFactory

    before = set(multiprocessing.active_children())  # the session's background replays run in worker processes
    pool = AsyncEnvPool([functools.partial(registry.make, "prisonersDilemma")], backend="multiprocessing")
    collector = LLMCollector(pool, policy=Submit(), dialog_turns_per_batch=2, total_dialog_turns=2,
                             yield_completed_trajectories=True)
    episodes = list(collector)
    collector.shutdown()
    pool.close()
    assert episodes and all(e["query"][0] == "prisonersDilemma" for e in episodes)

    factory = EnvFactory.from_spec("prisonersDilemma")
    collector = Collector([factory], Submit(), frames_per_batch=2, total_frames=4, num_collectors=1,
                          backend="process")
    batches = list(collector)
    collector.shutdown()
    assert batches and all(bool(b["next", "done"].all()) for b in batches)
    assert not set(multiprocessing.active_children()) - before


# -- closing ---------------------------------------------------------------------------------------------------------
def sandbox_processes() -> set[int]:
    """This process's descendants (the local backend's shells and sandboxes among them)."""
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_is_closed_is_true_exactly_when_nothing_runs_and_collector_shutdown_releases_the_sandbox():
    """TorchRL's collectors close an env at shutdown only when it is not closed: the env must not say it is closed
    while its sandbox runs."""
    from torchrl.collectors import Collector

    before = sandbox_processes()
    env = registry.make("prisonersDilemma")
    assert env.is_closed  # nothing started yet
    env.reset()
    assert not env.is_closed and sandbox_processes() - before  # a sandboxed shell runs
    collector = Collector(env, Submit(), frames_per_batch=1, total_frames=2)
    batches = list(collector)
    assert batches and bool(batches[-1]["next", "done"].all())
    collector.shutdown()
    assert env.is_closed
    # shutdown closed the env, and the env its sandbox: its processes end at once, but on a loaded machine the
    # kernel may take a while to reap them (a generous ceiling; the wait ends as soon as they are gone)
    deadline = time.monotonic() + 120
    while sandbox_processes() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sandbox_processes() - before


# -- misuse is named ---------------------------------------------------------------------------------------------------
def test_a_step_after_the_episode_ended_names_reset(made):
    env = make()
    td = env.reset()
    nxt, td = respond(env, td, "DISCUSSION\nDone.\n```\nsubmit\n```")
    assert nxt["done"].all()
    td["text", "response"] = COMMAND
    with pytest.raises(EnvMisuseError, match=r"already ended \(submitted, after 1 turns\).*env.reset\(\)"):
        env.step(td)
    td = env.reset()  # and the env goes on after a reset
    nxt, td = respond(env, td)
    assert not nxt["done"].any()
    env.close()


@pytest.mark.parametrize("layout", ["default", "seed"])
def test_stepping_a_stepped_tensordict_names_step_mdp(made, layout):
    env = make(layout=layout) if layout == "default" else make(layout=layout, batch_size=())
    keys = LAYOUTS[layout]
    td = env.reset()
    td[keys.response] = COMMAND
    stepped = env.step(td)
    actions = len(made[-1].actions)
    with pytest.raises(EnvMisuseError, match=r"already stepped.*env.step_mdp\(td\)"):
        env.step(stepped)
    assert len(made[-1].actions) == actions  # refused before the backend ran anything
    td = env.step_mdp(stepped)  # the right way still works
    td[keys.response] = COMMAND
    assert not env.step(td)["next", "done"].any()
    env.close()
