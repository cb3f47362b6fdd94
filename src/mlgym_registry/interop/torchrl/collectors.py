"""TorchRL's multi-process collector over our envs (``episode_collector``, with ``TextPolicy`` running a text policy
next to each env).

``episode_collector`` is TorchRL's ``Collector(num_collectors=N)`` over the envs ``run_parallel`` plays
(``scale/runs.py``), for training loops that take batches of frames. It is lossy by TorchRL's design, not ours: a
worker whose frame waits more than a second in the collector's one-frame queue (``torchrl.collectors._runner``:
``queue_out.put(..., timeout=_TIMEOUT)``, then ``queue.Full``) drops it and plays on, so under load the main process
misses steps and whole episodes. Use it for frames a trainer can afford to miss, never to record episodes
(``run_parallel`` records every step: ``scale/process_episodes.py``). The workers are forked from a server that has
imported torch, TorchRL and this package (``scale.workers.warm_workers``), not spawned afresh.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from ...policies.base import PolicyError
from ...policies.give_up import GAVE_UP_RESPONSE
from ...specs import TaskSpec
from .env_factory import INFO_KEY, WORKER_KEY, EnvFactory  # noqa: F401 - part of this module's interface

STATS_KEY = "policy_stats"
"""Where ``TextPolicy`` puts its policy's usage so far (``Policy.stats()``, as JSON text; '' when it keeps none)."""
CALL_STATS_KEY = "_last_call"
"""Where ``TextPolicy`` puts the step's model call (``Policy.last_call``) inside the usage it sends."""

POLICY_ERROR_KEY = "policy_error"
"""Where ``TextPolicy`` puts why its policy gave up on an episode ('' when it did not)."""

IDLE_RESPONSE = "DISCUSSION\nThis worker has played its episodes.\n```\nexit_forfeit\n```"
"""What ``TextPolicy`` answers once its worker has played its episodes: the collector keeps every worker stepping
until it is shut down, and those steps (dropped by the receiver) must not cost a model call or an evaluation."""

IDLE_PAUSE = 0.25
"""Seconds ``TextPolicy`` waits before each ``IDLE_RESPONSE``: an idle worker would otherwise reset its env and forfeit
in a loop as fast as it can, taking a core from the workers still playing. A worker sees the collector's shutdown
between two steps, so this is also about the longest an idle worker delays it."""

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
        from ...transforms.layout import get_layout

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
        from ...policies import make_policy
        from ...transforms.history import as_dicts

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


def episode_collector(
    spec: TaskSpec | str,
    policy: str,
    num_envs: int,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    episodes_per_env: int = 1,
) -> tuple[Any, TextPolicy]:
    """TorchRL's collector over the envs ``run_parallel`` plays, and the ``TextPolicy`` its workers run; it starts
    its workers.

    TorchRL's multi-process ``Collector``: one worker per env, each building its env from the spec (``EnvFactory``,
    env ``i`` seeded ``seed + i`` then every ``num_envs``) and running ``policy`` next to it, one step per frame.
    The workers are forked from the warm server of ``scale/workers.py`` (``warm_workers``). Iterate it, then
    ``shutdown()`` it.
    """
    from torchrl.collectors import Collector
    from torchrl.weight_update import NoWeightSyncScheme

    from ...options import check_option
    from ...registry import registry
    from ...scale.workers import WithParentEnviron, warm_workers

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

