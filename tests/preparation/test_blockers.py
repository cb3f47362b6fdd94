"""``prepare`` tells the truth: every blocker a task has left (data, models, devices, packages, trust), the same
checks ``make`` refuses it with, and a non-zero exit while any is left; a package that installs but cannot be imported
fails ``prepare`` itself."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest
from conftest import write

import mlgym_registry
from mlgym_registry import PrepareFailed, load_task_yaml
from mlgym_registry.backends.local import sandbox
from mlgym_registry.backends.local.task_checks import blockers
from mlgym_registry.cli import main as cli_main
from mlgym_registry.errors import TaskFilesMissing

HAS_GPU = bool(sandbox.gpu_devices())


@pytest.fixture(autouse=True)
def envs(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "envs"
    monkeypatch.setenv("MLGYM_REGISTRY_ENVS", str(folder))
    monkeypatch.setenv("MLGYM_REGISTRY_DATA", str(tmp_path / "data-folder"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache: no model is there
    return folder


def task_file(folder: Path, *lines: str, requirements: list[str] | None = None) -> Path:
    write(folder / "evaluate.py", "print('{\"accuracy\": 1.0}')\n")
    head = ["id: blockedTask", "task_entrypoint: CSVSubmissionTasks", "starter_code: [evaluate.py]",
            "evaluation_paths: [evaluate.py]", "evaluation_read_only: true", "baseline_scores: [{accuracy: 0.5}]"]
    if requirements is not None:
        head.append(f"requirements: {requirements!r}")
    return write(folder / "task.yaml", "\n".join([*head, *lines]) + "\n")


BLOCKED = (
    "datasets:",
    "- {name: answers, data_path: data/answers, is_local: true}",
    "- {name: glue, data_path: nyu-mll/glue, is_local: false}",
    "needs: {devices: [cuda], models: [some-org/no-such-model]}",
)


def test_prepare_reports_every_blocker_at_once_and_exits_non_zero(tmp_path, capsys):
    path = task_file(tmp_path / "task", *BLOCKED)
    assert cli_main(["prepare", str(path)]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "still blocked by" in line]
    kinds = [line.split("still blocked by ")[1].split(":")[0] for line in lines]
    assert kinds == ([] if HAS_GPU else ["devices"]) + ["data", "data", "models"]
    assert "the files of its local dataset 'answers' are not here" in err
    assert "loads the Hugging Face dataset 'nyu-mll/glue' by name and does not say which of its splits" in err
    assert "loads the Hugging Face model 'some-org/no-such-model' by name" in err
    assert "`huggingface-cli download some-org/no-such-model`" in err
    if not HAS_GPU:
        assert "needs a CUDA device" in err


def test_make_refuses_with_the_first_blocker_prepare_reports(tmp_path):
    spec = load_task_yaml(task_file(tmp_path / "task", *BLOCKED))
    found = blockers(spec)
    with pytest.raises(type(found[0].error)) as caught:
        mlgym_registry.make(spec)
    assert str(caught.value) == str(found[0].error)


def test_once_the_data_and_the_model_are_there_the_task_is_ready(tmp_path, capsys):
    lines = ("datasets:", "- {name: answers, data_path: data/answers, is_local: true}",
             "needs: {models: [some-org/tiny-model]}")
    path = task_file(tmp_path / "task", *lines)
    assert cli_main(["prepare", str(path)]) == 1
    write(tmp_path / "data-folder" / "data/answers/answer.csv", "id,label\n0,1\n")
    snapshot = tmp_path / "hf-home/hub/models--some-org--tiny-model/snapshots/0123abc"
    write(snapshot / "config.json", "{}")
    write(tmp_path / "hf-home/hub/models--some-org--tiny-model/refs/main", "0123abc")
    capsys.readouterr()
    assert cli_main(["prepare", str(path)]) == 0
    assert f"{path}: ready to run" in capsys.readouterr().out


def test_a_malformed_needs_entry_names_the_task_and_the_shape(tmp_path):
    spec = load_task_yaml(task_file(tmp_path / "task", "needs: [cuda]"))
    with pytest.raises(TaskFilesMissing, match="blockedTask.*needs must be a mapping such as"):
        blockers(spec)


def broken_wheel(folder: Path) -> Path:
    """A wheel of a package whose import raises, as a torchvision built for another torch does."""
    name, version = "broken_ops", "0.1"
    files = {
        f"{name}/__init__.py": "raise RuntimeError('operator broken_ops::nms does not exist')\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: broken-ops\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n",
        f"{name}-{version}.dist-info/top_level.txt": f"{name}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.mark.slow
def test_a_package_that_installs_but_cannot_be_imported_fails_prepare_and_leaves_nothing(tmp_path, envs):
    wheel = broken_wheel(tmp_path / "wheels")
    path = task_file(tmp_path / "task", requirements=["broken-ops"])  # pip, not the task, chooses where from
    with pytest.raises(PrepareFailed) as caught:
        mlgym_registry.prepare(path, pip_args=["--no-index", "--find-links", str(wheel.parent)], echo=lambda line: None)
    message = str(caught.value)
    assert "but the environment cannot import broken-ops (import broken_ops: RuntimeError: operator " \
           "broken_ops::nms does not exist)" in message
    assert "docs/tasks.md" in message
    assert sorted(p.name for p in envs.iterdir() if not p.name.endswith(".lock")) == []


def test_mlgym_tasks_that_need_a_gpu_or_a_hub_model_say_so(tmp_path, monkeypatch):
    from conftest import fresh_registry

    checkout = tmp_path / "MLGym"
    header = "task_entrypoint: LMSubmissionTasks\nstarter_code: []\nevaluation_paths: [evaluate.py]\n"
    write(checkout / "configs/tasks/languageModelingFineWeb.yaml", "id: languageModelingFineWeb\n" + header)
    write(checkout / "configs/tasks/naturalLanguageInferenceMNLI.yaml", "id: naturalLanguageInferenceMNLI\n" + header)
    monkeypatch.setenv("MLGYM_ROOT", str(checkout))
    registry = fresh_registry()
    fineweb = registry.spec("mlgym/languageModelingFineWeb")
    mnli = registry.spec("mlgym/naturalLanguageInferenceMNLI")
    assert fineweb.extra["needs"] == {"devices": ["cuda"]}
    assert mnli.extra["needs"] == {"models": ["bert-base-uncased"]}
    assert [b.kind for b in blockers(mnli) if b.kind == "models"] == ["models"]
    if not HAS_GPU:
        assert [b.kind for b in blockers(fineweb) if b.kind == "devices"] == ["devices"]
