"""One episode recorder for every engine: the same episode, played in this process, in a worker process and in a Ray
actor (a real local Ray runtime), leaves the same ``.traj`` and ``results.json`` with each parser, native tool calls
included; a failed episode's ``fail`` record reaches the files on every engine.

Each engine plays one short episode (``max_steps=2``) of the same task with the same seed; the records are compared
whole but for what differs from run to run by nature (times, the worker's pid). The Ray runtime is the one the other
Ray test modules share (``shared_ray``); the module's fixtures are session-scoped so that its tests stay in that group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from shared_ray import RAY_GROUP, shared_ray  # noqa: F401 - the fixture

from mlgym_registry import registry
from mlgym_registry.episodes.episode import run_episode
from mlgym_registry.policies import PolicyText, make_policy
from mlgym_registry.policies.give_up import GiveUpWithExitApi
from mlgym_registry.records.recorder import CallRecorder, EpisodeRecorder, replay
from mlgym_registry.records.trajectories import Step, TrajectoryWriter
from mlgym_registry.scale.runs import run_episodes

pytestmark = pytest.mark.xdist_group(RAY_GROUP)

TASK = "prisonersDilemma"
SEED = 11
PARSERS = {
    "thought_action": {},
    "xml_thought_action": {},
    "tool_calls": {"template": "tool_calling"},
}
"""Each parser played, with the components it needs beside it (native tool calls need the tool-calling template)."""
TIMING_KEYS = {"execution_time", "started", "ended", "versions", "model_seconds", "max_call_seconds"}
"""What differs between two plays of the same episode by nature: how long things took, when, on what install."""


def spec_for(parser: str, workspaces: Path):
    changes = {"parser": parser, **PARSERS[parser]}
    return registry.spec(registry.spec(TASK).replace(
        max_steps=2, backend_options={"workspace_dir": str(workspaces)}, components={}, **changes))


def without_timing(value: Any) -> Any:
    """``value`` without the entries that say how long or when."""
    if isinstance(value, dict):
        return {key: without_timing(item) for key, item in value.items() if key not in TIMING_KEYS}
    if isinstance(value, list):
        return [without_timing(item) for item in value]
    return value


def record(folder: Path) -> dict[str, Any]:
    """The ``.traj`` and ``results.json`` in ``folder``, without their timings."""
    traj = json.loads((folder / f"{TASK}.traj").read_text())
    results = json.loads((folder / "results.json").read_text())
    return without_timing({"traj": traj, "results": results})


def in_process(spec, out: Path) -> dict[str, Any]:
    env = registry.make(spec, batch_size=())
    policy = make_policy("scripted", task_id=spec.id)
    try:
        writer = TrajectoryWriter(out, spec.id, baseline=spec.baseline, environment=f"mlgym_registry:{spec.backend}")
        result = run_episode(env, policy, spec=spec, writer=writer, seed=SEED)
    finally:
        env.close()
    assert result.finished and not result.failure
    return record(out)


def on_engine(spec, out: Path, engine: str, policy: str = "scripted") -> dict[str, Any]:
    (result,) = run_episodes(spec, policy, 1, engine=engine, out=out, seed=SEED)
    assert result.finished, result.failure
    saved = record(out / "env0")
    assert saved["results"].get("failed", "") == result.failure
    return saved


UNREACHABLE = PolicyText("openai:nobody-listens", {"base_url": "http://127.0.0.1:9/v1", "max_retries": 0})
"""A model server nobody answers at: the policy gives up on its first call (``PolicyError``)."""


def given_up_in_process(spec, out: Path) -> dict[str, Any]:
    """An episode whose policy gives up, played here as every engine plays it: ``exit_api``, then the failure."""
    env = registry.make(spec, batch_size=())
    policy = GiveUpWithExitApi(make_policy(UNREACHABLE, task_id=spec.id))
    try:
        writer = TrajectoryWriter(out, spec.id, baseline=spec.baseline, environment=f"mlgym_registry:{spec.backend}")
        result = run_episode(env, policy, spec=spec, writer=writer, seed=SEED)
        writer.fail(policy.error, info=result.info)
    finally:
        env.close()
    return record(out)


@pytest.fixture(scope="session")
def workspaces(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("workspaces")


@pytest.fixture(scope="session")
def references(tmp_path_factory, workspaces) -> dict[str, dict[str, Any]]:
    """Each parser's episode played in this process: what every engine must record."""
    return {parser: in_process(spec_for(parser, workspaces), tmp_path_factory.mktemp(f"here-{parser}"))
            for parser in PARSERS}


