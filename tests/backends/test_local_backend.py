"""End-to-end behaviour of the local backend on a tiny task written here (MLGym's step contract, evaluation, tools)."""

from __future__ import annotations

import ast
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import run_python
from outside_data import RECORDED, TRAJECTORIES, missing_recorded_runs

from mlgym_registry import seeding
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.protocol import INFO_KEYS, Backend
from mlgym_registry.records import observation_kinds, recorded_files
from mlgym_registry.records.observation_kinds import KINDS, observation_kind
from mlgym_registry.specs import TaskSpec
from mlgym_registry.tasks.mlgym_source import task_header

STRATEGY = textwrap.dedent(
    '''\
    """Row player of a tiny repeated game."""


    def row_strategy(history):
        """Always cooperate."""
        return 0
    '''
)
TARGET = "def target_column_strategy(history):\n    return 0\n"
EVALUATE = textwrap.dedent(
    """\
    import json
    import os

    from strategy import row_strategy
    from target import target_column_strategy

    PAYOFF = {(0, 0): 3, (0, 1): 0, (1, 0): 5, (1, 1): 1}
    history = []
    total = 0
    for _ in range(10):
        move = (row_strategy(history), target_column_strategy(history))
        total += PAYOFF[move]
        history.append(move)
    result = {"Score": total / 10}
    print(json.dumps(result))
    """
)
DEFECT = "edit 4:6 << 'end_of_edit'\ndef row_strategy(history):\n    return 1\nend_of_edit"


def tiny_spec(tmp_path: Path, **changes) -> TaskSpec:
    """A PythonSubmissionTasks task in ``tmp_path``: cooperate-vs-cooperate scores 3.0, defecting scores 5.0."""
    source = tmp_path / "task_src"
    (source / "data_src").mkdir(parents=True)
    (source / "strategy.py").write_text(STRATEGY)
    (source / "target.py").write_text(TARGET)
    (source / "evaluate.py").write_text(EVALUATE)
    (source / "data_src" / "numbers.txt").write_text("1\n2\n3\n")
    fields = dict(
        id="tinyGame",
        name="Tiny game",
        description="Write row_strategy.\n{dataset_docs}Good luck.",
        task_entrypoint="PythonSubmissionTasks",
        training_timeout=120,
        starter_code=["strategy.py", "target.py", "evaluate.py"],
        datasets=[{"name": "numbers", "description": "three numbers", "data_path": "data_src", "is_local": True}],
        baseline_scores=[{"Score": 3.0}],
        evaluation_paths=["evaluate.py"],
        evaluation_read_only=True,
        protected_files=["target.py"],
        max_steps=10,
        root=str(source),
    )
    fields.update(changes)
    return TaskSpec(**fields)


@pytest.fixture
def backend(tmp_path):
    env = LocalBackend(tiny_spec(tmp_path))
    env.reset()
    env.install_tools()
    yield env
    env.close()


def test_reset_contract(tmp_path):
    env = LocalBackend(tiny_spec(tmp_path))
    try:
        assert env.task is None and env.name == "mlgym_main"
        assert env.reset() == ({"observation": None}, {})
        assert isinstance(env, Backend)
        assert env.current_step == 0 and env.max_steps == 10
        assert env.task.args.description == "Write row_strategy.\nNUMBERS:\nthree numbers\n\nGood luck."
        assert env.task.args.training_timeout == 120
        names = sorted(p.name for p in env.host_workspace.iterdir())
        assert names == ["data", "evaluate.py", "strategy.py", "target.py"]
        assert (env.host_workspace / "data" / "numbers.txt").read_text() == "1\n2\n3\n"
        assert env.communicate("pwd") == str(env.task_workspace)
        assert env.communicate("which python flake8").split("\n") == [
            str(Path(os.sys.executable).parent / "python"),
            str(Path(os.sys.executable).parent / "flake8"),
        ]
    finally:
        env.close()


