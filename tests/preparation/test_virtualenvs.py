"""Per-task Python environments: what a task declares, which interpreter runs it, and ``prepare`` building one from
the index pip is configured with (the slow tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import fresh_registry, write

import mlgym_registry
from mlgym_registry import InvalidTaskError, MissingTaskPackages, PrepareFailed, load_task_yaml
from mlgym_registry.cli import main as cli_main
from mlgym_registry.policies.base import fenced
from mlgym_registry.preparation.task_packages import missing_requirements, task_requirements
from mlgym_registry.preparation.virtualenvs import environment_key, environments_folder, prepared_python, task_python

NOWHERE = "some-package-that-does-not-exist-xyz"


@pytest.fixture(autouse=True)
def envs(tmp_path, monkeypatch) -> Path:
    """A folder of prepared environments of this test's own."""
    folder = tmp_path / "envs"
    monkeypatch.setenv("MLGYM_REGISTRY_ENVS", str(folder))
    return folder


def task_file(folder: Path, requirements: list[str] | None, evaluate: str = "print('{\"accuracy\": 1.0}')\n",
              **fields: str) -> Path:
    """A CSV-submission task file in ``folder`` with ``evaluate.py`` and the given ``requirements``."""
    write(folder / "evaluate.py", evaluate)
    lines = [
        "id: tinyPackages", "task_entrypoint: CSVSubmissionTasks", "training_timeout: 120",
        "starter_code: [evaluate.py]", "evaluation_paths: [evaluate.py]", "evaluation_read_only: true",
        "baseline_scores: [{accuracy: 0.5}]", "max_steps: 5",
    ]
    if requirements is not None:
        lines.append(f"requirements: {requirements!r}")
    lines += [f"{key}: {value}" for key, value in fields.items()]
    return write(folder / "task.yaml", "\n".join(lines) + "\n")


def test_requirements_come_from_the_field_then_the_file_whose_lines_the_field_can_replace(tmp_path):
    write(tmp_path / "reqs.txt", "# MLGym-style file\njax[cuda12]\ntqdm  # progress bars\n\nScikit_Learn>=1.0\n")
    spec = load_task_yaml(task_file(tmp_path, ["jax", "numpy>=1.20,<3"], requirements_path="reqs.txt"))
    assert task_requirements(spec) == ["jax", "numpy<3,>=1.20", "tqdm", "scikit-learn>=1.0"]
    assert task_requirements(spec.replace(requirements=None)) == ["jax[cuda12]", "tqdm", "scikit-learn>=1.0"]
    assert task_requirements(spec.replace(requirements_path="absent.txt")) == ["jax", "numpy<3,>=1.20"]
    assert task_requirements(spec.replace(requirements=None, requirements_path=None)) == []


def test_a_requirement_that_is_none_names_the_task(tmp_path):
    spec = load_task_yaml(task_file(tmp_path, ["numpy", "not a requirement!"]))
    with pytest.raises(InvalidTaskError, match="tinyPackages.*'not a requirement!' is not a pip requirement"):
        task_requirements(spec)
    write(tmp_path / "bad.yaml", "id: x\nrequirements: numpy\n")
    with pytest.raises(InvalidTaskError, match="requirements must be a list"):
        load_task_yaml(tmp_path / "bad.yaml")


def test_tasks_needing_the_same_packages_share_one_environment():
    key = environment_key(["pandas", "Scikit_Learn>=1.0", "numpy"])
    assert key == environment_key(["scikit-learn >= 1.0", "numpy", "pandas", "numpy"])
    assert key.startswith(f"py{sys.version_info.major}.{sys.version_info.minor}-")
    assert key != environment_key(["pandas", "scikit-learn>=1.1", "numpy"])
    assert key != environment_key(["pandas", "numpy"])


def test_where_environments_live(monkeypatch, tmp_path, envs):
    assert environments_folder() == envs
    monkeypatch.delenv("MLGYM_REGISTRY_ENVS")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert environments_folder() == tmp_path / "cache" / "mlgym-registry" / "envs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert environments_folder() == Path.home() / ".cache" / "mlgym-registry" / "envs"


def test_missing_requirements_of_this_interpreter_and_of_another(tmp_path):
    requirements = ["numpy", "numpy>=99", NOWHERE, 'pandas; python_version < "3"', "numpy[any-extra]>=1"]
    assert missing_requirements(requirements) == ["numpy>=99", NOWHERE]
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    assert missing_requirements(requirements, python=bare / "bin" / "python") == [
        "numpy", "numpy>=99", NOWHERE, "numpy[any-extra]>=1"]


def test_a_task_runs_with_this_interpreter_when_it_has_the_packages(tmp_path):
    spec = load_task_yaml(task_file(tmp_path, ["numpy"]))
    assert task_python(spec) == sys.executable
    assert task_python(spec.replace(requirements=None)) == sys.executable
    assert prepared_python(spec) is None


