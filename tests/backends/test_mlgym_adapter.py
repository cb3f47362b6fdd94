"""The ``mlgym`` backend against MLGym's contract: a stand-in ``mlgym`` package that behaves as MLGym does where the
adapter meets it (``standin.py``), driving a container-engine double (``engine_double.py``: the ``docker``/``podman``
command line MLGym runs and the Docker Engine API it reaches through docker-py)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from engine_double import EngineDouble
from standin import STANDIN_COMMAND_DOCS

from mlgym_registry import BackendUnavailable, InvalidTaskError, TaskSpec, registry, seeding
from mlgym_registry.backends.mlgym import MLGymBackend, command_file_entry
from mlgym_registry.tasks.mlgym_source import load_mlgym_task

EVALUATE = """\
import json, os
lines = len(open("target.py").read().splitlines())
print(json.dumps({"Score": lines + (0 if os.environ.get("MLGYM_REGISTRY_EVAL_SEED") else 100)}))
"""


def game_spec(root: Path, **changes) -> TaskSpec:
    """A python-submission task of ours in ``root``: its score is target.py's line count, + 100 when the evaluator
    got no seed (MLGYM_REGISTRY_EVAL_SEED)."""
    folder = root / "game"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.py").write_text(EVALUATE)
    (folder / "target.py").write_text("x = 1\n")
    spec = TaskSpec(
        id="adapterTask", description="Beat the adapter.", root=str(root), max_steps=7,
        starter_code=["game/evaluate.py", "game/target.py"], evaluation_paths=["evaluate.py"],
        baseline_scores=[{"Score": 2.0}],
    )
    return spec.replace(**changes)


@pytest.fixture
def backends(mlgym_checkout):
    """Make backends that are closed at the end of the test."""
    made: list[MLGymBackend] = []

    def make(spec: TaskSpec, **options) -> MLGymBackend:
        made.append(MLGymBackend(spec, **options))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def started(engine: EngineDouble) -> list[list[str]]:
    return [call for call in engine.cli_calls if call[0] == "run"]


# -- bad input: each missing piece is one BackendUnavailable at make(), before anything starts ------------------------
def test_missing_mlgym_says_to_install_the_checkout(no_mlgym, tmp_path):
    if importlib.util.find_spec("mlgym") is not None:
        pytest.skip("an mlgym package is installed in this environment")
    with pytest.raises(BackendUnavailable) as caught:
        MLGymBackend(game_spec(tmp_path))
    message = str(caught.value)
    assert "pip install -e <MLGym checkout>" in message
    assert "pip install mlgym" not in message
    assert "github.com/facebookresearch/MLGym" in message


def test_pypi_mlgym_is_recognised(no_mlgym, monkeypatch, tmp_path):
    site = no_mlgym / "site"
    (site / "mlgym").mkdir(parents=True)
    (site / "mlgym" / "__init__.py").write_text("__version__ = '0.0.75'\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    with pytest.raises(BackendUnavailable, match="not facebookresearch/MLGym.*PyPI.*pip uninstall mlgym"):
        MLGymBackend(game_spec(tmp_path))


def test_mlgym_without_its_dependencies(mlgym_checkout, tmp_path):
    env_py = mlgym_checkout / "mlgym" / "environment" / "env.py"
    env_py.write_text("import docker\n" + env_py.read_text())  # as MLGym's env.py does; docker-py is absent here
    with pytest.raises(BackendUnavailable, match=r"No module named 'docker'.*pip install -e .*pip install docker"):
        MLGymBackend(game_spec(tmp_path))


def test_no_container_engine(mlgym_checkout, engine, monkeypatch, tmp_path):
    """MLGym defaults to docker, and so does the backend."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BackendUnavailable, match=r"`docker` is not on PATH.*docker pull aigym/mlgym-agent:latest"):
        MLGymBackend(game_spec(tmp_path))
    monkeypatch.setenv("PATH", str(engine.bin_dir))
    engine.set_dead()
    with pytest.raises(BackendUnavailable, match="`docker info` exited with 125: Cannot connect"):
        MLGymBackend(game_spec(tmp_path))
    assert not started(engine)


