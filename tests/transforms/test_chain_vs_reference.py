"""One regression test per defect of TorchRL's reference MLGym chain (``make_mlgym``, TorchRL 0.11-0.14).

Each docstring says what the reference does; each test fails on that behaviour and passes on ours.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from types import SimpleNamespace

import pytest
from standin import StandinBackend
from tensordict import TensorDict
from torchrl.data.llm import History
from torchrl.envs.utils import check_env_specs

from mlgym_registry import TaskSpec, registry
from mlgym_registry.components.isolators import guard_multiline_input
from mlgym_registry.transforms.history import HISTORY_FIELDS
from mlgym_registry.transforms.layout import LAYOUTS
from mlgym_registry.transforms.rendering import ChatRenderer

BASELINE = 1.5
SPEC = TaskSpec(id="regTask", description="Regression task.", baseline_scores=[{"Score": BASELINE}], max_steps=400)


class Made(list):
    def __call__(self, spec, **options):
        self.append(StandinBackend(spec, **getattr(self, "options", {}), **options))
        return self[-1]


@pytest.fixture
def made():
    backends = Made()
    registry.register("backend", "standin_reg", backends)
    try:
        yield backends
    finally:
        registry.unregister("backend", "standin_reg")


def make(layout="default", **options):
    options.setdefault("batch_size", ())  # the chain's own tensordicts; test_training_shapes.py: batched
    return registry.make(SPEC, backend="standin_reg", layout=layout, **options)


def fenced(command: str) -> str:
    return f"DISCUSSION\nnext command\n```\n{command}\n```\n"


def step(env, td, response):
    td.set(env.base_env.layout.response, response)
    td = env.step(td)
    return td["next"], env.step_mdp(td)


@pytest.mark.parametrize("layout", ["default", "seed"])
def test_01_reset_writes_every_declared_observation(made, layout):
    """#1: ``MessageToHistory`` declared an out key ``chat`` it never wrote: ``reset()`` raised KeyError."""
    reference = pytest.importorskip("torchrl.envs.llm.libs.mlgym")
    assert "chat" in reference.MessageToHistory().out_keys  # the reference's defect, as TorchRL still ships it
    env = make(layout)
    td = env.reset()
    declared = set(env.full_observation_spec.keys(True, True, is_leaf=lambda s: not hasattr(s, "keys")))
    declared = {k for k in declared if not (isinstance(k, tuple) and k[-1] in HISTORY_FIELDS)}
    assert "chat" not in env.full_observation_spec.keys(True)
    for key in declared:
        assert key in td.keys(True), key
    env.close()


def test_02_message_and_reward_come_from_this_step(made):
    """#2: ``StateToMessage`` read time-t ``observation``/``state``: each message showed the previous step's output,
    and a validate's reward landed one step late."""
    made.options = {"outputs": ["output of step one", "output of step two"], "scores": [{"Score": 2.0}]}
    env = make()
    td = env.reset()
    nxt, td = step(env, td, fenced("echo one"))
    assert nxt["message"].startswith("output of step one\n")
    nxt, td = step(env, td, fenced("echo two"))
    assert nxt["message"].startswith("output of step two\n")
    nxt, td = step(env, td, fenced("validate"))
    assert nxt["reward"].item() == pytest.approx(2.0 - BASELINE)
    nxt, td = step(env, td, fenced("echo after"))
    assert nxt["reward"].item() == 0.0
    env.close()


@pytest.mark.parametrize("layout", ["default", "seed"])
def test_03_retry_with_a_history_does_not_crash(made, layout):
    """#3: a malformed response set ``retry`` and ``ConditionalSkip`` crashed in ``_skip_tensordict``
    (``IndexError: Incompatible dim 0``) whenever the tensordict carried a ``History``; so did ``check_env_specs``."""
    env = make(layout, reward_wrong_format=-1.0)
    keys = LAYOUTS[layout]
    td = env.reset()
    for _ in range(2):
        nxt, td = step(env, td, "no code block at all")
        assert nxt[keys.retry].item() is True
    # the third in a row is MLGym's exit_format: the backend autosubmits and the episode ends
    nxt, td = step(env, td, "no code block at all")
    assert nxt[keys.retry].item() is False and nxt["done"].item() is True
    assert made[-1].actions[-1] == "exit_format"
    assert td[keys.history].shape == (8,)
    check_env_specs(env)  # random actions: every step is a retry
    env.close()


def test_04_history_spec_declares_only_what_is_stored(made):
    """#4: ``History.default_spec()`` declares ``tool_calls``/``tool_responses``, never stored: check_env_specs
    failed."""
    env = make()
    spec = env.full_observation_spec["history", "prompt"]
    stored = set(History(role="user", content="x", batch_size=())._tensordict.keys())
    assert set(spec.keys()) == stored == set(HISTORY_FIELDS)
    assert {"tool_calls", "tool_responses"} <= set(History.default_spec().keys())
    check_env_specs(env)
    env.close()