def test_make_refuses_a_task_whose_packages_are_nowhere_naming_the_command(tmp_path):
    path = task_file(tmp_path, [NOWHERE, "numpy"])
    with pytest.raises(MissingTaskPackages) as caught:
        mlgym_registry.make(load_task_yaml(path))
    message = str(caught.value)
    assert f"needs packages that {sys.executable} does not have: {NOWHERE}." in message
    assert f"`mlgym-registry prepare {path}`" in message and f"mlgym_registry.prepare({str(path)!r})" in message
    assert isinstance(caught.value, InvalidTaskError) and caught.value.missing == [NOWHERE]


def test_the_mlgym_overlay_declares_each_tasks_packages(tmp_path, monkeypatch):
    checkout = tmp_path / "MLGym"
    header = "task_entrypoint: CSVSubmissionTasks\nstarter_code: []\nevaluation_paths: [evaluate.py]\n"
    write(checkout / "configs/tasks/titanic.yaml", "id: titanicSurvival\n" + header)
    write(checkout / "configs/tasks/maze.yaml",
          "id: rlMetaMazeMisc\nrequirements_path: data/maze/requirements.txt\n" + header)
    write(checkout / "data/maze/requirements.txt", "jax[cuda12]\ngymnax\nnumpy")
    monkeypatch.setenv("MLGYM_ROOT", str(checkout))
    registry = fresh_registry()
    assert task_requirements(registry.spec("mlgym/titanicSurvival")) == ["numpy", "pandas<3", "scikit-learn"]
    jax = "jax[cuda12]" if any(Path("/dev").glob("nvidia[0-9]*")) else "jax"  # the CUDA build on GPU hosts only
    pins = ["jaxlib==0.4.35", "flax==0.10.2", "optax==0.2.4", "chex==0.1.87", "gymnax==0.0.8",
            "tensorflow-probability==0.25.0"]  # versions that import together: the file's own lines are unpinned
    assert task_requirements(registry.spec("mlgym/rlMetaMazeMisc")) == [f"{jax}==0.4.35", *pins, "numpy"]


def test_prepare_says_when_this_interpreter_suffices_and_list_shows_nothing(tmp_path, envs, capsys):
    path = task_file(tmp_path, ["numpy"])
    lines: list[str] = []
    assert mlgym_registry.prepare(path, echo=lines.append) == Path(sys.executable)
    assert "has every package it needs (numpy); nothing to prepare" in lines[0]
    assert cli_main(["prepare", "--list"]) == 0
    assert capsys.readouterr().out == f"no prepared environments in {envs}\n"
    assert cli_main(["prepare"]) == 2
    assert not envs.exists()


@pytest.mark.slow
def test_a_pip_failure_says_why_and_leaves_nothing(tmp_path, envs):
    path = task_file(tmp_path, [NOWHERE])
    with pytest.raises(PrepareFailed, match=f"(?s)pip could not install {NOWHERE}.*No matching distribution"):
        mlgym_registry.prepare(path, echo=lambda line: None)
    assert sorted(p.name for p in envs.iterdir() if not p.name.endswith(".lock")) == []


EVALUATE = textwrap.dedent(
    """\
    import argparse, csv, json

    import six  # a package the driver's interpreter lacks: only the prepared environment has it

    parser = argparse.ArgumentParser()
    parser.add_argument("--submission_file")
    guess = [int(row["label"]) for row in csv.DictReader(open(parser.parse_args().submission_file))]
    right = sum(six.moves.map(lambda pair: pair[0] == pair[1], zip(guess, [0, 1, 1, 0])))
    print(json.dumps({"accuracy": right / 4}))
    """
)
"""A task needing a small pure-Python package from the configured index (pip's own configuration; offline here), so
that building its environment takes seconds: what is tested is the mechanism, not the packages."""


@pytest.mark.slow
def test_prepare_builds_an_environment_the_task_then_validates_with(tmp_path, envs, capsys):
    path = task_file(tmp_path / "task", ["six"], evaluate=EVALUATE)
    spec = load_task_yaml(path)
    with pytest.raises(MissingTaskPackages, match=f"`mlgym-registry prepare {path}`"):
        mlgym_registry.make(spec)

    assert cli_main(["prepare", str(path)]) == 0
    python = prepared_python(spec)
    assert python is not None and python.is_relative_to(envs.resolve())
    assert task_python(spec) == str(python) and missing_requirements(["six"], python) == []
    folder = python.parent.parent
    assert (folder / "requirements.txt").read_text() == "six\n"
    assert "six==" in (folder / "freeze.txt").read_text().lower()
    capsys.readouterr()
    assert cli_main(["prepare", "--list"]) == 0
    assert f"{environment_key(['six'])}  {folder}\n  requirements: six\n" in (
        capsys.readouterr().out)

    env = mlgym_registry.make(spec, batch_size=())
    try:
        td = env.reset()
        for command in ("printf 'id,label\\n0,0\\n1,1\\n2,0\\n3,0\\n' > submission.csv", "validate"):
            td.set(env.base_env.layout.response, fenced("Let me do this.", command))
            td = env.step_mdp(env.step(td))
        assert env.base_env.last_info["score"] == [{"accuracy": 0.75}]
    finally:
        env.close()
    assert os.path.samefile(mlgym_registry.prepare(spec, echo=lambda line: None), python)  # ready: reused