@pytest.mark.parametrize("container_type", ["docker", "podman"])
def test_no_engine_api_socket(mlgym_checkout, tmp_path, monkeypatch, container_type):
    """The command line answers but the Engine API MLGym reaches through docker-py does not (podman on PATH, no
    podman.socket): before, reset() failed with MLGym's RuntimeError."""
    double = EngineDouble(tmp_path / container_type, engine=container_type)  # its API is never started
    for key, value in double.environment(api=False).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(BackendUnavailable) as caught:
        MLGymBackend(game_spec(tmp_path), container_type=container_type)
    message = str(caught.value)
    assert f"No Docker Engine API answers at DOCKER_HOST=unix://{tmp_path / container_type}/no-such.sock" in message
    if container_type == "podman":
        assert "systemctl --user start podman.socket" in message and "export DOCKER_HOST=unix://" in message
    else:
        assert "sudo systemctl start docker" in message
    assert not started(double)


def test_make_refuses_a_machine_without_the_engine_api_before_building_anything(mlgym_checkout, tmp_path,
                                                                               monkeypatch):
    """``registry.make`` (and so ``run --backend mlgym``, before any output folder) asks the backend's
    ``check_available``: the missing API is named at make(), not at the first reset."""
    double = EngineDouble(tmp_path / "docker", engine="docker")
    for key, value in double.environment(api=False).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(BackendUnavailable, match="No Docker Engine API answers at DOCKER_HOST="):
        registry.make(game_spec(tmp_path), backend="mlgym", allow_unprotected_files=True)
    assert not started(double)


