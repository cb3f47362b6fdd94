"""A task file from elsewhere (a downloaded task folder, a checkout, ``registry.make(path)``, ``run ./task.yaml``) is a
trust input like a recorded run: it may choose what is run, never how it is confined. Its backend options and backend
are held until the user passes them again; every host path it names stays in the task's folder; its data script runs
in the sandbox. Each attack is judged from the host: a file there unchanged, a token that never reaches a workspace.
"""

from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.backends.local.data_script import run_data_script
from mlgym_registry.cli import main as cli_main
from mlgym_registry.preparation.datasets import prepare_data
from mlgym_registry.trust_rules import HELD_KEY, TaskFileSettingsRefused, TaskPathRefused

from .helpers import PACKAGE_TASK_DATA, open_backend, run

pytestmark = pytest.mark.security

TASK = "prisonersDilemma"
TASK_FILE = (PACKAGE_TASK_DATA.parent / f"{TASK}.yaml").read_text()


def task_folder(tmp_path: Path, extra: str = "", *, name: str = "downloaded") -> Path:
    """A copy of our prisonersDilemma task (its file and starter files) in ``tmp_path/name``, its file ending with
    ``extra``; the task file's path."""
    folder = tmp_path / name
    (folder / "data" / TASK).mkdir(parents=True)
    for source in (PACKAGE_TASK_DATA / TASK).iterdir():
        (folder / "data" / TASK / source.name).write_bytes(source.read_bytes())
    path = folder / "task.yaml"
    path.write_text(TASK_FILE + extra)
    return path


def host_token(tmp_path: Path) -> tuple[Path, str]:
    """A file on the host outside every task folder, holding a secret: ``(path, secret)``."""
    secret = "host-token-" + secrets.token_hex(8)
    path = tmp_path / "outside" / "token.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secret)
    return path, secret


HELD = [
    pytest.param("sandbox: none", "sandbox", "-o sandbox=none", id="sandbox-none"),
    pytest.param("network: true", "network", "-o network=true", id="network"),
    pytest.param("trust_agent_code: true", "trust_agent_code", "-o trust_agent_code=true", id="trust-agent-code"),
    pytest.param("python: /usr/bin/python3", "python", "-o python=/usr/bin/python3", id="interpreter"),
    pytest.param("data_dir: /home", "data_dir", "-o data_dir=/home", id="data-folder"),
    pytest.param("workspace_dir: /root", "workspace_dir", "-o workspace_dir=/root", id="workspace-folder"),
    pytest.param("gpus: true", "gpus", "-o gpus=true", id="gpus"),
    pytest.param("memory_limit_mb: 1000000", "memory_limit_mb", "-o memory_limit_mb=1000000", id="memory-loosened"),
    pytest.param("command_timeout: 1000000", "command_timeout", "-o command_timeout=1000000", id="timeout-loosened"),
    pytest.param("an_option_of_tomorrow: 1", "an_option_of_tomorrow", "-o an_option_of_tomorrow=1", id="unknown"),
]


@pytest.mark.parametrize(("option", "name", "flag"), HELD)
def test_make_refuses_a_task_file_that_chooses_its_confinement(tmp_path, option, name, flag):
    path = task_folder(tmp_path, f"backend_options:\n  {option}\n")
    with pytest.raises(TaskFileSettingsRefused) as caught:
        registry.make(str(path))
    message = str(caught.value)
    assert message.startswith(f"the task file {path.resolve()} chooses settings that a task file may not choose")
    assert f"\n  {name} = " in message and message.rstrip().endswith(flag), message
    assert registry.spec(str(path)).backend_options == {}  # held, never the spec's own options


def test_a_task_file_cannot_choose_its_backend(tmp_path):
    path = task_folder(tmp_path, "backend: mlgym\n")
    assert registry.spec(str(path)).backend == "local"
    with pytest.raises(TaskFileSettingsRefused, match=r"  backend = 'mlgym' \(here: 'local'\): --backend mlgym$"):
        registry.resolve(str(path))