def test_reset_gives_a_fresh_workspace_and_step_count(backend):
    backend.step("touch leftover.txt")
    backend.step("validate")
    backend.reset()
    assert backend.current_step == 0
    assert not (backend.host_workspace / "leftover.txt").exists()
    _, _, _, info = backend.step("echo fresh")
    assert info["score"] == []


def test_ls_lists_starter_files(backend):
    obs, reward, done, info = backend.step("ls -a")
    assert obs.split("\n") == [".", "..", "data", "evaluate.py", "strategy.py", "target.py"]
    assert (reward, done) == (0, False)
    assert tuple(info) == INFO_KEYS
    assert backend.current_step == 1


def test_state_and_open_window(backend):
    ws = backend.task_workspace
    assert json.loads(backend.communicate("state")) == {"open_file": "n/a", "working_dir": str(ws)}
    obs, *_ = backend.step('open "strategy.py"')
    lines = STRATEGY.rstrip("\n").split("\n")
    expected = [f"[File: {ws}/strategy.py ({len(lines)} lines total)]"]
    expected += [f"{i}:{text}" for i, text in enumerate(lines, 1) if f"{i}:{text}"]
    assert obs == "\n".join(expected)
    assert json.loads(backend.communicate("state")) == {"open_file": f"{ws}/strategy.py", "working_dir": str(ws)}


def test_guarded_edit_validate_submit(backend):
    ws = backend.task_workspace
    backend.step('open "strategy.py"')
    obs, _, done, _ = backend.step(DEFECT)
    assert not done
    assert obs.startswith(f'[File: {ws}/strategy.py (5 lines total)]\n1:"""Row player of a tiny repeated game."""\n')
    assert "4:def row_strategy(history):\n5:    return 1\nFile updated." in obs
    assert (backend.host_workspace / "strategy.py").read_text().endswith("def row_strategy(history):\n    return 1\n")

    obs, reward, done, info = backend.step("validate")
    assert obs == (
        f"Your code produced a valid submission artefact at {ws}/target.py.\n"
        "Baseline Score: {'Score': 3.0}\nEvaluation Score: {'Score': 5.0}"
    )
    assert (reward, done, info["score"], info["exit_status"]) == (0, False, [{"Score": 5.0}], "")

    obs, reward, done, info = backend.step("submit")
    assert (obs, reward, done) == ("Exited (submit)", 0, True)
    assert info["exit_status"] == "submitted"
    assert info["submission"] == f"{ws}/target.py"
    assert info["score"] == [{"Score": 5.0}, {"Score": 5.0}]


def test_the_next_evaluation_is_started_ahead_and_scores_the_workspace_as_it_is_at_validate(tmp_path):
    """After a validate the episode's next evaluation waits, started (its sandboxes and interpreters up, the modules
    the last one imported loaded); it scores what the workspace holds when the agent validates again, and reset and
    close end it."""
    spec = tiny_spec(tmp_path)
    evaluate = Path(spec.root) / "evaluate.py"
    evaluate.write_text("import fractions\n" + evaluate.read_text())
    backend = LocalBackend(spec)
    backend.reset()
    backend.install_tools()
    assert backend.step("validate")[3]["score"] == [{"Score": 3.0}]
    started = backend._res.evaluation
    assert started is not None and started.waiting()
    assert not any(started.agent_view.iterdir()) and not any(started.eval_view.iterdir())  # nothing copied yet
    assert "fractions" in backend._preload and "--preload" in started.proc.args
    backend.step('open "strategy.py"')
    backend.step(DEFECT)
    assert backend.step("validate")[3]["score"] == [{"Score": 3.0}, {"Score": 5.0}]
    assert started.proc.poll() is not None and not started.scratch.exists()  # used, then ended
    following = backend._res.evaluation
    assert following is not None and following is not started and following.waiting()
    backend.reset()  # a new episode, with another evaluation seed: what was started for the last one ends
    assert following.proc.poll() is not None and following.runner.poll() is not None
    assert backend._res.evaluation is None and not following.scratch.exists()
    backend.install_tools()
    backend.step("validate")
    last = backend._res.evaluation
    backend.close()
    assert last.proc.poll() is not None and last.runner.poll() is not None


