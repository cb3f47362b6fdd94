"""The ``mlgym`` backend's wiring, against a stand-in ``mlgym`` package written here (the real one needs containers)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from standin import STANDIN_COMMAND_DOCS, write_container_engine, write_standin_mlgym

from mlgym_registry import BackendUnavailable, TaskSpec, registry
from mlgym_registry.backends.mlgym import MLGymBackend, command_file_entry

SPEC = TaskSpec(id="adapterTask", description="Beat the adapter.", baseline_scores=[{"Score": 2.0}], max_steps=7)


def _forget_mlgym() -> None:
    for name in [n for n in sys.modules if n == "mlgym" or n.startswith("mlgym.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def no_mlgym(monkeypatch, tmp_path):
    """No mlgym importable, and a PATH with only a working podman."""
    _forget_mlgym()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / "mlgym").exists()])
    bin_dir = tmp_path / "bin"
    write_container_engine(bin_dir, "podman")
    monkeypatch.setenv("PATH", str(bin_dir))
    yield tmp_path
    _forget_mlgym()


@pytest.fixture
def mlgym_checkout(no_mlgym, monkeypatch):
    """The stand-in MLGym checkout, "installed" (on sys.path), with a podman that answers."""
    root = write_standin_mlgym(no_mlgym / "MLGym")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield root
    import gymnasium as gym

    for key in [k for k in gym.registry if k.startswith("mlgym/")]:
        del gym.registry[key]


def test_missing_mlgym_says_to_install_the_checkout(no_mlgym):
    if importlib.util.find_spec("mlgym") is not None:
        pytest.skip("an mlgym package is installed in this environment")
    with pytest.raises(BackendUnavailable) as caught:
        MLGymBackend(SPEC)
    message = str(caught.value)
    assert "pip install -e <MLGym checkout>" in message
    assert "pip install mlgym" not in message
    assert "github.com/facebookresearch/MLGym" in message


def test_pypi_mlgym_is_recognised(no_mlgym, monkeypatch):
    site = no_mlgym / "site"
    (site / "mlgym").mkdir(parents=True)
    (site / "mlgym" / "__init__.py").write_text("__version__ = '0.0.75'\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    with pytest.raises(BackendUnavailable, match="not facebookresearch/MLGym.*PyPI.*pip uninstall mlgym"):
        MLGymBackend(SPEC)


def test_no_container_engine(mlgym_checkout, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BackendUnavailable, match="No container engine answers: `podman` is not on PATH"):
        MLGymBackend(SPEC)
    dead = tmp_path / "dead"
    write_container_engine(dead, "docker", answers=False)
    monkeypatch.setenv("PATH", str(dead))
    with pytest.raises(BackendUnavailable, match="`docker info` exited with 125: Cannot connect"):
        MLGymBackend(SPEC, container_type="docker")


def test_registry_make_drives_the_mlgym_env(mlgym_checkout):
    env_module = importlib.import_module("mlgym.environment.env")
    env = registry.make(SPEC, backend="mlgym", container_type="podman", devices=["cpu_3"])
    td = env.reset()
    backend = env.base_env.backend
    mlgym_env = env_module.INSTANCES[-1]
    assert backend.env is mlgym_env
    # gym.make("mlgym/<id>", devices=[...]) built inside the checkout, with our task config and settings
    assert mlgym_env.devices == ["cpu_3"]
    assert Path(mlgym_env.cwd_at_init) == mlgym_checkout
    assert mlgym_env.args.task.id == "adapterTask" and mlgym_env.args.max_steps == 7
    assert mlgym_env.args.container_type == "podman" and mlgym_env.args.cache_baseline_scores is False
    task_yaml = Path(mlgym_env.args.task_config_path)
    assert task_yaml.is_absolute() and task_yaml.exists()
    # reset as TorchRL does, then MLGym's agent setup: state command + env variables, then the command files
    assert mlgym_env.calls[:3] == [
        ("reset_container",), ("communicate", "cd /home/agent"), ("reset", str(mlgym_checkout))
    ]
    assert mlgym_env.calls[3] == ("communicate", "state() { echo state; }\nWINDOW=100\nOVERLAP=2")
    assert mlgym_env.calls[4] == ("communicate", "state")
    assert [(c["name"], c["type"]) for c in mlgym_env.commands] == [
        ("defaults.sh", "source_file"), ("submit", "script"), ("_split_string", "utility")
    ]
    # MLGym's command docs and the task's fields fill the system message
    history = td["history", "prompt"][0]  # the one env's conversation
    assert STANDIN_COMMAND_DOCS in history.content[0]
    assert SPEC.description in history.content[1]

    td.set(("text", "response"), "DISCUSSION\nvalidate\n```\nvalidate\n```")
    td = env.step(td)
    assert mlgym_env.calls[-2] == ("step", "validate")
    assert td["next", "reward"].item() == pytest.approx(3.0 - 2.0)
    td = env.step_mdp(td)
    td.set(("text", "response"), "```\nsubmit\n```")
    td = env.step(td)
    assert td["next", "done"].item()
    assert td["next", "reward"].item() == pytest.approx(3.5 - 2.0)

    env.close()
    assert mlgym_env.closed
    assert not task_yaml.exists()


def test_checkout_task_uses_its_own_config(mlgym_checkout):
    from mlgym_registry import load_task_yaml

    spec = load_task_yaml(mlgym_checkout / "configs" / "tasks" / "checkoutTask.yaml")
    backend = MLGymBackend(spec)
    try:
        assert backend.env.args.task_config_path == "tasks/checkoutTask.yaml"
        backend.reset()
        assert backend.task.args.description == "Do the checkout task."
    finally:
        backend.close()
        backend.close()  # twice is fine


def test_step_returns_mlgym_four_tuple_with_plain_info(mlgym_checkout):
    backend = MLGymBackend(SPEC)
    try:
        backend.reset()
        observation, reward, done, info = backend.step("ls")
        assert (observation, reward, done) == ("ran: ls", 0, False)
        assert type(info) is dict and set(info) >= {"model_stats", "exit_status", "submission", "score", "summarizer"}
    finally:
        backend.close()


def test_command_file_without_shebang_or_sh_is_refused(tmp_path):
    tool = tmp_path / "tool.py"
    tool.write_text("print(1)\n")
    with pytest.raises(ValueError, match="neither starts with a shebang nor ends in .sh"):
        command_file_entry(tool)