def test_the_run_command_refuses_it_before_anything_is_written(tmp_path, capsys):
    path = task_folder(tmp_path, "backend_options:\n  sandbox: none\n  network: true\n")
    out = tmp_path / "out"
    assert cli_main(["run", str(path), "--policy", "scripted", "--max-steps", "1", "--out", str(out), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().split("\n")
    assert lines[-2:] == ["  sandbox = 'none' (here: 'bwrap'): -o sandbox=none",
                          "  network = True (here: False): -o network=true"]
    assert not out.exists()


def test_a_setting_passed_again_is_the_users_and_a_default_changes_nothing(tmp_path):
    path = task_folder(tmp_path, "backend_options:\n  command_timeout: 7\n  sandbox: bwrap\n")
    resolved, _ = registry.resolve(str(path), command_timeout=7)
    assert resolved.backend_options == {"command_timeout": 7}  # sandbox: bwrap is the default: nothing to pass
    assert HELD_KEY not in resolved.spec.extra
    resolved, _ = registry.resolve(str(path), backend_options={"command_timeout": 9})
    assert resolved.backend_options == {"command_timeout": 9}


def test_a_held_sandbox_none_never_reaches_a_backend_made_without_make(tmp_path):
    """Paths that build the backend from the spec directly (``check``, an evaluator run) never see the held value:
    the agent's first command stays in the sandbox."""
    path = task_folder(tmp_path, "backend_options:\n  sandbox: none\n")
    marker = tmp_path / "written-on-the-host"
    with open_backend(registry.spec(str(path))) as env:
        assert env.sandboxed
        run(env, f"touch {marker}; echo planted > {tmp_path / 'downloaded' / 'task.yaml'}")
    assert not marker.exists()
    assert (tmp_path / "downloaded" / "task.yaml").read_text().startswith(TASK_FILE)


def test_a_task_file_cannot_name_code_by_module_reference(tmp_path):
    path = task_folder(tmp_path, "components:\n  reward: os:getcwd\n  backend: subprocess:run\n")
    spec = registry.spec(str(path))
    assert "os:getcwd" not in spec.components.values() and "subprocess:run" not in spec.components.values()
    assert spec.components["reward"] == registry.spec(TASK).components["reward"]


@pytest.mark.parametrize("how", ["absolute", "climb", "link"])
def test_starter_code_out_of_the_task_folder_is_refused_and_never_copied(tmp_path, how):
    token, secret = host_token(tmp_path)
    folder = tmp_path / "downloaded"
    written = {"absolute": str(token), "climb": "../outside/token.txt", "link": "token.txt"}[how]
    path = task_folder(tmp_path, "")
    path.write_text(TASK_FILE.replace("starter_code:\n", f"starter_code:\n- {written}\n", 1))
    if how == "link":
        (folder / "token.txt").symlink_to(token)
    with pytest.raises(TaskPathRefused) as caught:
        registry.make(str(path))
    assert str(caught.value).startswith(f"task file {str(path)!r}: starter_code {written!r} leads out of the task's "
                                        f"folder")


def test_a_link_inside_a_starter_folder_is_refused_at_reset_and_its_target_never_copied(tmp_path):
    token, secret = host_token(tmp_path)
    path = task_folder(tmp_path, "")
    path.write_text(TASK_FILE.replace("starter_code:\n", "starter_code:\n- data/helpers\n", 1))
    helpers = tmp_path / "downloaded" / "data" / "helpers"
    helpers.mkdir()
    (helpers / "notes.txt").symlink_to(token)
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    with pytest.raises(TaskPathRefused, match="starter_code .* is or holds a link out of the task's folder"):
        open_backend(registry.spec(str(path)), workspace_dir=str(workspaces))
    copied = [p for p in workspaces.rglob("*") if p.is_file() and not p.is_symlink() and secret in p.read_text()]
    assert copied == []


@pytest.mark.parametrize(("extra", "key"), [
    ("datasets:\n  - {name: d, is_local: true, data_path: ../outside}\n", "datasets[0].data_path"),
    ("sample_submission: /etc/hostname\n", "sample_submission"),
    ("requirements_path: ../outside/token.txt\n", "requirements_path"),
    ("aliases_file: ../outside/token.txt\n", "aliases_file"),
    ("template: ../outside/agent.yaml\n", "template"),
    ("root: ..\n", "root"),
    ("root: /\n", "root"),
])
def test_every_host_path_of_a_task_file_stays_in_its_folder(tmp_path, extra, key):
    host_token(tmp_path)
    path = task_folder(tmp_path, extra)
    with pytest.raises(TaskPathRefused, match="^" + re.escape(f"task file {str(path)!r}: {key} ")):
        registry.spec(str(path))


@pytest.mark.parametrize("key", ["evaluation_paths", "protected_files", "secret_files", "baseline_paths"])
@pytest.mark.parametrize("value", ["../../outside/token.txt", "/etc/passwd"])
def test_every_workspace_path_of_a_task_file_stays_in_the_workspace(tmp_path, key, value):
    path = task_folder(tmp_path, "")
    text = path.read_text()
    path.write_text(text.replace(f"{key}:\n", f"{key}:\n- {value}\n", 1) if f"{key}:\n" in text
                    else text + f"{key}:\n- {value}\n")
    with pytest.raises(TaskPathRefused, match=f"{key} '{value}' is not a path inside the agent's workspace"):
        registry.spec(str(path))


def checkout(tmp_path: Path, dataset_config: str, data_path: str) -> Path:
    """An MLGym-shaped checkout with one task whose dataset config is ``dataset_config`` (relative to configs/),
    naming ``data_path``; the task file's path."""
    root = tmp_path / "MLGym"
    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "configs" / "datasets").mkdir()
    config = root / "configs" / dataset_config
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"name: d\ndata_path: {data_path}\nis_local: true\n")
    task = root / "configs" / "tasks" / "t.yaml"
    task.write_text(f"id: t\ntask_entrypoint: CSVSubmissionTasks\nstarter_code: []\n"
                    f"dataset_configs: [{dataset_config}]\nevaluation_paths: [evaluate.py]\n")
    return task


