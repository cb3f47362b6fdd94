"""Tasks of a user's MLGym checkout: found through MLGYM_ROOT or a source-installed mlgym, registered as mlgym/<id>."""

from __future__ import annotations

import importlib
import shutil
import sys
import warnings
from pathlib import Path

import pytest
from conftest import fresh_registry as fresh
from conftest import write

from mlgym_registry import InvalidTaskError, Registry, TaskSpec, registry
from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.tasks import mlgym_source

TASK = """\
id: xTask
name: X Task
description: |-
  Solve x. Data:
  {dataset_docs}
dataset_configs:
- datasets/xData.yaml
task_entrypoint: CSVSubmissionTasks
training_timeout: 600
starter_code:
- data/x/baseline.py
- data/x/evaluate.py
baseline_paths:
- baseline.py
baseline_scores:
- accuracy: 0.5
evaluation_paths:
- evaluate.py
evaluation_read_only: true
"""

GAME = """\
id: gameId
name: A Game
description: Play.
task_entrypoint: PythonSubmissionTasks
starter_code:
- data/game/strategy.py
evaluation_paths:
- evaluate.py
"""

DATASET = """\
name: XData
description: rows of x
data_path: data/x/data
is_local: true
train_split:
  name: train
  file_regex: ./data/train*
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A small MLGym-shaped checkout, with MLGYM_ROOT pointing at it."""
    root = tmp_path / "MLGym"
    write(root / "configs/tasks/x.yaml", TASK)
    write(root / "configs/tasks/game_file_name.yaml", GAME)
    write(root / "configs/tasks/xVariant.yaml", TASK.replace("name: X Task", "name: X variant"))
    write(root / "configs/datasets/xData.yaml", DATASET)
    write(root / "configs/datasets/remote.yaml", "name: Remote\ndata_path: someone/remote-set\n")
    write(root / "data/x/baseline.py", "print('baseline')\n")
    write(root / "data/x/evaluate.py", "print('{}')\n")
    write(root / "data/x/data/train.csv", "a,b\n1,2\n")
    write(root / "data/game/strategy.py", "def row_strategy(history):\n    return 0\n")
    write(root / "dockerfiles/aliases.sh", "alias ls='ls -F'\n")
    monkeypatch.setenv("MLGYM_ROOT", str(root))
    return root


def mlgym_names(reg: Registry) -> list[str]:
    return [n for n in reg.names("task") if n.startswith("mlgym/")]


def test_checkout_tasks_are_registered_by_their_id(checkout):
    with pytest.warns(mlgym_source.DuplicateTaskIdWarning, match="x.yaml and xVariant.yaml"):
        reg = fresh()
    # the id comes from the file, not its name; a second file reusing an id does not replace the first, it is
    # registered under its file's name (tests/tasks/test_mlgym_variants.py)
    assert mlgym_names(reg) == ["mlgym/gameId", "mlgym/xTask", "mlgym/xVariant"]
    rows = {row.name: row for row in reg.describe("task")}
    assert rows["mlgym/xTask"].description == "X Task"
    assert rows["mlgym/gameId"].description == "A Game"
    assert "prisonersDilemma" in rows  # our own suite is still there


def test_spec_reads_the_checkout(checkout):
    spec = fresh().spec("mlgym/xTask")
    assert spec.id == "xTask" and spec.gym_id == "mlgym/xTask"
    assert spec.root == str(checkout.resolve())
    assert spec.source == str((checkout / "configs/tasks/x.yaml").resolve())
    assert spec.backend == "local" and "mlgym" in spec.tags
    assert spec.task_entrypoint == "CSVSubmissionTasks" and spec.training_timeout == 600
    assert spec.baseline == {"accuracy": 0.5} and spec.evaluation_read_only
    assert spec.aliases_file == str(checkout.resolve() / "dockerfiles/aliases.sh")
    assert [spec.resolve_path(p) for p in spec.starter_code] == [
        checkout.resolve() / "data/x/baseline.py",
        checkout.resolve() / "data/x/evaluate.py",
    ]
    assert "{dataset_docs}" in spec.description  # filled by the backend at setup, as MLGym's task does
    [dataset] = spec.datasets
    assert dataset["name"] == "XData" and dataset["description"] == "rows of x" and dataset["is_local"] is True
    assert Path(dataset["data_path"]) == checkout.resolve() / "data/x/data"
    assert (Path(dataset["data_path"]) / "train.csv").is_file()
    assert dataset["train_split"] == {"name": "train", "file_regex": "./data/train*"}
    assert TaskSpec.from_dict(spec.to_dict()) == spec


