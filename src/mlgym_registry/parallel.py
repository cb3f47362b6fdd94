"""Several episodes at once on one machine, through TorchRL's multi-process collector.

Workers rebuild their env from ``TaskSpec.to_dict()`` (``EnvFactory``: picklable, with no reference to anything
registered in this process) and run the policy next to it (``TextPolicy``: a TensorDict module around one of our text
policies). Each worker plays its episodes on its own; this process receives every step as it happens, rebuilds the
turns and writes each episode's ``.traj`` and ``results.json`` as they grow. The workers are forked from a server
that has imported torch, TorchRL and this package (``workers.warm_workers``), not spawned afresh.

On TorchRL 0.14, with string actions and ``History`` data, ``Collector(num_collectors=N)`` was the fastest of the
options measured (``ParallelEnv`` also works, with its defaults: ``transforms/pools.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from .env_factory import INFO_KEY, WORKER_KEY, EnvFactory
from .episode import EpisodeResult, Turn, parse_turn, text_at
from .episode_folders import FolderName, episode_folder
from .policies.base import PolicyError
from .specs import TaskSpec
from .trajectories import TrajectoryWriter

STATS_KEY = "policy_stats"
CALL_STATS_KEY = "_last_call"
"""Where ``TextPolicy`` puts the step's model call (``Policy.last_call``) inside the usage it sends."""
"""Where ``TextPolicy`` puts its policy's usage so far (``Policy.stats()``, as JSON text; '' when it keeps none)."""

POLICY_ERROR_KEY = "policy_error"
"""Where ``TextPolicy`` puts why its policy gave up on an episode ('' when it did not)."""

IDLE_RESPONSE = "DISCUSSION\nThis worker has played its episodes.\n```\nexit_forfeit\n```"
"""What ``TextPolicy`` answers once its worker has played its episodes: the collector keeps every worker stepping
until it is shut down, and those steps (dropped by the receiver) must not cost a model call or an evaluation."""

IDLE_PAUSE = 0.25
"""Seconds ``TextPolicy`` waits before each ``IDLE_RESPONSE``: an idle worker would otherwise reset its env and forfeit
in a loop as fast as it can, taking a core from the workers still playing. A worker sees the collector's shutdown
between two steps, so this is also about the longest an idle worker delays it."""

GAVE_UP_RESPONSE = "DISCUSSION\nThe model could not be reached.\n```\nexit_api\n```"
"""What ``TextPolicy`` answers when its policy gave up (``PolicyError``): MLGym's ``exit_api``, which autosubmits."""

class TextPolicy(TensorDictModuleBase):
    """A TensorDict module around a text policy (``make_policy(text)``), built lazily in the process that runs it.

    It reads the conversation from the env's ``History`` and writes the response text; a conversation of only the
    system and task messages starts a new episode (the text policy is reset). Beside the response it writes the
    policy's usage (``STATS_KEY``) and, when the policy gave up on the episode (``PolicyError``), why
    (``POLICY_ERROR_KEY``; the response is then ``exit_api``). With ``episodes`` set, the episodes after that many
    are answered with ``IDLE_RESPONSE``, without calling the policy, each after a pause of ``idle_pause`` seconds.
    """

    def __init__(self, policy: str, task_id: str | None = None, layout: str = "default",
                 episodes: int | None = None, parser: str | None = None, idle_pause: float = IDLE_PAUSE):
        from .transforms.layout import get_layout

        super().__init__()
        keys = get_layout(layout)
        self.policy_text = policy
        self.task_id = task_id
        self.parser = parser  # the env's parser (name or "module:attr"): the scripted policy writes in its format
        self.layout_name = layout
        self.episodes = episodes
        self.idle_pause = idle_pause
        self.in_keys = [keys.history]
        self.out_keys = [keys.response, STATS_KEY, POLICY_ERROR_KEY]
        self._policy = None
        self._started = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_policy"] = None  # each process builds its own
        return state

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        from .policies import make_policy
        from .transforms.history import as_dicts

        messages = as_dicts(tensordict.get(self.in_keys[0]))
        if self._policy is None:
            self._policy = make_policy(self.policy_text, task_id=self.task_id, parser=self.parser)
        if len(messages) <= 2:
            self._started += 1
            self._policy.reset()
        error = ""
        if self.episodes is not None and self._started > self.episodes:
            time.sleep(self.idle_pause)
            response = IDLE_RESPONSE
        else:
            try:
                response = self._policy(messages)
            except PolicyError as exc:
                response, error = GAVE_UP_RESPONSE, f"{type(exc).__name__}: {exc}"
        stats = self._policy.stats()
        last_call = getattr(self._policy, "last_call", None)
        call = None if error or last_call is None else last_call()
        if stats and call is not None:  # the step's call travels with the usage; the receiver takes it out
            stats = {**stats, CALL_STATS_KEY: call}
        tensordict.set(self.out_keys[0], response)
        tensordict.set(STATS_KEY, json.dumps(stats) if stats else "")
        tensordict.set(POLICY_ERROR_KEY, error)
        return tensordict


