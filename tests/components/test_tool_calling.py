"""Native tool calling: the tools' schemas, the ``tool_calls`` parser, episodes through the openai policy, replay and
tokens-mode rendering with a tool-aware chat template.

``transformers serve`` accepts ``tools`` and tool messages, but the tiny random model it serves has no response
template, so it never answers with ``tool_calls``: the episodes that need calls on demand talk to the scripted
OpenAI-compatible endpoint of ``test_openai_policy`` (the real ``openai`` client on the wire format), and the real
server is checked to accept a tool-calling request.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from model_server import MODEL, Endpoint

from mlgym_registry import FormatError, registry
from mlgym_registry.cli import main as cli_main
from mlgym_registry.components.tool_calling import (
    ToolCallParser,
    encode_call,
    structured_messages,
    tool_names,
    tool_schemas,
)
from mlgym_registry.policies import make_policy
from mlgym_registry.records.trajectories import load_results, load_traj

pytest.importorskip("openai")

TASK = "prisonersDilemma"

ALWAYS_DEFECT = "    return 1\n"


# -- the tools and the parser ----------------------------------------------------------------------------------------
def test_the_tools_come_from_the_tool_set_docs():
    from mlgym_registry.backends.local.toolset import commands

    assert tool_names() == [c["name"] for c in commands()] + ["bash"]
    edit = next(t["function"] for t in tool_schemas() if t["function"]["name"] == "edit")
    assert edit["parameters"]["required"] == ["start_line", "end_line", "replacement_text"]
    assert edit["parameters"]["properties"]["start_line"]["type"] == "integer"
    scroll = next(t["function"] for t in tool_schemas() if t["function"]["name"] == "scroll_down")
    assert "1000 lines" in scroll["description"]  # {WINDOW} filled in


@pytest.mark.parametrize(("name", "arguments", "action"), [
    ("open", {"path": "strategy.py"}, "open strategy.py"),
    ("open", {"path": "my file.py", "line_number": 12}, "open 'my file.py' 12"),
    ("goto", {"line_number": "7"}, "goto 7"),
    ("search_dir", {"search_term": "row strategy"}, "search_dir 'row strategy'"),
    ("edit", {"start_line": 2, "end_line": 3, "replacement_text": "x = 1\n"}, "edit 2:3\nx = 1\nend_of_edit"),
    ("insert", {"line_number": 0, "text_to_add": "import os"}, "insert 0\nimport os\nend_of_insert"),
    ("validate", {}, "validate"),
    ("bash", {"command": "ls -a | head"}, "ls -a | head"),
])
def test_a_call_becomes_the_command_line_of_the_text_language(name, arguments, action):
    parser = ToolCallParser()
    thought, parsed = parser("Next step.\n" + encode_call(name, json.dumps(arguments), "call_1"))
    assert (thought, parsed) == ("Next step.", action)
    assert parser(encode_call(name, arguments))[1] == action  # arguments as an object (tokens mode)
    assert parser(parser.format_action("ls -a"))[1] == "ls -a"


@pytest.mark.parametrize(("response", "error"), [
    ("I will just think.", "No tool call found"),
    (encode_call("rm_everything", {}), "Unknown tool 'rm_everything'"),
    (encode_call("open", '{"path": "a.py"'), "not valid JSON"),
    (encode_call("open", "[1, 2]"), "must be a JSON object"),
    (encode_call("open", {}), "misses its required argument(s) 'path'"),
    (encode_call("goto", {"line_number": "ten"}), "must be an integer"),
    (encode_call("open", {"path": "a.py", "mode": "r"}), "takes no argument 'mode'"),
    (encode_call("validate", {}) + encode_call("submit", {}), "2 tool calls"),
    ("<tool_call>\n{not json\n</tool_call>", "not valid JSON"),
])
def test_malformed_calls_are_format_errors(response, error):
    with pytest.raises(FormatError) as caught:
        ToolCallParser()(response)
    assert error in str(caught.value)


def test_a_made_up_exit_is_read_as_its_action():
    from mlgym_registry.policies.base import fenced

    assert ToolCallParser()(fenced("Exit due to context window", "exit_context"))[1].strip() == "exit_context"
    with pytest.raises(FormatError):
        ToolCallParser()(fenced("Look around", "ls"))


def test_structured_messages_pair_each_call_with_its_answer():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "T"},
                {"role": "assistant", "content": "Look.\n" + encode_call("bash", '{"command": "ls"}', "c7")},
                {"role": "tool", "content": "a.py"},
                {"role": "assistant", "content": encode_call("validate", {})},
                {"role": "tool", "content": "score"}]
    wire = structured_messages(messages, json_arguments=True)
    assert wire[2] == {"role": "assistant", "content": "Look.", "tool_calls": [
        {"id": "c7", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}
    assert wire[3] == {"role": "tool", "tool_call_id": "c7", "content": "a.py"}
    assert wire[5]["tool_call_id"] == wire[4]["tool_calls"][0]["id"] == "call_4_0"
    assert structured_messages(messages)[2]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}


# -- an episode through the openai policy ----------------------------------------------------------------------------
def tool_reply(*calls: tuple[str, Any], content: str | None = None) -> dict[str, Any]:
    """A 200 whose message holds ``calls`` (name, arguments as given: a JSON string, possibly malformed)."""
    tool_calls = [{"id": f"call_{abs(hash((name, str(args)))) % 10**8}", "type": "function",
                   "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                  for name, args in calls]
    return {"status": 200, "body": {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
    }}


def text_reply(text: str) -> dict[str, Any]:
    return {"status": 200, "body": {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
    }}


EPISODE = [
    tool_reply(("open", {"path": "strategy.py"}), content="Let me read the strategy."),
    tool_reply(("open", '{"path": "strategy.py"')),                        # bad JSON arguments
    tool_reply(("delete_everything", {})),                                  # unknown tool
    tool_reply(("edit", {"start_line": 12, "end_line": 24, "replacement_text": ALWAYS_DEFECT})),
    text_reply("I think I am done."),                                       # no call at all
    tool_reply(("validate", {}), ("submit", {})),                           # two calls where one is allowed
    tool_reply(("validate", {})),
    tool_reply(("submit", {})),
]


def run_cli(*arguments: str, capsys) -> None:
    status = cli_main(list(arguments))
    assert status == 0, capsys.readouterr().err


@pytest.mark.slow
def test_an_episode_of_native_tool_calls_edits_validates_submits_and_replays(tmp_path, capsys):
    out = tmp_path / "run"
    with Endpoint(EPISODE) as endpoint:
        run_cli("run", TASK, "--policy", f"openai:{MODEL}", "--base-url", endpoint.url, "--parser", "tool_calls",
                "--template", "tool_calling", "--seed", "0", "--out", str(out), "--quiet", capsys=capsys)
    requests = endpoint.requests
    assert len(requests) == len(EPISODE)
    assert [t["function"]["name"] for t in requests[0]["tools"]] == tool_names()
    assert "tool_choice" not in requests[0]
    # every call is answered by a tool message with its id; a reply without a call by a user message
    last = requests[-1]["messages"]
    ids = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert answered == ids and len(ids) == 7
    assert last[2]["content"] == "Let me read the strategy."
    assert "[File: /home/agent/workspace/strategy.py (24 lines total)]" in last[3]["content"]
    errors = [m["content"] for m in last[4:] if "could not be used" in (m["content"] or "")]
    assert len(errors) == 5 and len(set(errors)) == 4  # both calls of the two-call reply are answered
    for fragment in ("not valid JSON", "Unknown tool 'delete_everything'", "No tool call found", "2 tool calls"):
        assert any(fragment in error for error in errors), fragment
    assert [m["role"] for m in last].count("user") == 2  # the task, and the answer to the reply without a call

    trajectory = load_traj(out / f"{TASK}.traj")
    steps = trajectory.steps
    assert [s.action.split("\n")[0] for s in steps] == [
        "open strategy.py", "", "", "edit 12:24", "", "", "validate", "submit"]
    validated = steps[6].observation
    assert "Evaluation Score: {'Score': " in validated
    assert "return 1" in steps[3].observation  # the edit landed
    assert [m["role"] for m in trajectory.history].count("tool") == 7
    score = load_results(out / "results.json")["agent"]
    assert score and score != trajectory.info.get("baseline")

    # the .traj replays to the same score
    again = tmp_path / "again"
    run_cli("run", TASK, "--policy", f"replay:{out / f'{TASK}.traj'}", "--parser", "tool_calls", "--template",
            "tool_calling", "--seed", "0", "--out", str(again), "--quiet", capsys=capsys)
    assert load_results(again / "results.json")["agent"] == score
    assert [s.action for s in load_traj(again / f"{TASK}.traj").steps] == [s.action for s in steps]

    report = tmp_path / "report"
    run_cli("report", str(out), "--out", str(report), "--no-plot", capsys=capsys)


# -- tokens mode: a tool-aware chat template ---------------------------------------------------------------------
def test_tokens_mode_renders_tools_calls_and_tool_messages_through_the_chat_template():
    from torchrl.data.llm.history import _CHAT_TEMPLATES

    from mlgym_registry.testing.tiny_model import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = _CHAT_TEMPLATES["qwen"]  # renders tools, tool_calls and tool messages
    env = registry.make(TASK, parser="tool_calls", template="tool_calling", tokenizer=tokenizer, input_mode="tokens")
    try:
        td = env.reset()
        prompt = first(td["text", "prompt"])
        assert "# Tools" in prompt and '"name": "validate"' in prompt
        response = "Measure first.\n" + encode_call("validate", {})
        td["text", "response"] = [response]
        td = env.step_mdp(env.step(td))
        history = td["history", "prompt"]
        assert history.role[0][-2:] == ["assistant", "tool"]
        prompt = first(td["text", "prompt"])
        expected = tokenizer.apply_chat_template(
            structured_messages([{"role": r, "content": c} for r, c in zip(history.role[0], history.content[0],
                                                                           strict=True)]),
            tools=list(tool_schemas()), tokenize=False, add_generation_prompt=True)
        assert prompt == expected
        assert '<|im_start|>assistant\nMeasure first.\n<tool_call>\n{"name": "validate", "arguments": {}}' in prompt
        assert "<tool_response>\nYour code produced a valid submission artefact" in prompt
        tokens = td["tokens", "prompt"][0].tolist()
        assert tokenizer.decode(tokens) == tokenizer.decode(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    finally:
        env.close()


def first(value: Any) -> str:
    """The one env's text of a batched non-tensor entry."""
    return value if isinstance(value, str) else value[0]


# -- a real server ---------------------------------------------------------------------------------------------------
@pytest.mark.serve
@pytest.mark.slow
def test_transformers_serve_accepts_a_tool_calling_conversation(served):
    policy = make_policy(f"openai:{served.model}", base_url=served.url, max_tokens=8, temperature=0)
    policy.reset(tool_spec())
    assert policy.tools and policy.tools[0]["function"]["name"] == "open"
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Look around."},
                {"role": "assistant", "content": "First, the files.\n" + encode_call("bash", '{"command": "ls"}',
                                                                                     "call_9")},
                {"role": "tool", "content": "strategy.py"}]
    before = served.chat_requests()
    answer = policy(messages)
    assert isinstance(answer, str) and served.chat_requests() == before + 1
    assert policy.last_call()["finish_reason"] in ("stop", "length")
    policy.close()


def tool_spec():
    """The task's spec with the ``tool_calls`` parser (what ``--parser tool_calls`` gives ``run``)."""
    from mlgym_registry.commands.run import with_changes

    return with_changes(registry.spec(TASK), components={"parser": "tool_calls"})