def test_the_reference_records_are_full_episodes(references):
    for parser, reference in references.items():
        traj, results = reference["traj"], reference["results"]
        assert traj["trajectory"], parser
        assert traj["run"]["components"]["parser"]["name"] == parser
        assert traj["run"]["seed"] == SEED and results["run"] == traj["run"]
        assert "failed" not in results
    roles = [message["role"] for message in references["tool_calls"]["traj"]["history"]]
    assert "tool" in roles  # the tool-calling episode's answers are recorded as tool messages


@pytest.mark.slow
@pytest.mark.parametrize("parser", list(PARSERS))
def test_worker_processes_record_what_this_process_records(parser, references, workspaces, tmp_path):
    assert on_engine(spec_for(parser, workspaces), tmp_path, "process") == references[parser]


@pytest.fixture(scope="session")
def given_up(tmp_path_factory, workspaces) -> dict[str, Any]:
    """An episode whose policy gave up, played in this process."""
    saved = given_up_in_process(spec_for("thought_action", workspaces), tmp_path_factory.mktemp("given-up"))
    assert saved["results"]["failed"].startswith("PolicyError: ")
    assert saved["traj"]["trajectory"][-1]["action"].strip() == "exit_api"
    # the provenance names the model and its endpoint through the give-up wrapper, as for the bare policy
    assert saved["traj"]["run"]["policy"] == {"name": "openai", "model": "nobody-listens",
                                              "endpoint": "http://127.0.0.1:9/v1"}
    return saved


@pytest.mark.slow
def test_a_policy_that_gives_up_in_a_worker_process_is_recorded_as_here(given_up, workspaces, tmp_path):
    assert on_engine(spec_for("thought_action", workspaces), tmp_path, "process", UNREACHABLE) == given_up


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("parser", list(PARSERS))
def test_ray_actors_record_what_this_process_records(parser, references, workspaces, shared_ray,  # noqa: F811
                                                     tmp_path):
    assert on_engine(spec_for(parser, workspaces), tmp_path, "ray") == references[parser]


@pytest.mark.slow
@pytest.mark.ray
def test_a_policy_that_gives_up_in_a_ray_actor_is_recorded_as_here(given_up, workspaces, shared_ray,  # noqa: F811
                                                                     tmp_path):
    assert on_engine(spec_for("thought_action", workspaces), tmp_path, "ray", UNREACHABLE) == given_up


class Failing:
    """A scripted policy that raises on its second turn: the episode cannot go on."""

    name = "failing"

    def __init__(self, spec) -> None:
        self.policy = make_policy("scripted", task_id=spec.id)
        self.turns = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def __call__(self, messages) -> str:
        self.turns += 1
        if self.turns == 2:
            raise RuntimeError("the model fell over")
        return self.policy(messages)


def test_a_failed_episode_keeps_its_fail_record_through_a_call_recorder(workspaces, tmp_path):
    spec = spec_for("thought_action", workspaces)
    records = {}
    for name in ("direct", "replayed"):
        writer = TrajectoryWriter(tmp_path / name, spec.id, baseline=spec.baseline)
        recorder = writer if name == "direct" else CallRecorder()
        env = registry.make(spec, batch_size=())
        try:
            with pytest.raises(RuntimeError, match="fell over"):
                run_episode(env, Failing(spec), spec=spec, writer=recorder, seed=SEED)
        finally:
            env.close()
        if isinstance(recorder, CallRecorder):
            writer.provenance = recorder.provenance
            replay(recorder.take(), writer)
        records[name] = record(tmp_path / name)
    assert records["direct"]["results"]["failed"] == "RuntimeError: the model fell over"
    assert records["replayed"] == records["direct"]


def test_the_recorders_follow_the_protocol_and_an_unknown_call_is_refused(tmp_path):
    assert isinstance(TrajectoryWriter(tmp_path, TASK), EpisodeRecorder)
    assert isinstance(CallRecorder(), EpisodeRecorder)
    recorder = CallRecorder()
    recorder.system("sys")
    recorder.step(Step(action="ls", observation="a b", response="r", state="{}", thought="t"), info={"k": 1})
    assert recorder.take() == (("system", "sys"), ("step", Step(action="ls", observation="a b", response="r",
                                                                  state="{}", thought="t"), {"k": 1}))
    assert recorder.take() == ()
    with pytest.raises(ValueError, match="unknown recorder call 'shout'.*system, user, tool"):
        replay([("shout", "hello")], TrajectoryWriter(tmp_path, TASK))
