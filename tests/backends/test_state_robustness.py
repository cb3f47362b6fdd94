"""Issue 8: what an adversarial agent leaves in its shell never crashes a step of the local backend's chain.

The ``state`` command runs in the agent's shell after every step, so ``set -x`` traces, a ``DEBUG`` trap or odd
characters in the working directory's name end up in its output; a lone surrogate in a response and an ``insert``
without ``end_of_insert`` must not crash the step or run the body as shell commands either.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from standin import StandinBackend

from mlgym_registry import BackendUnavailable, TaskSpec, registry
from mlgym_registry.transforms.read_state import ReadState, parse_state

TASK = "prisonersDilemma"
ODD_DIR = 'a"b\\c'  # a double quote and a backslash
SPEC = TaskSpec(id="stateGame", description="A game.", max_steps=5)
STATE_LINE = '{"open_file": "n/a", "working_dir": "/home/agent/workspace"}'


def make_env():
    """The task on the local backend (unsandboxed where bubblewrap is missing: these tests run trusted commands)."""
    attempts = [{}, {"sandbox": "none"}]
    for options in attempts:
        env = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # sandbox="none" warns that it is unsafe
                env = registry.make(TASK, **options)
                td = env.reset()
            return env, td
        except BackendUnavailable as exc:
            if env is not None:
                env.close()
            reason = exc
    pytest.skip(f"local backend unavailable here: {reason}")


@pytest.fixture
def local():
    env, td = make_env()
    yield Episode(env, td)
    env.close()


class Episode:
    """An env and its current root tensordict, stepped with fenced commands."""

    def __init__(self, env, td):
        self.env, self.td = env, td
        self.layout = env.base_env.layout

    @property
    def workspace(self) -> str:
        return str(self.env.base_env.backend.task_workspace)

    def step(self, command: str | None = None, *, response: str | None = None):
        """Step with ``command`` in a fenced block (or the raw ``response``); the step's ``next`` tensordict."""
        text = response if response is not None else f"DISCUSSION\nNext.\n```\n{command}\n```\n"
        self.td.set(self.layout.response, text)
        out = self.env.step(self.td)
        self.td = self.env.step_mdp(out)
        return out["next"]

    def state(self, td) -> dict:
        return json.loads(str(td[self.layout.state]))

    def run(self, command: str) -> str:
        """``command``'s observation (a plain step)."""
        nxt = self.step(command)
        assert not nxt[self.layout.retry].item()
        return str(nxt[self.layout.observation])

    def read_state(self) -> ReadState:
        return next(t for t in self.env.transform if isinstance(t, ReadState))


# -- the state line among other output ------------------------------------------------------------------------------
def test_parse_state_takes_the_last_state_line():
    assert parse_state(STATE_LINE) == STATE_LINE
    later = STATE_LINE.replace("workspace", "workspace/sub")
    noisy = f"+ state\n{STATE_LINE}\njunk\n  {later}  \n++ printf '{{' x\nbash: fork: retry: Resource unavailable"
    assert parse_state(noisy) == later
    # JSON that is not a state, and broken JSON, are passed over
    assert parse_state(f'{STATE_LINE}\n{{"open_file": "x"}}\n[1, 2]\n{{"open_file": "n/a", "working_dir": ') == (
        STATE_LINE
    )
    for output in ("", "junk", "{}", '{"working_dir": "/"}', '"n/a"', "+ state"):
        assert parse_state(output) is None


def test_parse_state_keeps_an_undecodable_byte_as_text():
    # a byte that is not UTF-8 reaches us as the four characters \xff (backslashreplace): invalid in JSON
    line = '{"open_file": "n/a", "working_dir": "/w/caf\\xff\\\\x"}'
    parsed = parse_state(line)
    assert json.loads(parsed) == {"open_file": "n/a", "working_dir": "/w/caf\\xff\\x"}


# -- through the public API -----------------------------------------------------------------------------------------
def test_state_after_set_x_and_a_debug_trap(local):
    assert local.state(local.td) == {"open_file": "n/a", "working_dir": local.workspace}
    nxt = local.step("set -x")
    assert local.state(nxt)["working_dir"] == local.workspace
    nxt = local.step("cd .. && cd -")
    assert local.state(nxt) == {"open_file": "n/a", "working_dir": local.workspace}
    assert "+ cd .." in str(nxt[local.layout.observation])  # the trace really is in the output
    local.run("set +x")
    nxt = local.step("trap 'echo junk; echo {oops' DEBUG")
    assert "junk" in str(nxt[local.layout.observation])
    nxt = local.step("open strategy.py")
    assert local.state(nxt) == {"open_file": str(Path(local.workspace) / "strategy.py"), "working_dir": local.workspace}
    assert "(Open file: " + str(Path(local.workspace) / "strategy.py") in str(nxt[local.layout.message])
    assert local.read_state().unread == 0