@dataclass
class _Episode:
    """An episode being received from a worker."""

    result: EpisodeResult
    writer: TrajectoryWriter | None


class _Receiver:
    """Turns the frames workers send into episodes, each recorded as it grows.

    A worker plays its episodes one after another; a frame with a trajectory id not seen before starts the worker's
    next episode. Once a worker has finished ``per_env`` episodes its further frames (the collector keeps it busy
    until shutdown) are dropped.
    """

    def __init__(self, spec: TaskSpec, parser: Any, module: TextPolicy, out: Path | None, per_env: int,
                 folders: FolderName | None = None):
        self.spec, self.parser, self.module, self.out, self.per_env = spec, parser, module, out, per_env
        self.folders = folders
        self.current: dict[int, tuple[int, _Episode]] = {}
        self.done: dict[int, list[EpisodeResult]] = {}
        self.steps = 0

    @property
    def finished(self) -> int:
        """Episodes finished so far."""
        return sum(len(results) for results in self.done.values())

    def receive(self, frame: TensorDictBase) -> None:
        """Record one collected step."""
        worker = int(text_at(frame, ("next", WORKER_KEY)))
        trajectory = int(frame.get(("collector", "traj_ids")).item())
        results = self.done.setdefault(worker, [])
        if len(results) >= self.per_env:
            return
        current = self.current.get(worker)
        if current is None or current[0] != trajectory:
            current = self.current[worker] = (trajectory, self._start(worker, len(results), frame))
        episode = current[1]
        turn = _turn(frame, len(episode.result.turns), self.parser, self.module)
        episode.result.turns.append(turn)
        self.steps += 1
        if turn.info is not None:
            episode.result.info = turn.info
        stats = text_at(frame, STATS_KEY)
        if stats:
            stats = json.loads(stats)
            turn.call = stats.pop(CALL_STATS_KEY, None)
            episode.result.info = {**episode.result.info, "model_stats": stats}
            turn.info = episode.result.info
        if episode.writer is not None:
            episode.writer.step(turn.step(), info=episode.result.info)
            messages = _messages(frame.get("next"), self.module.in_keys[0])
            if not turn.done and messages and messages[-1]["role"] == "user":
                episode.writer.user(messages[-1]["content"])
        error = text_at(frame, POLICY_ERROR_KEY)
        if error:
            episode.result.failure = error
            if episode.writer is not None:
                episode.writer.fail(error, info=episode.result.info)
        if turn.done:
            episode.result.finished = True
            results.append(episode.result)
            del self.current[worker]
            if episode.writer is not None:
                episode.writer.finish(episode.result.info)

    def _start(self, worker: int, number: int, frame: TensorDictBase) -> _Episode:
        writer = None
        if self.out is not None:
            folder = episode_folder(worker, number, self.per_env, self.folders)
            writer = TrajectoryWriter(Path(self.out) / folder, self.spec.id.replace("/", "_"),
                                      baseline=self.spec.baseline, environment=f"mlgym_registry:{self.spec.backend}")
            for message in _messages(frame, self.module.in_keys[0]):
                (writer.system if message["role"] == "system" else writer.user)(message["content"])
        return _Episode(EpisodeResult(self.spec), writer)

    def results(self) -> list[EpisodeResult]:
        """Every episode, finished ones first per worker then any cut short, in worker order."""
        ordered = []
        for worker in sorted(set(self.done) | set(self.current)):
            ordered += self.done.get(worker, [])
            if worker in self.current:
                ordered.append(self.current[worker][1].result)
        return ordered