def test_mlgym_ranking_metric_lands_in_the_spec(checkout):
    write(checkout / "configs/tasks/sat.yaml", GAME.replace("gameId", "3SATTime"))
    write(checkout / "configs/tasks/own.yaml", GAME.replace("gameId", "ownMetric") + "priority_metric: Correct\n")
    reg = fresh()
    extra = reg.spec("mlgym/3SATTime").extra
    assert (extra["priority_metric"], extra["metric_direction"]) == ("Time", "min")
    assert reg.spec("mlgym/ownMetric").extra == {"priority_metric": "Correct"}  # the task file's own word stands


def test_remote_datasets_keep_their_repository_id(checkout):
    write(checkout / "configs/tasks/x.yaml", TASK.replace("datasets/xData.yaml", "datasets/remote.yaml"))
    [dataset] = fresh().spec("mlgym/xTask").datasets
    assert dataset["data_path"] == "someone/remote-set" and dataset["is_local"] is False


def test_without_aliases_file(checkout):
    (checkout / "dockerfiles/aliases.sh").unlink()
    assert fresh().spec("mlgym/gameId").aliases_file is None


def test_a_broken_task_file_is_skipped_with_a_warning(checkout):
    write(checkout / "configs/tasks/broken.yaml", "id: [unclosed\n")
    write(checkout / "configs/tasks/noid.yaml", "name: nameless\n")
    write(checkout / "configs/tasks/list.yaml", "- a\n- b\n")
    with pytest.warns(RuntimeWarning) as caught:
        reg = fresh()
    messages = " ".join(str(w.message) for w in caught)
    for name in ("broken.yaml", "noid.yaml", "list.yaml"):
        assert name in messages
    assert mlgym_names(reg) == ["mlgym/gameId", "mlgym/xTask", "mlgym/xVariant"]
    assert reg.load_errors() == []


def test_problems_inside_a_task_surface_when_it_is_used(checkout):
    write(checkout / "configs/tasks/bad_entry.yaml", GAME.replace("gameId", "badEntry").replace(
        "PythonSubmissionTasks", "BaseMLTask"))
    write(checkout / "configs/tasks/no_data.yaml", TASK.replace("xTask", "noData").replace("xData", "missing"))
    reg = fresh()
    assert {"mlgym/badEntry", "mlgym/noData"} <= set(reg.names("task"))
    with pytest.raises(InvalidTaskError, match="BaseMLTask"):
        reg.spec("mlgym/badEntry")
    with pytest.raises(InvalidTaskError, match="missing.yaml"):
        reg.spec("mlgym/noData")


DUEL = """\
id: duel
name: A Duel
description: Write your move in `strategy.py`; you play against a fixed partner.
task_entrypoint: PythonSubmissionTasks
starter_code:
- data/duel/target.py
- data/duel/evaluate.py
- data/duel/strategy.py
evaluation_paths:
- evaluate.py
evaluation_read_only: true
"""