def test_state_of_a_directory_with_quote_and_backslash(local):
    nxt = local.step(f"mkdir '{ODD_DIR}' && cd '{ODD_DIR}'")
    expected = str(Path(local.workspace) / ODD_DIR)
    assert local.state(nxt) == {"open_file": "n/a", "working_dir": expected}
    assert f"(Current directory: {expected})" in str(nxt[local.layout.message])
    # a control character and a newline in the name too, and a file open there
    nxt = local.step("mkdir $'x\\ty\\nz\\x01' && cd $'x\\ty\\nz\\x01' && echo 'a = 1' > f.py && open f.py")
    assert local.state(nxt) == {"open_file": f"{expected}/x\ty\nz\x01/f.py", "working_dir": f"{expected}/x\ty\nz\x01"}
    assert local.read_state().unread == 0


def test_unreadable_state_keeps_the_previous_one(local):
    nxt = local.step("mkdir sub && cd sub")
    sub = local.state(nxt)
    assert sub["working_dir"] == str(Path(local.workspace) / "sub")
    with pytest.warns(RuntimeWarning, match="no state JSON line"):
        nxt = local.step("state() { echo 'not a state'; }")
    assert local.state(nxt) == sub
    assert local.read_state().unread == 1
    nxt = local.step("cd ..")  # still unreadable: the previous state again, and no second warning
    assert local.state(nxt) == sub
    assert local.read_state().unread == 2
    assert not nxt["done"].item()


class UnreadableStateBackend(StandinBackend):
    """A stand-in backend whose state command prints no state: only trace lines and JSON of the wrong shape."""

    def communicate(self, input, timeout_duration=25, no_output_timeout_duration=None):
        self.communicated.append(input)
        return "+ state\n{\"open_file\": \"n/a\"}\n[1]" if input == "state" else ""


def test_unreadable_state_on_reset_falls_back_to_the_workspace():
    registry.register("backend", "standin_unreadable_state", UnreadableStateBackend)
    env = registry.make(SPEC, backend="standin_unreadable_state")
    try:
        with pytest.warns(RuntimeWarning, match="no state JSON line"):
            td = env.reset()
        fallback = {"open_file": "n/a", "working_dir": "/home/agent/workspace"}
        assert json.loads(str(td["state"])) == fallback
        assert "(Current directory: /home/agent/workspace)" in str(td["message"])
        td.set(("text", "response"), "DISCUSSION\nLook.\n```\nls\n```\n")
        nxt = env.step(td)["next"]
        assert json.loads(str(nxt["state"])) == fallback and not nxt["done"].item()
        assert next(t for t in env.transform if isinstance(t, ReadState)).unread == 2
    finally:
        env.close()
        registry.unregister("backend", "standin_unreadable_state")


# -- lone surrogates ------------------------------------------------------------------------------------------------
def test_lone_surrogate_in_a_response_does_not_crash_the_step(local):
    nxt = local.step(response="```\necho \ud800 x\udc80y\n```")
    assert not nxt[local.layout.retry].item()
    assert str(nxt[local.layout.observation]) == "\ufffd x\ufffdy"
    # a surrogate pair a decoder left as two code points is the character it stands for
    assert local.run("echo \ud83d\ude00") == "\U0001f600"
    assert local.run("echo 'caf\u00e9 \u6f22'") == "caf\u00e9 \u6f22"  # valid text is untouched


# -- insert without end_of_insert -----------------------------------------------------------------------------------
def test_insert_without_end_of_insert_runs_nothing(local):
    local.run("open strategy.py")
    before = local.run("cat strategy.py")
    steps = local.env.base_env.backend.current_step
    nxt = local.step("insert 3\ntouch ran\nimport os")
    assert nxt[local.layout.retry].item()  # a format error: the backend was not stepped
    assert local.env.base_env.backend.current_step == steps
    assert local.run("test -e ran && echo ran || echo nothing ran") == "nothing ran"
    assert local.run("cat strategy.py") == before
    # with its terminator the same insert works
    nxt = local.step("insert 3\nimport os\nend_of_insert")
    assert not nxt[local.layout.retry].item()
    assert "import os" in local.run("cat strategy.py")