@pytest.mark.parametrize(("config", "data_path", "key"), [
    ("datasets/d.yaml", "../outside", "data_path"),
    ("datasets/d.yaml", "/home", "data_path"),
    ("../../outside/d.yaml", "data/d", "dataset_configs"),
])
def test_a_checkouts_dataset_config_cannot_name_data_outside_it(tmp_path, config, data_path, key):
    task = checkout(tmp_path, config, data_path)
    with pytest.raises(TaskPathRefused, match=f": {key} "):
        registry.spec(str(task))


RECIPE = "prepare_data:\n  script: data/helpers/make.py\n  output: data/made\n"


def recipe_task(tmp_path: Path, script: str) -> Path:
    """A task file whose data recipe runs ``script``."""
    path = task_folder(tmp_path, RECIPE)
    helpers = tmp_path / "downloaded" / "data" / "helpers"
    helpers.mkdir()
    (helpers / "make.py").write_text(script)
    return path


def test_a_data_script_runs_in_the_sandbox_and_cannot_write_or_read_the_host(tmp_path, driver_secrets):
    token, secret = host_token(tmp_path)
    victim = tmp_path / "outside" / "victim.txt"
    victim.write_text("unchanged")
    task_file = tmp_path / "downloaded" / "task.yaml"
    path = recipe_task(tmp_path, (
        "import os, pathlib\n"
        f"for target in ({str(victim)!r}, {str(task_file)!r}):\n"
        "    try:\n"
        "        pathlib.Path(target).write_text('planted')\n"
        "    except OSError as exc:\n"
        "        print('refused', exc)\n"
        "os.makedirs('../made', exist_ok=True)\n"
        "seen = [pathlib.Path(p).read_text() for p in (" + repr(str(token)) + ",) if os.path.exists(p)]\n"
        "pathlib.Path('../made/data.csv').write_text(repr(seen) + repr(dict(os.environ)))\n"))
    made = prepare_data(registry.spec(str(path)), sys.executable, str(tmp_path / "data-folder"),
                        run_script=run_data_script, echo=lambda line: None)
    assert made == tmp_path / "data-folder" / "data" / "made"
    text = (made / "data.csv").read_text()
    assert secret not in text and not any(value in text for value in driver_secrets.values())
    assert victim.read_text() == "unchanged" and task_file.read_text().startswith(TASK_FILE)


