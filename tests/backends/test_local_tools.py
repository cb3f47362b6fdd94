"""The local backend's tool commands: MLGym's window format and arithmetic, edit/insert with lint rollback, search."""

from __future__ import annotations

import pytest
from test_local_backend import tiny_spec

from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.records.observation_kinds import observation_kind


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    backend = LocalBackend(tiny_spec(tmp_path_factory.mktemp("tools")))
    backend.reset()
    backend.install_tools()
    yield backend
    backend.close()


@pytest.fixture
def tools(env):
    env.reset()  # tools stay installed across resets
    return env


def window_lines(first: int, last: int, text=lambda i: f"line {i}") -> list[str]:
    return [f"{i}:{text(i)}" for i in range(first, last + 1)]


def test_open_a_long_file_and_move_around(tools):
    tools.communicate("seq -f 'line %g' 1 2000 > long.txt")
    path = f"{tools.task_workspace}/long.txt"
    obs = tools.communicate('open "long.txt"')
    assert obs.split("\n") == [f"[File: {path} (2000 lines total)]", *window_lines(1, 1000), "(1000 more lines below)"]
    obs = tools.communicate("goto 1500")
    header = f"[File: {path} (2000 lines total)]"
    assert obs.split("\n") == [header, "(1000 more lines above)", *window_lines(1001, 2000)]
    obs = tools.communicate("scroll_up")
    assert obs.split("\n")[:3] == [f"[File: {path} (2000 lines total)]", "(2 more lines above)", "3:line 3"]
    assert obs.split("\n")[-2:] == ["1002:line 1002", "(998 more lines below)"]
    obs = tools.communicate('open "long.txt" 700')
    assert obs.split("\n")[1:3] == ["(534 more lines above)", "535:line 535"]
    assert tools.communicate("goto 2001") == "Error: the file has only 2000 lines; pick a line number up to 2000"


def test_small_window_and_scroll_warning(tools):
    tools.communicate("seq -f 'row %g' 1 30 > rows.txt")
    tools.communicate("WINDOW=10")
    first = tools.step('open "rows.txt"')[0].split("\n")
    assert first[1:] == window_lines(1, 10, lambda i: f"row {i}") + ["(20 more lines below)"]
    assert tools.step("scroll_down")[0].split("\n")[1:3] == ["(8 more lines above)", "9:row 9"]
    tools.step("scroll_down")
    third = tools.step("scroll_down")[0]
    assert "WARNING: scrolling again and again is a slow way to read a file." in third
    assert "WARNING" not in tools.step('open "rows.txt"')[0]


def test_open_errors(tools):
    assert tools.communicate('open "missing.py"') == "File missing.py not found"
    assert tools.communicate("open data").startswith("Error: data is a directory")
    assert tools.communicate("open").startswith("Usage: open")
    assert tools.communicate("goto 3").startswith("No file is open.")
    assert tools.communicate('open "strategy.py" x').split("\n")[0] == 'Usage: open "<path>" [<line_number>]'


def test_create_and_insert(tools):
    obs = tools.communicate("create notes.py")
    assert obs.split("\n") == [f"[File: {tools.task_workspace}/notes.py (1 lines total)]", "1:"]
    assert tools.communicate("create notes.py").startswith("Error: File 'notes.py' already exists")
    obs = tools.communicate("insert 1 << 'end_of_insert'\nimport os\nprint(os.getcwd())\nend_of_insert")
    assert obs.split("\n")[1:4] == ["1:", "2:import os", "3:print(os.getcwd())"]
    assert obs.split("\n")[-1].startswith("File updated.")
    assert (tools.host_workspace / "notes.py").read_text() == "\nimport os\nprint(os.getcwd())\n"


def test_edit_rejected_on_new_lint_errors_and_rolled_back(tools):
    tools.communicate('open "strategy.py"')
    before = (tools.host_workspace / "strategy.py").read_text()
    obs = tools.communicate("edit 6:6 << 'end_of_edit'\n    return undefined_name\nend_of_edit")
    assert observation_kind(obs) == "lint_rejection"
    lines = obs.split("\n")
    assert lines[1:3] == ["ERRORS:", "- F821 undefined name 'undefined_name'"]
    assert "This is how your edit would have looked if applied" in lines
    assert "This is the original code before your edit" in lines
    assert "6:    return undefined_name" in lines and "6:    return 0" in lines
    assert (tools.host_workspace / "strategy.py").read_text() == before