def episode_collector(
    spec: TaskSpec | str,
    policy: str,
    num_envs: int,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    episodes_per_env: int = 1,
) -> tuple[Any, TextPolicy]:
    """The collector ``run_parallel`` plays through, and the ``TextPolicy`` its workers run; it starts its workers.

    TorchRL's multi-process ``Collector``: one worker per env, each building its env from the spec (``EnvFactory``,
    env ``i`` seeded ``seed + i`` then every ``num_envs``) and running ``policy`` next to it, one step per frame.
    The workers are forked from the warm server of ``workers.py`` (``warm_workers``). Iterate it, then
    ``shutdown()`` it.
    """
    from torchrl.collectors import Collector
    from torchrl.weight_update import NoWeightSyncScheme

    from .registry import registry
    from .validation import check_option
    from .workers import WithParentEnviron, warm_workers

    spec = registry.spec(spec)
    # the receiver reads the chain's own unbatched frames
    options = {"batch_size": (), **(options or {})}
    check_option("seed", seed)
    # each env seeds its own episodes, as Ray's runner seeds them (TorchRL's set_seed would derive other seeds)
    factories = [EnvFactory(spec.to_dict(), dict(options), index=index, seed=None if seed is None else seed + index,
                            seed_stride=num_envs) for index in range(num_envs)]
    module = TextPolicy(policy, task_id=spec.id, episodes=episodes_per_env,
                        parser=spec.components.get("parser") or spec.parser)
    # the text policy has no weights to send; TorchRL's default shared-memory scheme for nn.Module policies can also
    # deadlock a worker when it is garbage-collected (its __del__ starts a queue thread). Workers forked from a
    # server that has imported torch, TorchRL and this package: building and shutting down N costs little more than 1
    with warm_workers():
        collector = Collector([WithParentEnviron(factory) for factory in factories], module, frames_per_batch=1,
                              total_frames=-1, num_collectors=num_envs, sync=False,
                              weight_sync_schemes={"policy": NoWeightSyncScheme()})
    return collector, module


def run_parallel(
    spec: TaskSpec | str,
    policy: str,
    num_envs: int,
    *,
    out: Path | None = None,
    seed: int | None = None,
    on_step: Callable[[int, int], None] | None = None,
    options: dict[str, Any] | None = None,
    episodes_per_env: int = 1,
    folders: FolderName | None = None,
) -> list[EpisodeResult]:
    """Play ``num_envs`` episodes at once, one env per worker process, and return their results in worker order.

    Each worker plays ``episodes_per_env`` episodes in a row. ``out`` gets ``env<i>/<task>.traj`` and
    ``env<i>/results.json`` per episode (``env<i>-<k>/`` with several episodes per env, or what ``folders`` names),
    saved at every step. Episode ``k`` of env ``i`` is seeded ``seed + k * num_envs + i``, as on Ray.
    ``on_step(finished_episodes, steps_so_far)`` is called as steps arrive.
    """
    from .registry import registry

    spec = registry.spec(spec)
    parser = registry.component(spec, "parser")  # before any worker starts
    collector, module = episode_collector(spec, policy, num_envs, seed=seed, options=options,
                                          episodes_per_env=episodes_per_env)
    receiver = _Receiver(spec, parser, module, out, episodes_per_env, folders)
    try:
        for batch in collector:
            for frame in batch.reshape(-1).unbind(0):
                receiver.receive(frame)
                if on_step is not None:
                    on_step(receiver.finished, receiver.steps)
            if receiver.finished >= num_envs * episodes_per_env:
                break
    finally:
        collector.shutdown()
    return receiver.results()


def _messages(td: TensorDictBase, key: Any) -> list[dict[str, str]]:
    from .transforms.history import as_dicts

    return as_dicts(td.get(key))


def _turn(frame: TensorDictBase, index: int, parser: Any, module: TextPolicy) -> Turn:
    """The ``Turn`` a collected frame holds."""
    from .transforms.layout import get_layout

    keys = get_layout(module.layout_name)
    after = frame.get("next")
    response = text_at(frame, keys.response)
    thought, action, observation, format_error = parse_turn(parser, response, after, keys.observation)
    info_text = text_at(after, INFO_KEY)
    return Turn(
        index=index,
        response=response,
        thought=thought,
        action=action,
        observation=observation,
        reward=float(after.get(keys.reward).sum()),
        done=bool(after.get("done").any()),
        state=text_at(frame, keys.state),
        execution_time=0.0,
        format_error=format_error,
        info=json.loads(info_text) if info_text else None,
    )