def test_validate_without_baseline(tmp_path):
    with LocalBackend(tiny_spec(tmp_path, baseline_scores=[])) as env:
        env.reset()
        env.install_tools()
        obs, *_ = env.step("validate")
        assert "\nBaseline Score: NA (no baseline was there)\nEvaluation Score: {'Score': 3.0}" in obs


def test_max_steps_autosubmits_without_running_the_action(tmp_path):
    with LocalBackend(tiny_spec(tmp_path, max_steps=2)) as env:
        env.reset()
        env.install_tools()
        assert env.step("echo one")[2] is False
        assert env.step("echo two")[2] is False
        obs, reward, done, info = env.step("touch should_not_exist")
        assert (obs, done) == ("Exited (max_steps)", True)
        assert info["exit_status"] == "autosubmission (max_steps)"
        assert info["submission"] == f"{env.task_workspace}/target.py"
        assert info["score"] == [{"Score": 3.0}]
        assert not (env.host_workspace / "should_not_exist").exists()
        assert env.current_step == 3


def test_special_actions(backend):
    assert backend.step("  skip \n")[:3] == ("Skipped", 0, True)
    assert backend.step("skip")[3]["exit_status"] == "skipped"
    obs, _, done, info = backend.step("exit_forfeit")
    assert (obs, done, info["exit_status"], info["score"]) == ("Exited (exit_forfeit)", True, "exit_forfeit", [])
    for action in ("exit_context", "exit_cost", "exit_error", "exit_format", "exit_api"):
        obs, _, done, info = backend.step(action)
        assert (obs, done, info["exit_status"]) == (f"Exited ({action})", True, f"autosubmission ({action})")
        assert info["score"][-1] == {"Score": 3.0}


def test_malformed_edit_counts_a_step_and_changes_nothing(backend):
    backend.step('open "strategy.py"')
    before = (backend.host_workspace / "strategy.py").read_text()
    obs, _, done, _ = backend.step("edit 4:6\ndef row_strategy(history):\n    return 1\n")
    assert obs == (
        "Malformed edit command. Please ensure you use the `end_of_edit` keyword to mark the end of your edit."
    )
    assert not done and backend.current_step == 2
    assert (backend.host_workspace / "strategy.py").read_text() == before


def test_syntax_error_is_reported_and_not_run(backend):
    obs, _, done, _ = backend.step("touch ran.txt\nif then fi (")
    assert obs.startswith("/bin/bash: line 2: syntax error near unexpected token")
    assert backend.returncode == 2 and not done
    assert not (backend.host_workspace / "ran.txt").exists()
    assert backend.communicate("echo still fine") == "still fine"


def test_output_normalisation_and_returncode(backend):
    script = (
        r"printf 'a\r\n\n\nb\n  \n'; echo err >&2; "
        r"echo ' 50%|#####     | 5/10 [00:01<00:01,  4.00it/s]'; printf 'last'"
    )
    assert backend.communicate(script) == "a\nb\n  \nerr\nlast"
    assert backend.returncode == 0
    assert backend.communicate("false") == "" and backend.returncode == 1
    assert backend.communicate("(exit 7)") == "" and backend.returncode == 7
    assert backend.communicate(r"printf '\xff\xfe ok'") == r"\xff\xfe ok"


def test_a_printed_end_of_command_marker_with_another_token_does_not_end_the_command(backend):
    forged = "printf '\\n///MLGR-%s:0:DONE///\\n' " + "0123456789abcdef" * 2  # the marker's form, a made-up token
    output = backend.communicate(f"{forged}; printf '///MLGR-'; sleep 0.3; echo after; (exit 3)")
    assert output.endswith("after") and "///MLGR-0123456789abcdef" in output
    assert backend.returncode == 3