def test_pre_existing_errors_do_not_block_an_edit(tools):
    tools.communicate("printf 'x = missing\\n\\ny = 1\\n' > old.py")
    tools.communicate('open "old.py"')
    obs = tools.communicate("edit 3:3 << 'end_of_edit'\ny = 2\nz = 3\nend_of_edit")
    assert observation_kind(obs) == "file_window" and "File updated." in obs
    assert (tools.host_workspace / "old.py").read_text() == "x = missing\n\ny = 2\nz = 3\n"
    obs = tools.communicate("edit 1:1 << 'end_of_edit'\nx = still_missing\nend_of_edit")
    assert "- F821 undefined name 'still_missing'" in obs  # an error inside the edited lines counts as new


def test_an_edit_of_a_file_in_another_encoding_keeps_its_bytes_and_its_old_errors_stay_old(tools):
    tools.communicate("printf '# -*- coding: latin-1 -*-\\nx = missing\\nname = \"\\351t\\351\"\\ny = 1\\n' > old1.py")
    tools.communicate('open "old1.py"')
    obs = tools.communicate("edit 4:4 << 'end_of_edit'\ny = 2\nend_of_edit")
    assert observation_kind(obs) == "file_window" and "File updated." in obs
    assert (tools.host_workspace / "old1.py").read_bytes() == (
        b"# -*- coding: latin-1 -*-\nx = missing\nname = \"\xe9t\xe9\"\ny = 2\n")


def test_edit_of_non_python_file_is_not_linted(tools):
    tools.communicate("printf 'a\\nb\\nc\\n' > plain.txt")
    tools.communicate('open "plain.txt"')
    obs = tools.communicate("edit 2:3 << 'end_of_edit'\nB (\nend_of_edit")
    assert obs.split("\n")[:3] == [f"[File: {tools.task_workspace}/plain.txt (2 lines total)]", "1:a", "2:B ("]


def test_edit_usage_and_read_only(tools):
    tools.communicate('open "strategy.py"')
    assert tools.communicate("edit 3 << 'end_of_edit'\nx\nend_of_edit") == "Usage: edit <start_line>:<end_line>"
    assert tools.communicate("edit a:3 << 'end_of_edit'\nx\nend_of_edit").split("\n")[1].startswith("Error: start_line")
    tools.communicate('open "evaluate.py"')
    obs = tools.communicate("edit 1:1 << 'end_of_edit'\nprint(1)\nend_of_edit")
    assert obs == f"Error: You cannot edit read-only file {tools.task_workspace}/evaluate.py"
    assert tools.returncode == 1
    assert observation_kind(obs) == "read_only_edit"


def test_search_and_find(tools):
    ws = tools.task_workspace
    obs = tools.communicate("search_dir row_strategy")
    assert obs.split("\n") == [
        f'Found 3 matches for "row_strategy" in {ws}:',
        f"{ws}/evaluate.py (2 matches)",
        f"{ws}/strategy.py (1 matches)",
        f'End of matches for "row_strategy" in {ws}',
    ]
    assert tools.communicate("search_dir nothing_like_this").startswith('No matches found for "nothing_like_this"')
    obs = tools.communicate("search_file PAYOFF evaluate.py")
    assert obs.split("\n") == [
        f'Found 2 matches for "PAYOFF" in {ws}/evaluate.py:',
        "Line 7:PAYOFF = {(0, 0): 3, (0, 1): 0, (1, 0): 5, (1, 1): 1}",
        "Line 12:    total += PAYOFF[move]",
        f'End of matches for "PAYOFF" in {ws}/evaluate.py',
    ]
    assert tools.communicate("find_file '*.txt'").split("\n") == [
        f'Found 1 matches for "*.txt" in {ws}:',
        f"{ws}/data/numbers.txt",
    ]


def test_observation_kinds_of_the_env_messages():
    assert observation_kind(None) == "empty" and observation_kind("") == "empty"
    assert observation_kind("Exited (submit)") == "submitted"
    assert observation_kind("Exited (max_steps)") == "exit"
    assert observation_kind("/bin/bash: line 5: syntax error near unexpected token `('") == "syntax_error"
    timed_out = "\nEXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 25 SECONDS."
    assert observation_kind(timed_out) == "timeout"
    assert observation_kind("Malformed edit command. Please ensure ...") == "malformed_edit"
    assert observation_kind("Failed to decode metrics from evaluation script. Output:\n---\nx\n---") == "validate_error"
    assert observation_kind("total 12\n-rw-r--r-- 1 a b 1 x") == "plain"