def test_default_socket_when_docker_host_is_unset(mlgym_checkout, monkeypatch, tmp_path):
    from mlgym_registry.backends.mlgym import engine as adapter

    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setattr(adapter, "DEFAULT_DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    with pytest.raises(BackendUnavailable, match=r"docker.sock \(DOCKER_HOST is unset\)"):
        MLGymBackend(game_spec(tmp_path))


def test_api_of_the_other_engine(mlgym_checkout, engine, tmp_path):
    engine.api_engine = "podman"  # DOCKER_HOST points at podman's API, container_type is docker
    with pytest.raises(BackendUnavailable, match=r"is podman's, but container_type='docker'.*container_type='podman'"):
        MLGymBackend(game_spec(tmp_path))
    assert not started(engine)


def test_missing_image(mlgym_checkout, engine, tmp_path):
    engine.images = []
    with pytest.raises(BackendUnavailable, match=r"'aigym/mlgym-agent:latest' is not in docker's image store.*"
                                                 r"`docker pull aigym/mlgym-agent:latest`.*mlgym.dockerfile"):
        MLGymBackend(game_spec(tmp_path))
    with pytest.raises(BackendUnavailable, match=r"`docker pull mine:1`"):
        MLGymBackend(game_spec(tmp_path), image_name="mine:1")
    assert ("GET", "/images/json") in engine.api_calls
    assert not started(engine)


def test_mlgym_without_the_task(mlgym_checkout, engine, tmp_path):
    with pytest.raises(BackendUnavailable, match=r"task class 'NoSuchTasks' \(task_entrypoint\).*git -C .* pull"):
        MLGymBackend(game_spec(tmp_path, task_entrypoint="NoSuchTasks"))
    with pytest.raises(BackendUnavailable, match=r"missing dataset_configs 'datasets/absent.yaml'.*pip install -e"):
        MLGymBackend(game_spec(tmp_path, dataset_configs=["datasets/absent.yaml"]))
    with pytest.raises(BackendUnavailable, match=r"missing starter_code 'game/gone.py'"):
        MLGymBackend(game_spec(tmp_path, starter_code=["game/gone.py"]))
    assert not started(engine)


def test_image_gone_at_reset_is_backend_unavailable(backends, engine, tmp_path):
    backend = backends(game_spec(tmp_path))
    engine.images = []
    with pytest.raises(BackendUnavailable, match="MLGym could not start its docker container.*not found"):
        backend.reset()


# -- the episode ------------------------------------------------------------------------------------------------------
def test_registry_make_drives_the_mlgym_env(mlgym_checkout, engine, tmp_path):
    env_module = importlib.import_module("mlgym.environment.env")
    spec = game_spec(tmp_path)
    env = registry.make(spec, backend="mlgym", devices=["cpu_3"], seed=0)
    td = env.reset()
    backend = env.base_env.backend
    mlgym_env = env_module.INSTANCES[-1]
    assert backend.env is mlgym_env
    # gym.make("mlgym/<id>", devices=[...]) built inside the checkout, with a task config written from the spec
    assert mlgym_env.devices == ["cpu_3"]
    assert Path(mlgym_env.cwd_at_init) == mlgym_checkout
    assert mlgym_env.args.task.id == "adapterTask" and mlgym_env.args.max_steps == 7
    assert mlgym_env.args.container_type == "docker" and mlgym_env.args.cache_baseline_scores is False
    task_yaml = Path(mlgym_env.args.task_config_path)
    assert task_yaml.is_absolute() and task_yaml.exists()
    # the container as MLGym starts it, and its image checked through the Engine API first
    assert started(engine)[-1][:6] == ["run", "-i", "--rm", "--network", "host", "--name"]
    assert started(engine)[-1][-3:] == ["aigym/mlgym-agent:latest", "/bin/bash", "-l"]
    # reset as TorchRL does (reset_container, cd), the seed exported, then MLGym's agent setup
    calls = [c for c in mlgym_env.calls if c[0] != "communicate" or not c[1].startswith(("bash -n", "export LAST"))]
    home = Path(engine.agent_home)
    first = calls.index(("reset_container",))  # after the container gym.make started
    assert calls[first:first + 4] == [
        ("reset_container",), ("close",), ("communicate", "exit"), ("communicate", f"mkdir -p {home}/commands")
    ]
    index = calls.index(("reset", str(mlgym_checkout)))
    exported = f"export MLGYM_REGISTRY_EVAL_SEED={seeding.derive('evaluation', 0, 0)}"  # derived, not the raw seed
    assert calls[index - 2:index] == [("communicate", f"cd {home}"), ("communicate", exported)]
    tools = [c for c in calls[index:] if c[0] == "communicate" and c[1].startswith("state()")]
    assert tools == [("communicate", backend.agent_config.tools_handler.state_command.code + "\nWINDOW=100\nOVERLAP=2")]
    history = td["history", "prompt"][0]
    assert STANDIN_COMMAND_DOCS in history.content[0]
    assert spec.description in history.content[1]

    td.set(("text", "response"), "DISCUSSION\nvalidate\n```\nvalidate\n```")
    td = env.step(td)
    assert ("step", "validate") in mlgym_env.calls
    assert td["next", "reward"].item() == pytest.approx(1.0 - 2.0)
    td = env.step_mdp(td)
    td.set(("text", "response"), "```\necho 'y = 2' >> target.py\n```")
    td = env.step_mdp(env.step(td))
    td.set(("text", "response"), "```\nsubmit\n```")
    td = env.step(td)
    assert td["next", "done"].item()
    # the default reward takes the episode's total to the submission's score minus the baseline (0, from -1)
    assert td["next", "reward"].item() == pytest.approx((2.0 - 2.0) - (1.0 - 2.0))

    env.close()
    assert mlgym_env.closed
    assert not task_yaml.exists()
    assert engine.containers() == []
    assert ("DELETE", f"/containers/{started(engine)[-1][-4]}") not in engine.api_calls  # removed by id, not name
    assert [c for c in engine.api_calls if c[0] == "DELETE"]


def test_scores_accumulate_over_the_episode(backends, tmp_path):
    """MLGym's info is fresh every step; the contract's ``info["score"]`` holds every metric dict so far."""
    backend = backends(game_spec(tmp_path), seed=0)
    backend.reset()
    backend.install_tools()
    scores = []
    for action in ("validate", "echo 'y = 2' >> target.py", "validate", "ls", "validate", "submit"):
        observation, _, done, info = backend.step(action)
        scores.append([s["Score"] for s in info["score"]])
    assert scores == [[1.0], [1.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0, 2.0], [1.0, 2.0, 2.0, 2.0]]
    assert done and info["exit_status"] == "submitted"
    for ending, status in (("skip", "skipped"), ("exit_forfeit", "exit_forfeit")):
        backend.reset()
        backend.install_tools()
        backend.step("validate")
        _, _, done, info = backend.step(ending)
        assert done and info["exit_status"] == status and info["score"] == [{"Score": 1.0}]
    backend.reset()  # a new episode starts from nothing
    _, _, _, info = backend.step("ls")
    assert info["score"] == [] and set(info) == {"model_stats", "exit_status", "submission", "score", "summarizer"}


def test_spec_changes_reach_mlgym_for_checkout_tasks(backends, mlgym_checkout, tmp_path):
    """Overrides and replaced starter files of an mlgym/<id> task are what MLGym runs (its own YAML is not used)."""
    spec = load_mlgym_task(mlgym_checkout / "configs" / "tasks" / "checkoutTask.yaml", mlgym_checkout)
    recorded = tmp_path / "recorded" / "target.py"
    recorded.parent.mkdir()
    recorded.write_text("a = 1\nb = 2\nc = 3\n")
    starter = [str(recorded) if Path(p).name == "target.py" else p for p in spec.starter_code]
    changed = spec.replace(training_timeout=7, baseline_scores=[{"Score": 1.5}], starter_code=starter)
    original_yaml = (mlgym_checkout / "configs" / "tasks" / "checkoutTask.yaml").read_text()
    backend = backends(changed, seed=0)
    assert backend.env.args.task_config_path != "tasks/checkoutTask.yaml"
    backend.reset()
    backend.install_tools()
    assert backend.task.args.training_timeout == 7
    assert backend.task.args.baseline_scores == [{"Score": 1.5}]
    observation, _, _, info = backend.step("validate")
    assert "Baseline Score: {'Score': 1.5}" in observation and info["score"] == [{"Score": 3.0}]
    assert (mlgym_checkout / "configs" / "tasks" / "checkoutTask.yaml").read_text() == original_yaml


def test_datasets_reach_mlgym(backends, mlgym_checkout, tmp_path):
    checkout_spec = load_mlgym_task(mlgym_checkout / "configs" / "tasks" / "checkoutTask.yaml", mlgym_checkout)
    data = tmp_path / "ours" / "data"
    data.mkdir(parents=True)
    (data / "train.csv").write_text("a,b\n1,2\n")
    ours = game_spec(tmp_path, description="Use the data.\n{dataset_docs}", datasets=[
        {"name": "trainset", "description": "rows of a and b", "data_path": "ours/data", "is_local": True},
    ])
    for spec, listing in ((checkout_spec, "numbers.txt"), (ours, "train.csv")):
        backend = backends(spec)
        backend.reset()
        observation, _, _, _ = backend.step("ls data")
        assert observation.split() == [listing]
    assert "TRAINSET:\nrows of a and b" in backend.task.args.description


def test_secret_and_protected_files_are_refused(backends, tmp_path):
    for field in ("secret_files", "protected_files"):
        with pytest.raises(InvalidTaskError) as caught:
            backends(game_spec(tmp_path, **{field: ["target.py"]}))
        message = str(caught.value)
        assert field in message and "backend='local'" in message and "allow_unprotected_files=True" in message
    backend = backends(game_spec(tmp_path, protected_files=["target.py"]), allow_unprotected_files=True)
    backend.reset()
    assert backend.step("ls")[0].split() == ["evaluate.py", "target.py"]


def test_house_regression_is_refused_with_the_fix(backends):
    spec = registry.spec("houseRegression")
    with pytest.raises(InvalidTaskError, match=r"secret_files=\['data/answer.csv'\].*backend='local'"):
        backends(spec)


def test_seeds_reach_the_task_and_the_evaluator(backends, tmp_path):
    backend = backends(game_spec(tmp_path), seed=3)
    assert backend.env_args.seed == 3
    backend.reset()
    backend.install_tools()
    assert backend.task.seed == 3
    assert backend.step("validate")[3]["score"] == [{"Score": 1.0}]
    backend.reset(seed=7)  # MLGym fixes its seed at construction; reset(seed=...) replaces it
    backend.install_tools()
    assert backend.task.seed == 7 and backend.env.seed == 7
    assert backend.step("validate")[3]["score"] == [{"Score": 1.0}]
    # the evaluator's seed is derived from the user's and the episode's index: the raw seed is nowhere in the shell
    assert backend.communicate("echo $MLGYM_REGISTRY_EVAL_SEED") == str(seeding.derive("evaluation", 7, 0))
    assert backend.communicate("echo ${MLGYM_REGISTRY_SEED-unset}") == "unset"
    backend.reset()  # the next episode of seed 7's stream
    assert backend.task.seed == 7
    assert backend.communicate("echo $MLGYM_REGISTRY_EVAL_SEED") == str(seeding.derive("evaluation", 7, 1))
    unseeded = backends(game_spec(tmp_path))
    unseeded.reset()
    assert unseeded.task.seed == 42  # MLGym's default
    assert unseeded.communicate("echo ${MLGYM_REGISTRY_EVAL_SEED-unset}") == "unset"


def test_returncode_after_a_step_is_the_actions(backends, tmp_path):
    """MLGym runs ``export LAST_ACTION=...`` after the action, and evaluations after validate."""
    backend = backends(game_spec(tmp_path))
    backend.reset()
    backend.install_tools()
    backend.step("(exit 3)")
    assert backend.returncode == 3 and backend.env.returncode == 0
    backend.step("true")
    assert backend.returncode == 0
    backend.step("ls no-such-file")
    assert backend.returncode == 2
    backend.step("validate")
    assert backend.returncode == 0
    assert backend.communicate("false") == "" and backend.returncode == 1


def test_state_and_tools_run_in_the_container(backends, engine, tmp_path):
    backend = backends(game_spec(tmp_path))
    backend.reset()
    tools = backend.install_tools()
    state = json.loads(backend.communicate(tools.state_command))
    assert state["working_dir"] == str(backend.task_workspace)
    assert backend.step("open target.py")[0] == "opened target.py"
    # MLGym copies each tool in with `<engine> cp`, then `exec -u root ... chown`; scripts are chmod'ed via the API
    copied = [c for c in engine.cli_calls if c[0] == "cp" and "/commands/" in c[2]]
    assert [Path(c[2]).name for c in copied][-4:] == ["defaults.sh", "submit", "validate", "_split_string"]
    assert ["exec", "-u", "root"] == next(c for c in engine.cli_calls if c[0] == "exec")[:3]
    assert ("POST", "/containers/" + engine.containers()[0]["Id"] + "/exec") in engine.api_calls


def test_conformance_kit_accepts_the_container_backend(mlgym_checkout, engine, tmp_path):
    """``task_workspace`` is a path inside the container; the backend has no ``host_workspace``."""
    from mlgym_registry.testing import check_backend

    check_backend(MLGymBackend, game_spec(tmp_path), seed=0)
    assert not hasattr(MLGymBackend, "host_workspace")
    assert engine.containers() == []


def test_command_file_without_shebang_or_sh_is_refused(tmp_path):
    tool = tmp_path / "tool.py"
    tool.write_text("print(1)\n")
    with pytest.raises(ValueError, match="neither starts with a shebang nor ends in .sh"):
        command_file_entry(tool)


def test_conformance_kit_rejects_scores_that_do_not_accumulate(mlgym_checkout, tmp_path):
    """What the adapter did before: MLGym's fresh per-step info passed through."""
    from mlgym_registry.testing import ConformanceError, check_backend

    class PassThrough(MLGymBackend):
        def step(self, action):
            observation, reward, done, info = super().step(action)
            return observation, reward, done, {**info, "score": info["score"][-1:] if info["score"] else []}

    with pytest.raises(ConformanceError, match=r"it must accumulate"):
        check_backend(PassThrough, game_spec(tmp_path), seed=0)


@pytest.mark.parametrize(("actions", "agent"), [
    (["validate", "echo 'y = 2' >> target.py", "validate", "validate", "submit"], [1.0, 2.0, 2.0, 2.0]),
    (["validate", "skip"], [1.0]),
    (["validate", "exit_forfeit"], [1.0]),
])
def test_results_json_holds_every_score_of_the_episode(mlgym_checkout, tmp_path, actions, agent):
    from standin import Script

    from mlgym_registry.episodes.episode import run_episode
    from mlgym_registry.records.trajectories import TrajectoryWriter, load_results

    spec = game_spec(tmp_path)
    env = registry.make(spec, backend="mlgym", seed=0)
    writer = TrajectoryWriter(tmp_path / "out", spec.id, baseline=spec.baseline)
    try:
        run_episode(env, Script([f"DISCUSSION\nGo.\n```\n{a}\n```\n" for a in actions]), spec=spec, writer=writer)
    finally:
        env.close()
    assert [s["Score"] for s in load_results(writer.results_path)["agent"]] == agent


def test_podman_runs_through_its_api_socket(mlgym_checkout, monkeypatch, tmp_path):
    double = EngineDouble(tmp_path / "podman", engine="podman").start()
    try:
        for key, value in double.environment().items():
            monkeypatch.setenv(key, value)
        backend = MLGymBackend(game_spec(tmp_path), container_type="podman")
        try:
            backend.reset()
            assert backend.step("ls")[0].split() == ["evaluate.py", "target.py"]
        finally:
            backend.close()
        assert [c for c in double.cli_calls if c[0] == "run"][0][:5] == ["run", "-i", "--rm", "--network", "host"]
        assert double.containers() == []
    finally:
        double.stop()


def test_podman_socket_is_named_when_docker_host_is_unset(mlgym_checkout, monkeypatch, tmp_path):
    from mlgym_registry.backends.mlgym import engine as adapter

    double = EngineDouble(tmp_path / "podman", engine="podman")
    for key, value in double.environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setattr(adapter, "DEFAULT_DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run" / "podman").mkdir(parents=True)
    (tmp_path / "run" / "podman" / "podman.sock").touch()
    with pytest.raises(BackendUnavailable, match=rf"podman's socket is at {tmp_path}/run/podman/podman.sock: "
                                                 rf"`export DOCKER_HOST=unix://{tmp_path}/run/podman/podman.sock`"):
        MLGymBackend(game_spec(tmp_path), container_type="podman")