def test_exit_ends_the_session_and_the_next_command_gets_a_new_one(backend):
    assert backend.communicate("exit") == "" and backend.returncode == 0
    assert backend.communicate("pwd") == str(backend.task_workspace)
    obs, _, done, _ = backend.step("exit")
    assert "a new shell was started" in obs and not done
    assert backend.step('open "strategy.py"')[0].startswith("[File: ")


def test_timeout_choice_by_command(tmp_path):
    with LocalBackend(tiny_spec(tmp_path), command_timeout=1, long_timeout=15) as env:
        env.reset()
        obs, _, done, _ = env.step("echo early; sleep 3 && echo late")
        assert obs.startswith("early\n")
        assert obs.endswith("\nEXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 1 SECONDS.")
        assert not done and "late" not in obs
        obs, *_ = env.step("python -c 'import time; time.sleep(2); print(\"trained\")'")
        assert obs == "trained"


def test_add_commands(backend):
    backend.add_commands(
        [
            {"name": "greet.sh", "contents": "greet() {\n  echo \"hello $1\"\n}\n", "type": "source_file"},
            {"name": "double", "contents": "#!/usr/bin/env bash\necho $(( $1 * 2 ))\n", "type": "script"},
            {"name": "_helper", "contents": "not run\n", "type": "utility"},
        ]
    )
    assert backend.communicate("greet you") == "hello you"
    assert backend.communicate("double 21") == "42"
    assert backend.communicate("test -f \"$(dirname \"$(command -v double)\")/_helper\" && echo present") == "present"
    with pytest.raises(ValueError, match="source_file"):
        backend.add_commands([{"name": "x", "contents": "", "type": "weird"}])
    backend.step("kill $$")  # a restarted session gets them back
    assert backend.communicate("greet again") == "hello again"


def test_a_derived_seed_reaches_the_evaluator_only(tmp_path):
    """The evaluator gets the episode's evaluation seed (derived from the user's seed, the episode's index and the
    installation key; under the old variable name too), the agent's shell no seed at all; later resets continue the
    seed's stream."""
    spec = tiny_spec(tmp_path)
    reporting = ('env = os.environ\n'
                 'result.update(Seed=int(env["MLGYM_REGISTRY_EVAL_SEED"]), Old=int(env["MLGYM_REGISTRY_SEED"]))\n')
    evaluate = tmp_path / "task_src" / "evaluate.py"
    evaluate.write_text(EVALUATE.replace("print(json.dumps(result))", reporting + "print(json.dumps(result))"))
    with LocalBackend(spec, seed=1234) as env:
        for episode in range(2):
            env.reset()
            env.install_tools()
            _, _, _, info = env.step("validate")
            derived = seeding.derive("evaluation", 1234, episode)
            assert info["score"] == [{"Score": 3.0, "Seed": derived, "Old": derived}]
            assert env.communicate("env | grep -c SEED") == "0"


def test_python_option_gives_the_shell_and_the_evaluator_another_interpreter(tmp_path):
    task_env = tmp_path / "task-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(task_env)], check=True)
    spec = tiny_spec(tmp_path)
    evaluator = Path(spec.root) / "evaluate.py"
    evaluator.write_text(
        "import json, sys\nprint(json.dumps({'Score': 1.0 if sys.prefix.endswith('task-env') else 0.0}))\n"
    )
    with LocalBackend(spec, python=str(task_env / "bin" / "python")) as env:
        env.reset()
        env.install_tools()
        assert env.communicate("python -c 'import sys; print(sys.prefix)'") == str(task_env)
        assert env.communicate("echo $VIRTUAL_ENV") == str(task_env)
        assert env.step("validate")[3]["score"] == [{"Score": 1.0}]
        # the tools keep running on the registry's own interpreter, which has flake8
        env.step('open "strategy.py"')
        assert "File updated" in env.step(DEFECT)[0]


def test_python_option_that_is_not_an_interpreter_is_refused(tmp_path):
    with pytest.raises(ValueError, match="python='no-such-python-here'.*path of a Python interpreter"):
        LocalBackend(tiny_spec(tmp_path), python="no-such-python-here")