def test_05_chat_template_name_resolves(made):
    """#5: ``chat_template_name=`` imported ``_CHAT_TEMPLATES`` from ``torchrl.data.llm.datatypes.chat``, which does
    not exist."""
    assert importlib.util.find_spec("torchrl.data.llm.datatypes") is None
    env = make(chat_template_name="qwen")
    td = env.reset()
    history = td["history", "prompt"]
    messages = [{"role": r, "content": c} for r, c in zip(history.role, history.content, strict=True)]
    assert td["text", "prompt"] == ChatRenderer(chat_template_name="qwen").render(messages)
    assert td["text", "prompt"].endswith("<|im_start|>assistant\n")
    env.close()


def test_06_task_sampler_writes_task_at_reset(made):
    """#6: ``TaskSampler`` declared ``task`` in its spec but did not write it at reset."""
    env = registry.make(tasks=[SPEC, SPEC.replace(id="regTask2")], backend="standin_reg")
    assert "task" in env.full_observation_spec.keys()
    td = env.reset()
    assert td["task"] in {"regTask", "regTask2"}
    check_env_specs(env)
    env.close()


def test_07_mlgym_step_is_never_wrapped_twice(mlgym_checkout):  # noqa: F811
    """#7: ``MLGymWrapper._patch_step`` tested ``.reset`` instead of ``.step``, so a second ``set_env()`` (a task
    swap) wrapped ``step`` twice. The adapter calls MLGym's ``step`` as it is, across resets and task swaps."""
    reference = pytest.importorskip("torchrl.envs.llm.libs.mlgym")
    holder = SimpleNamespace(_env=SimpleNamespace(reset=lambda: None, step=lambda action: (action, 0, False, {})))
    reference.MLGymWrapper._patch_step(holder)
    reference.MLGymWrapper._patch_step(holder)
    assert isinstance(holder._env.step.func, reference._add_truncated_to_step)  # the reference wraps twice

    env_module = importlib.import_module("mlgym.environment.env")
    env = registry.make(tasks=[SPEC, SPEC.replace(id="regTask2")], backend="mlgym")
    env.set_seed(0)
    for _ in range(4):
        td = env.reset()
        mlgym_env = env.base_env.backend.env
        assert mlgym_env.step.__func__ is env_module.MLGymEnv.step
        step(env, td, fenced("ls"))
        assert [c for c in mlgym_env.calls if c[0] == "step"][-1] == ("step", "ls")
        assert env.base_env.last_info["exit_status"] == ""
    env.close()


def test_08_multiline_edit_reaches_the_backend_heredoc_guarded(made):
    """#8: actions lacked the heredoc guard MLGym's agent adds to ``edit``/``insert`` bodies, so every multi-line
    edit came back as a bash syntax error."""
    env = make()
    td = env.reset()
    edit = 'edit 3:4\ndef f(history):\n    return "it\'s 1"\nend_of_edit'
    step(env, td, fenced(edit))
    sent = made[-1].actions[-1]
    assert sent == guard_multiline_input(edit).strip() and sent != edit
    if shutil.which("bash"):  # what the shell makes of it: the guarded edit parses, the raw one does not
        assert subprocess.run(["bash", "-n", "-c", sent]).returncode == 0
        assert subprocess.run(["bash", "-n", "-c", edit], capture_output=True).returncode != 0
    env.close()


def test_09_final_submit_score_reaches_the_reward(made):
    """#9: the final ``submit`` score never reached the reward: MLGym prints it nowhere, only ``info["score"]``."""
    made.options = {"scores": [{"Score": 2.25}]}
    env = make()
    td = env.reset()
    nxt, _ = step(env, td, fenced("submit"))
    assert nxt["message"].startswith("Exited (submit)")
    assert nxt["done"].item()
    assert nxt["reward"].item() == pytest.approx(2.25 - BASELINE)
    env.close()


def test_10_per_step_work_does_not_grow_with_history(made, monkeypatch):
    """#10: each step re-parsed (``History.from_text``) and re-rendered the whole transcript, so per-step cost grew
    linearly with history length. Now a step renders a fixed-size window and shares the previous messages."""

    def refuse(*args, **kwargs):
        raise AssertionError("the transcript must not be re-parsed")

    monkeypatch.setattr(History, "from_text", classmethod(refuse))
    rendered: list[int] = []
    original = ChatRenderer.render

    def counting(self, messages, add_generation_prompt=True):
        rendered.append(len(messages))
        return original(self, messages, add_generation_prompt)

    monkeypatch.setattr(ChatRenderer, "render", counting)
    env = make()
    td = env.reset()
    windows = {}
    for turn in range(100):
        rendered.clear()
        previous = td["history", "prompt"]
        nxt, td = step(env, td, fenced(f"echo {turn}"))
        history = nxt["history", "prompt"]
        # the new history shares the previous messages instead of copying them
        old, new = previous._tensordict.tensordicts, history._tensordict.tensordicts
        assert len(new) == len(old) + 2 and all(a is b for a, b in zip(old, new[: len(old)], strict=True))
        windows[history.shape[0]] = max(rendered)
    assert windows[4] == windows[202] <= 4
    # ... and a shallow clone of the step data (TorchRL makes several per step) does not copy them either
    clone = TensorDict({"h": history}, batch_size=()).clone(False)["h"]
    assert clone._tensordict.tensordicts[0] is history._tensordict.tensordicts[0]
    env.close()
