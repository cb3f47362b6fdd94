"""Policies: the scripted agent's plan, replay of recorded responses, the human reader, a local transformers model."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from mlgym_registry.components.parsers import StrictThoughtActionParser
from mlgym_registry.policies import PolicyExhausted, make_policy
from mlgym_registry.policies.base import file_window
from mlgym_registry.policies.human import HumanPolicy
from mlgym_registry.policies.playbooks import PLAYBOOKS
from mlgym_registry.policies.replay import ReplayPolicy
from mlgym_registry.policies.scripted import ScriptedPolicy
from mlgym_registry.records.trajectories import Step, Trajectory
from mlgym_registry.specs import TaskSpec

PARSER = StrictThoughtActionParser()
STATUS = "\n(Current Step: {step}, Remaining Steps: {left})\n(Open file: n/a)\n(Current directory: /w)\nbash-$"


def window(lines: int) -> str:
    return f"[File: /w/strategy.py ({lines} lines total)]\n1:import random\n2:\nFile updated. Please review."


def validated(score: float) -> str:
    return (f"Your code produced a valid submission artefact at /w/target.py.\nBaseline Score: {{'Score': 2.37}}\n"
            f"Evaluation Score: {{'Score': {score}}}")


class Conversation:
    """Feeds a policy the observations a backend would give, through the message list the env keeps."""

    def __init__(self, policy, max_steps: int = 50):
        self.policy = policy
        self.messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task" + STATUS.format(
            step=0, left=max_steps)}]
        self.max_steps = max_steps
        self.actions: list[str] = []

    def turn(self, observation: str | None = None) -> str:
        if observation is not None:
            step = len(self.actions)
            self.messages.append({"role": "user", "content": observation + STATUS.format(
                step=step, left=self.max_steps - step)})
        response = self.policy(self.messages)
        _thought, action = PARSER(response)  # one block, MLGym's strict format
        self.messages.append({"role": "assistant", "content": response})
        self.actions.append(action)
        return action


def spec(task_id: str) -> TaskSpec:
    return TaskSpec(id=task_id, baseline_scores=[{"Score": 2.37}])


def test_scripted_plays_its_playbook_and_restores_the_best_strategy():
    policy = ScriptedPolicy()
    policy.reset(spec("prisonersDilemma"))
    talk = Conversation(policy)
    assert talk.turn() == "ls -a\n"
    assert talk.turn("./\n../\nevaluate.py*\nstrategy.py\ntarget.py") == 'open "strategy.py"\n'
    first = talk.turn("[File: /w/strategy.py (33 lines total)]\n1:import random")
    candidates = PLAYBOOKS["prisonersDilemma"].candidates
    assert first.startswith("edit 1:33\n") and first.endswith("end_of_edit\n")
    assert candidates[0].code in first
    assert talk.turn(window(3)) == "validate\n"
    second = talk.turn(validated(2.62))
    assert second.startswith("edit 1:3\n") and candidates[1].code in second
    assert talk.turn(window(5)) == "validate\n"
    restore = talk.turn(validated(2.50))
    assert restore.startswith("edit 1:5\n") and candidates[0].code in restore
    assert talk.turn(window(3)) == "submit\n"
    assert talk.turn("Exited (submit)") == "submit\n"


def test_scripted_keeps_the_last_strategy_when_it_is_best():
    policy = make_policy("scripted", task_id="mlgym/battleOfSexes")
    talk = Conversation(policy)
    talk.turn()
    talk.turn("evaluate.py strategy.py target.py")
    talk.turn("[File: /w/strategy.py (20 lines total)]")
    talk.turn(window(2))
    talk.turn(validated(1.1))
    talk.turn(window(6))
    assert talk.turn(validated(1.4)) == "submit\n"


def test_scripted_skips_a_refused_edit():
    talk = Conversation(ScriptedPolicy("blotto"))
    talk.turn()
    talk.turn("evaluate.py strategy.py target.py")
    first = talk.turn("[File: /w/strategy.py (36 lines total)]")
    # a refused edit leaves the file as it was: the agent moves on to the next strategy without validating
    second = talk.turn("Your proposed edit has introduced new syntax error(s).")
    assert first.startswith("edit 1:36\n") and second.startswith("edit 1:36\n") and first != second
    assert talk.turn(window(3)) == "validate\n"
    assert talk.turn(validated(0.1)) == "submit\n"


def test_scripted_submits_when_steps_run_out():
    talk = Conversation(ScriptedPolicy("blotto"), max_steps=5)
    talk.turn()
    talk.turn("evaluate.py strategy.py target.py")
    talk.turn("[File: /w/strategy.py (36 lines total)]")
    assert talk.turn(window(7)) == "validate\n"
    assert talk.turn(validated(0.1)) == "submit\n"  # one step left: no room for another strategy


def test_scripted_generic_plan_for_unknown_tasks():
    talk = Conversation(ScriptedPolicy("someoneElsesTask"))
    assert talk.turn() == "ls -a\n"
    assert talk.turn("data/ train.py") == "validate\n"
    assert talk.turn(validated(0.5)) == "submit\n"


def test_observation_helpers():
    assert file_window("x\n[File: /a b/s.py (12 lines total)]\n1:x") == ("/a b/s.py", 12)
    assert file_window("no window") is None


def test_the_scripted_policy_reads_scores_as_the_reward_does():
    # one reader of MLGym's score lines (scores.parse_validation): numpy reprs and case-folded metric names included
    for score_line in ("{'Score': 0.75}", "{'Score': np.float64(0.75)}", "{'Time': 3.0, 'score': 0.75}"):
        talk = Conversation(ScriptedPolicy("someoneElsesTask", metric="Score"))
        talk.turn()
        talk.turn("data/ train.py")
        talk.turn(f"Baseline Score: {{'Score': 0.5}}\nEvaluation Score: {score_line}")
        assert "It scored 0.7500." in talk.messages[-1]["content"], score_line


def recorded(*steps: tuple[str, str, str]) -> Trajectory:
    return Trajectory("mlgym_main", [Step(action=a, observation="", response=r, state="{}", thought=t)
                                     for r, t, a in steps], [], {})


def test_replay_feeds_recorded_responses_then_stops():
    policy = ReplayPolicy(recorded(("one\n```\nls\n```", "one\n", "ls\n"),
                                   ("Exit due to context window", "Exit due to context window", "exit_context")))
    assert policy([]) == "one\n```\nls\n```"
    assert PARSER(policy([]))[1] == "exit_context\n"  # MLGym's made-up step becomes its special action
    with pytest.raises(PolicyExhausted, match="2 recorded steps"):
        policy([])
    policy.reset()
    assert policy.remaining == 2


def test_human_reads_commands_and_edit_blocks():
    typed = io.StringIO("ls -a\nedit 1:2\n    return 1\nend_of_edit\n```\nvalidate\n```\n")
    shown = io.StringIO()
    policy = HumanPolicy(stdin=typed, stdout=shown)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "the prompt"}]
    assert PARSER(policy(messages))[1] == "ls -a\n"
    assert PARSER(policy(messages))[1] == "edit 1:2\n    return 1\nend_of_edit\n"
    assert PARSER(policy(messages))[1] == "validate\n"
    assert "the prompt" in shown.getvalue()
    with pytest.raises(PolicyExhausted, match="input ended"):
        policy(messages)


def test_make_policy_errors():
    with pytest.raises(ValueError, match="needs a path"):
        make_policy("replay")
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("gpt")
    with pytest.raises(FileNotFoundError, match="config.json"):
        make_policy("transformers:/nonexistent")


def save_tiny_model(folder: Path) -> None:
    """A randomly initialised one-layer GPT-2 with a character tokenizer and a chat template, built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    symbols = ["<pad>", "<eos>", "\n"] + [chr(i) for i in range(32, 127)]
    tokenizer = Tokenizer(models.WordLevel(vocab={s: i for i, s in enumerate(symbols)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}[assistant] {% endif %}")
    config = GPT2Config(vocab_size=len(symbols), n_positions=2048, n_embd=16, n_layer=1, n_head=2,
                        pad_token_id=0, eos_token_id=1, bos_token_id=1)
    GPT2LMHeadModel(config).save_pretrained(folder)
    fast.save_pretrained(folder)


@pytest.mark.slow
def test_transformers_policy_generates_text_from_a_local_model(tmp_path):
    save_tiny_model(tmp_path)
    policy = make_policy("transformers:" + str(tmp_path), max_new_tokens=12)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "What next?"}]
    first = policy(messages)
    assert isinstance(first, str) and 0 < len(first) <= 12
    assert policy(messages) == first  # greedy decoding is deterministic
    policy.close()


def test_scripted_prefers_lower_scores_when_the_task_says_so():
    policy = ScriptedPolicy()
    policy.reset(TaskSpec(id="blotto", baseline_scores=[{"Loss": 1.0}], extra={"metric_direction": "min"}))
    talk = Conversation(policy)
    talk.turn()
    talk.turn("evaluate.py strategy.py target.py")
    talk.turn("[File: /w/strategy.py (36 lines total)]")
    talk.turn(window(7))
    talk.turn("Evaluation Score: {'Loss': 0.5}")
    talk.turn(window(2))
    assert talk.turn("Evaluation Score: {'Loss': 0.9}").startswith("edit 1:2\n")  # the first (lower) one is restored


@pytest.mark.slow
def test_scripted_follows_the_task_a_multi_task_env_picks():
    from mlgym_registry import registry
    from mlgym_registry.episodes.episode import run_episode

    env = registry.make(tasks=["blotto", "battleOfSexes"])
    try:
        played = set()
        for seed in range(4):
            result = run_episode(env, make_policy("scripted"), seed=seed)
            played.add(result.spec.id)
            assert result.improvement > 0, result.summary()
    finally:
        env.close()
    assert played == {"blotto", "battleOfSexes"}