def test_command_docs_and_toolset(backend):
    tools = backend.install_tools()
    assert tools.state_command == "state"
    assert tools.env_variables["WINDOW"] == "1000" and tools.env_variables["CURRENT_FILE"] == ""
    docs = tools.command_docs
    names = [line[:-1] for line in docs.split("\n") if line and not line.startswith(" ")]
    assert names[:4] == ["open", "goto", "scroll_down", "scroll_up"]
    assert set(names) >= {"create", "edit", "insert", "search_dir", "search_file", "find_file", "submit", "validate"}
    assert '  signature: open "<path>" [<line_number>]\n  arguments:\n    - path (string) [required]: ' in docs
    assert "  signature: edit <start_line>:<end_line>\n<replacement_text>\nend_of_edit\n" in docs
    assert "moves the editor window 1000 lines" in docs


def write_task(tmp_path: Path, entrypoint: str, evaluate: str, starters: dict[str, str]) -> TaskSpec:
    source = tmp_path / "src"
    source.mkdir()
    (source / "evaluate.py").write_text(textwrap.dedent(evaluate))
    for name, text in starters.items():
        (source / name).write_text(text)
    return TaskSpec(
        id="t", task_entrypoint=entrypoint, training_timeout=60, starter_code=["evaluate.py", *starters],
        evaluation_paths=["evaluate.py"], evaluation_read_only=True, baseline_scores=[{"acc": 0.5}],
        root=str(source),
    )


def test_csv_task(tmp_path):
    spec = write_task(
        tmp_path,
        "CSVSubmissionTasks",
        """\
        import argparse, json
        parser = argparse.ArgumentParser()
        parser.add_argument("--submission_file")
        rows = open(parser.parse_args().submission_file).read().split()
        print(json.dumps({"acc": len(rows) / 4}))
        """,
        {},
    )
    with LocalBackend(spec) as env:
        env.reset()
        env.install_tools()
        obs, _, done, info = env.step("validate")
        assert obs.startswith("Submission artefact not found. You have to produce a valid submission artefact")
        assert not done and info["score"] == []
        env.step("printf 'a\\nb\\nc\\n' > submission.csv")
        obs, _, _, info = env.step("validate")
        assert obs.startswith(f"Your code produced a valid submission artefact at {env.task_workspace}/submission.csv.")
        assert info["score"] == [{"acc": 0.75}]
        env.step("rm submission.csv")
        obs, _, done, info = env.step("submit")
        assert (obs, done, info["exit_status"]) == ("Exited (submit)", True, "submission_not_found (submit)")


def test_model_task_reads_the_first_json_line(tmp_path):
    spec = write_task(
        tmp_path,
        "ModelSubmissionTasks",
        """\
        import argparse, json
        parser = argparse.ArgumentParser()
        parser.add_argument("--config_fname")
        name = parser.parse_args().config_fname
        print("loading", name.split("/")[-1])
        print(json.dumps({"reward": 1.5}))
        """,
        {"config.yaml": "lr: 0.1\n"},
    )
    with LocalBackend(spec) as env:
        env.reset()
        env.install_tools()
        obs, _, _, info = env.step("validate")
        assert obs.startswith(f"Your code produced a valid submission artefact at {env.task_workspace}/config.yaml.")
        assert info["score"] == [{"reward": 1.5}]


def test_evaluation_format_error(tmp_path):
    spec = write_task(tmp_path, "PythonSubmissionTasks", "print('no json here')\nraise SystemExit(3)\n", {})
    with LocalBackend(spec) as env:
        env.reset()
        env.install_tools()
        obs, _, done, info = env.step("validate")
        assert obs == (
            "Failed to decode metrics from evaluation script. Output:\n---\nno json here\n---\n"
            "Please make sure the evaluation script prints the metrics in json format."
        )
        assert not done and info["score"] == []
        obs, _, done, info = env.step("submit")
        assert (obs, done, info["exit_status"]) == ("Exited (submit)", True, "evaluation_format_error (submit)")