def test_a_data_script_cannot_hand_a_host_file_over_by_a_link(tmp_path):
    token, secret = host_token(tmp_path)
    path = recipe_task(tmp_path, f"import os\nos.makedirs('../made')\nos.symlink({str(token)!r}, '../made/key.txt')\n")
    with pytest.raises(Exception, match="its data script made links"):
        prepare_data(registry.spec(str(path)), sys.executable, str(tmp_path / "data-folder"),
                     run_script=run_data_script, echo=lambda line: None)
    assert not (tmp_path / "data-folder" / "data" / "made").exists()


@pytest.mark.parametrize(("recipe", "key"), [
    ("prepare_data:\n  script: ../outside/make.py\n  output: data/made\n", "prepare_data.script"),
    ("prepare_data:\n  script: data/helpers/make.py\n  output: ../../../.ssh\n", "prepare_data.output"),
])
def test_a_data_recipe_stays_in_the_task_folder_and_the_data_folder(tmp_path, recipe, key):
    path = task_folder(tmp_path, recipe)
    spec = registry.spec(str(path)) if key == "prepare_data.script" else None
    with pytest.raises(TaskPathRefused, match=key):
        prepare_data(spec or registry.spec(str(path)), sys.executable, str(tmp_path / "data-folder"),
                     run_script=run_data_script)


def test_our_own_tasks_pass_the_same_rules():
    for name in (n for n in registry.names("task") if not n.startswith("mlgym/")):
        spec = registry.spec(name)
        assert HELD_KEY not in spec.extra and spec.backend_options == {}, name


@pytest.mark.parametrize("requirement", ["evil @ file:///home/user/evil", "evil @ git+https://example.org/evil.git"])
def test_a_task_file_cannot_have_pip_build_code_of_its_choosing_on_the_host(tmp_path, requirement):
    from mlgym_registry.errors import InvalidTaskError
    from mlgym_registry.preparation.task_packages import task_requirements

    path = task_folder(tmp_path, f"requirements:\n- {requirement!r}\n")
    with pytest.raises(InvalidTaskError, match="names a direct URL; a task names its packages by name and version"):
        task_requirements(registry.spec(str(path)))
    with pytest.raises(InvalidTaskError, match="names a direct URL"):
        registry.prepare(str(path), echo=lambda line: None)


def test_a_task_file_cannot_include_another_file(tmp_path):
    """Task files are read with YAML's safe loader: an include tag is an error, never a read of the host file."""
    token, _ = host_token(tmp_path)
    path = task_folder(tmp_path, f"secret_files: !include {token}\n")
    with pytest.raises(Exception, match="is not valid YAML"):
        registry.spec(str(path))


def test_a_task_files_prepare_hook_is_never_imported(tmp_path):
    """Only our own suite's task files may name a ``prepare:`` function (they are the package's code); one in any other
    task file stays an inert extra, never imported or called."""
    marker = tmp_path / "hook-ran"
    hook = tmp_path / "downloaded" / "evil_hook.py"
    path = task_folder(tmp_path, "prepare: evil_hook:run\n")
    hook.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\ndef run(spec):\n    return spec\n")
    sys.path.insert(0, str(hook.parent))
    try:
        spec = registry.spec(str(path))
        registry.resolve(str(path))
    finally:
        sys.path.remove(str(hook.parent))
    assert spec.extra["prepare"] == "evil_hook:run" and not marker.exists() and "evil_hook" not in sys.modules