def test_the_opponent_of_an_mlgym_game_is_pristine(checkout):
    """MLGym marks only evaluate.py read-only, so MLGym itself lets the agent rewrite the partner it is scored
    against; here the starter modules the description does not name are kept pristine, like the script."""
    write(checkout / "configs/tasks/duel.yaml", DUEL)
    write(checkout / "data/duel/target.py", "def target_column_strategy(history):\n    return 1\n")
    write(checkout / "data/duel/strategy.py", "def row_strategy(history):\n    return 0\n")
    write(checkout / "data/duel/evaluate.py", """\
        import json
        from strategy import row_strategy
        from target import target_column_strategy
        print(json.dumps({"Score": float(row_strategy([]) + target_column_strategy([]))}))
        """)
    spec = fresh().spec("mlgym/duel")
    assert spec.protected_files == ["target.py"]
    backend = LocalBackend(spec, seed=0)
    try:
        backend.reset()
        backend.install_tools()
        backend.step("printf 'def row_strategy(history):\\n    return 2\\n' > strategy.py")
        backend.step("printf 'def target_column_strategy(history):\\n    return 100\\n' > target.py")
        observation, _, _, info = backend.step("validate")
        assert info["score"] == [{"Score": 3.0}], observation  # the agent's move counts, the rewritten partner does not
    finally:
        backend.close()


def test_missing_dataset_files_are_named_at_make_and_nothing_stays_behind(checkout, tmp_path):
    shutil.rmtree(checkout / "data/x/data")
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    with pytest.raises(FileNotFoundError) as caught:
        fresh().make("mlgym/xTask", workspace_dir=str(workspaces))
    message = str(caught.value)
    assert "'xTask'" in message and "'XData'" in message and str(checkout / "data/x/data") in message
    assert "Put the files in a data folder" in message and "MLGYM_REGISTRY_DATA" in message
    assert list(workspaces.iterdir()) == []


def test_mlgym_root_that_is_not_a_checkout_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("MLGYM_ROOT", str(tmp_path))
    with pytest.warns(RuntimeWarning, match="not an MLGym checkout"):
        reg = fresh()
    assert mlgym_names(reg) == []


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """Put an importable `mlgym` package on sys.path; returns the folder holding it."""
    monkeypatch.delenv("MLGYM_ROOT", raising=False)
    monkeypatch.delitem(sys.modules, "mlgym", raising=False)

    def make(root: Path) -> Path:
        write(root / "mlgym/__init__.py", "raise RuntimeError('the mlgym package must not be imported')\n")
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        return root

    return make


def test_pypi_mlgym_without_configs_is_ignored(tmp_path, fake_package):
    fake_package(tmp_path / "site-packages")
    assert mlgym_source.installed_checkout() is None
    assert mlgym_names(fresh()) == []
    assert "mlgym" not in sys.modules


def test_source_installed_mlgym_is_found_without_importing_it(tmp_path, fake_package):
    root = fake_package(tmp_path / "MLGym")
    write(root / "configs/tasks/game.yaml", GAME)
    write(root / "data/game/strategy.py", "def row_strategy(history):\n    return 0\n")
    assert mlgym_source.installed_checkout() == root.resolve()
    reg = fresh()
    assert mlgym_names(reg) == ["mlgym/gameId"]
    assert reg.spec("mlgym/gameId").root == str(root.resolve())
    assert "mlgym" not in sys.modules


def test_mlgym_root_wins_over_an_installed_package(tmp_path, fake_package, checkout, monkeypatch):
    other = fake_package(tmp_path / "Installed")
    write(other / "configs/tasks/game.yaml", GAME.replace("gameId", "installedGame"))
    monkeypatch.setenv("MLGYM_ROOT", str(checkout))
    assert mlgym_names(fresh()) == ["mlgym/gameId", "mlgym/xTask", "mlgym/xVariant"]


def test_the_global_registry_picks_up_a_checkout_on_reload(checkout, monkeypatch):
    try:
        registry.reload()
        assert "mlgym/xTask" in registry.names("task")
        assert registry.spec("mlgym/xTask").datasets[0]["name"] == "XData"
    finally:
        monkeypatch.delenv("MLGYM_ROOT")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            registry.reload()
    assert "mlgym/xTask" not in registry.names("task")