def test_lm_tasks_get_a_clear_message(tmp_path):
    spec = write_task(tmp_path, "LMSubmissionTasks", "print('{}')\n", {})
    with LocalBackend(spec) as env:
        env.reset()
        env.install_tools()
        obs, _, done, _ = env.step("validate")
        assert obs.startswith("Error: the local backend cannot evaluate LMSubmissionTasks tasks")
        assert "'mlgym' backend" in obs and not done


def test_aliases_file_is_sourced(tmp_path):
    aliases = tmp_path / "aliases.sh"
    aliases.write_text("alias ls='ls -F'\n")
    with LocalBackend(tiny_spec(tmp_path, aliases_file=str(aliases))) as env:
        env.reset()
        assert env.step("ls")[0].split("\n") == ["data/", "evaluate.py*", "strategy.py", "target.py"]


def test_make_override_signature_has_no_kwargs():
    import inspect

    params = inspect.signature(LocalBackend).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert {"command_timeout", "long_timeout", "max_output_chars", "memory_limit_mb", "cpu_seconds", "max_processes",
            "network", "seed", "workspace_dir"} <= set(params)


# -- fidelity against MLGym's recorded runs ---------------------------------------------------------------------------

_MULTILINE = {"edit": "end_of_edit", "insert": "end_of_insert"}
_COMMAND_PATTERNS = [
    *(re.compile(rf"^\s*({name})\s*(.*?)^({end})\s*$", re.DOTALL | re.MULTILINE) for name, end in _MULTILINE.items()),
    re.compile(r"^\s*(submit)(\s*)$", re.MULTILINE),
]


def mlgym_guard(action: str) -> str:
    """What MLGym's agent does to an action before ``env.step``: a heredoc on the first line of edit/insert blocks.

    Reproduced as MLGym behaves, including its slip that drops text before an edit in the same action.
    """
    parts, rest = [], action
    while rest.strip():
        matches = [m for m in (p.search(rest) for p in _COMMAND_PATTERNS) if m]
        if not matches:
            parts.append(rest)
            break
        match = min(matches, key=lambda m: m.start())
        before, hit, rest = rest[: match.start()], rest[match.start() : match.end()], rest[match.end() :]
        if before.strip():
            parts.append(before)
        if hit.strip() and match.re.groups >= 3 and not hit.split("\n")[0].strip().endswith(f"<< '{match[3]}'"):
            guarded = hit[match.start() :]
            first = guarded.split("\n")[0]
            parts.append(guarded.replace(first, f"{first} << '{match[3].strip()}'", 1))
        elif hit.strip():
            parts.append(hit)
    return "\n".join(parts)


def recorded_kind(step: dict, final: bool = False, exit_status: str = "") -> str:
    """The kind of a recorded step's observation (older MLGym recorded empty ones for evaluations)."""
    return observation_kinds.recorded_kind(step["observation"], step["action"], final=final, exit_status=exit_status)


def first_windows(path: Path) -> dict[str, str]:
    """Each file's text as shown by its first ``open`` in one recorded run, before the run touched it."""
    steps = json.loads(path.read_text())["trajectory"]
    return recorded_files.first_windows((step["action"], step["observation"]) for step in steps)


def recorded_starters(task_dir: Path, current: dict[str, str]) -> dict[str, dict[str, str]]:
    """Starter files as each recorded run saw them.

    Most runs predate the files in MLGym's repository (which later gained licence headers), so line numbers in their
    edits only fit the versions they saw. A run keeps the files it opened; for the others it gets the repository's
    ``current`` version when one of its files matches it, else the version most runs of the task saw.
    """
    runs = {path.name: first_windows(path) for path in sorted(task_dir.glob("*.traj"))}
    votes: dict[str, Counter] = {}
    for windows in runs.values():
        for name, text in windows.items():
            votes.setdefault(name, Counter())[text] += 1
    majority = {name: counter.most_common(1)[0][0] for name, counter in votes.items()}
    starters = {}
    for run, windows in runs.items():
        recent = any(current.get(name) == text for name, text in windows.items())
        starters[run] = {**(current if recent else majority), **windows}
    return starters


def task_file(checkout: Path, task_id: str) -> Path | None:
    """The checkout's task file of ``task_id`` (MLGym names most files after their id, not all)."""
    for path in sorted((checkout / "configs" / "tasks").glob("*.yaml")):
        try:
            if task_header(path)["id"] == task_id:
                return path
        except (ValueError, yaml.YAMLError):
            continue
    return None


def is_offline_task(checkout: Path, task_id: str) -> bool:
    """Whether the recorded runs of ``task_id`` can be reproduced here: a task that trains nothing and needs no
    dataset (MLGym's games). The others train on GPUs or download data, which this fidelity check cannot repeat."""
    path = task_file(checkout, task_id)
    if path is None:
        return False
    task = task_header(path)
    return task.get("task_entrypoint") == "PythonSubmissionTasks" and not task.get("dataset_configs")


def replay_task(task_dir: Path, checkout: Path, scratch: Path, training_timeout: int = 90) -> dict:
    """Every recorded action of one task's runs through a LocalBackend; observation kinds and score gaps. The task
    keeps MLGym's rules (its file as MLGym reads it: the opponent editable, as the runs found it) but is scored by our
    evaluation program where the overlay has one (``overlay_files``: the games' lockstep evaluate.py), whose files are
    never replaced by the versions a run saw."""
    from mlgym_registry.specs import load_task_yaml
    from mlgym_registry.tasks.mlgym_overlay import overlay_files

    task = load_task_yaml(task_file(checkout, task_dir.name), root=checkout)
    starter_code, protected = overlay_files(task.id, list(task.starter_code), list(task.protected_files))
    task = task.replace(starter_code=starter_code, protected_files=protected)
    overlay = {Path(item).name for item in task.starter_code if Path(item).is_absolute()}  # our program's files
    aliases = checkout / "dockerfiles" / "aliases.sh"
    steps = same = 0
    gaps: list[float] = []
    mismatches = []
    current = {Path(item).name: task.resolve_path(item).read_text() for item in task.starter_code}
    for run, starters in recorded_starters(task_dir, current).items():
        files = []
        for item in task.starter_code:
            name = Path(item).name
            if name in starters and name not in overlay:
                (scratch / run).mkdir(exist_ok=True)
                (scratch / run / name).write_text(starters[name])
                files.append(str(scratch / run / name))
            else:
                files.append(str(task.resolve_path(item)))
        spec = task.replace(
            starter_code=files, max_steps=50, training_timeout=training_timeout,
            aliases_file=str(aliases) if aliases.exists() else None,
        )
        with LocalBackend(spec) as env:
            env.reset()
            env.install_tools()
            recording = json.loads((task_dir / run).read_text())
            last, status = len(recording["trajectory"]) - 1, recording["info"].get("exit_status", "")
            for index, step in enumerate(recording["trajectory"]):
                observation, _, done, _ = env.step(mlgym_guard(step["action"]).strip())
                want, got = recorded_kind(step, index == last, status), observation_kind(observation)
                steps += 1
                same += want == got
                if want != got:
                    mismatches.append((run, index, want, got))
                elif want == "validate_score":
                    old = ast.literal_eval(step["observation"].rsplit("Evaluation Score: ", 1)[1])
                    new = ast.literal_eval(observation.rsplit("Evaluation Score: ", 1)[1])
                    gaps += [abs(old[key] - new[key]) for key in old if key in new]
                if done:
                    break
    return {"steps": steps, "same": same, "gaps": gaps, "mismatches": mismatches}


@pytest.mark.trajectories
def test_recorded_observations_all_have_a_kind():
    if not RECORDED:
        pytest.skip(missing_recorded_runs())
    kinds = Counter()
    for path in RECORDED:
        recording = json.loads(path.read_text())
        last, status = len(recording["trajectory"]) - 1, recording["info"].get("exit_status", "")
        for index, step in enumerate(recording["trajectory"]):
            kind = recorded_kind(step, index == last, status)
            kinds[kind] += 1
            # a last step's command may have been overtaken: autosubmission at max_steps, a crashed run
            if step["action"].strip() == "validate" and index != last:
                assert kind in ("validate_score", "validate_error"), step["observation"][:200]
            if re.match(r"^open\s+\"?[\w./]+\"?\s*$", step["action"].strip()) and index != last:
                assert kind in ("file_window", "plain"), step["observation"][:200]
    for kind in ("validate_score", "validate_error", "lint_rejection", "file_window", "submitted", "syntax_error"):
        assert kinds[kind] > 0, kinds
    assert set(kinds) <= set(KINDS)


@pytest.mark.slow
@pytest.mark.trajectories
def test_replay_recorded_trajectories(tmp_path, capsys):
    checkout = Path(os.environ.get("MLGYM_ROOT", ""))
    if not os.environ.get("MLGYM_ROOT") or not (checkout / "configs" / "tasks").is_dir():
        pytest.skip("set MLGYM_ROOT to a checkout of facebookresearch/MLGym to replay its recorded runs")
    if not RECORDED:
        pytest.skip(missing_recorded_runs())
    report = {}
    for task_dir in sorted(p for p in TRAJECTORIES.iterdir() if p.is_dir()):
        if not is_offline_task(checkout, task_dir.name):
            continue
        scratch = tmp_path / task_dir.name
        scratch.mkdir()
        report[task_dir.name] = replay_task(task_dir, checkout, scratch)
    if not report:
        pytest.skip("no recorded runs of a task that replays offline (MLGym's games)")
    with capsys.disabled():
        for task, r in report.items():
            gaps = r["gaps"] or [0.0]
            print(
                f"\n{task}: same kind {r['same']}/{r['steps']} = {r['same'] / r['steps']:.3f}; "
                f"validate score gap mean {statistics.mean(gaps):.4f} median {statistics.median(gaps):.4f} "
                f"max {max(gaps):.4f} over {len(r['gaps'])} scores; mismatches {r['mismatches']}"
            )
    for task, r in report.items():
        assert r["same"] / r["steps"] >= 0.95, (task, r["mismatches"])
        assert statistics.median(r["gaps"] or [0.0]) <= 0.02, (task, sorted(r["gaps"])[-5:])


def test_secret_files_are_only_in_the_evaluation_copy(tmp_path):
    spec = write_task(
        tmp_path,
        "CSVSubmissionTasks",
        """\
        import argparse, json
        parser = argparse.ArgumentParser()
        parser.add_argument("--submission_file")
        guess = open(parser.parse_args().submission_file).read().split()
        truth = open("answers.txt").read().split()
        print(json.dumps({"acc": sum(g == t for g, t in zip(guess, truth)) / len(truth)}))
        """,
        {"answers.txt": "1\n0\n1\n1\n"},
    )
    spec.secret_files = ["answers.txt"]
    with LocalBackend(spec) as env:
        env.reset()
        env.install_tools()
        assert "answers.txt" not in env.communicate("ls")
        assert "No such file" in env.communicate("cat answers.txt")
        env.step("printf '1\\n1\\n1\\n1\\n' > submission.csv")
        obs, _, _, info = env.step("validate")
        assert info["score"] == [{"acc": 0.75}]
        assert not (env.host_workspace / "answers.txt").exists()


def test_choosing_no_sandbox_warns_that_the_agent_is_not_confined():
    """``sandbox="none"`` warns when chosen (in a fresh interpreter: no thread of another test can swap the warning
    filters meanwhile)."""
    done = run_python("""
        import warnings
        from mlgym_registry.backends.local import LocalBackend

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            LocalBackend.check_available(sandbox="none")
            LocalBackend.check_available(sandbox="bwrap")
        for warning in caught:
            print(warning.category.__name__, warning.message)
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("RuntimeWarning sandbox='none': the agent's commands"), done.stdout
