"""Building a task's env in another process: ``EnvFactory`` (picklable, with no reference to anything registered in
the process that made it), and the transforms that let a worker's steps carry what the driver needs (the backend's
``info``, the env's index) and seed each episode. Used by TorchRL's collectors and pools (``collectors``, ``pools``)
and Ray's collectors (``ray_collectors``) alike."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDictBase
from torchrl.data import Composite, NonTensor
from torchrl.envs import Transform

from ...specs import TaskSpec

INFO_KEY = "backend_info"
"""Where ``RecordInfo`` puts the backend's ``info`` of each step (as JSON text) for the main process to read."""

WORKER_KEY = "env_index"
"""Where ``RecordInfo`` puts the index of the env (one per worker) a step comes from."""


class RecordInfo(Transform):
    """Copies the backend's ``info`` of each step into the step's output, as JSON (workers cannot share objects),
    with the index of the env it comes from."""

    def __init__(self, index: int = 0):
        super().__init__()
        self.index = index

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset.set(INFO_KEY, "")
        tensordict_reset.set(WORKER_KEY, str(self.index))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        info = self.parent.base_env.last_info
        next_tensordict.set(INFO_KEY, "" if info is None else json.dumps(info, default=str))
        next_tensordict.set(WORKER_KEY, str(self.index))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        for key, example in ((INFO_KEY, "{}"), (WORKER_KEY, "0")):
            observation_spec[key] = NonTensor(example_data=example, shape=observation_spec.shape,
                                              device=observation_spec.device)
        return observation_spec


class SeedEachEpisode(Transform):
    """Seeds the env before each of its resets: episode ``k`` gets ``seed + k * stride`` (with ``stride`` envs
    playing side by side, env ``i`` started at ``seed + i`` gets the seeds Ray's runner gives it)."""

    def __init__(self, seed: int, stride: int = 1):
        super().__init__()
        self.seed, self.stride, self.episodes = seed, stride, 0

    def _reset_env_preprocess(self, tensordict: TensorDictBase | None) -> TensorDictBase | None:
        self.parent.base_env.set_seed(self.seed + self.episodes * self.stride)
        self.episodes += 1
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return tensordict_reset


@dataclass(frozen=True)
class EnvFactory:
    """Builds the env of a task spec in whatever process calls it: ``registry.make(TaskSpec.from_dict(spec))``.

    ``spec`` is ``registry.spec(name).to_dict()``: it names its components by lazy reference, so a fresh worker
    builds the same env even when the task or a component was registered in the parent process only.
    """

    spec: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    record_info: bool = True
    index: int = 0
    seed: int | None = None
    """When not None, the env's episode ``k`` is seeded ``seed + k * seed_stride`` (``SeedEachEpisode``)."""
    seed_stride: int = 1

    def __hash__(self) -> int:  # the fields are dicts: hash their JSON (ParallelEnv puts factories in a set)
        return hash((json.dumps(self.spec, sort_keys=True, default=str),
                     json.dumps(self.options, sort_keys=True, default=str), self.record_info, self.index, self.seed,
                     self.seed_stride))

    def __getstate__(self) -> dict[str, Any]:
        from ...env_hooks import factory_pickled

        factory_pickled()  # maybe by a multiprocessing AsyncEnvPool for its worker: that pool must close it (hooks)
        return dict(self.__dict__)

    @classmethod
    def from_spec(cls, spec: TaskSpec | str, **options: Any) -> EnvFactory:
        """A factory for ``spec`` (a ``TaskSpec`` or a registered name)."""
        from ...registry import registry

        return cls(registry.spec(spec).to_dict(), options)

    def __call__(self) -> Any:
        from ...registry import registry

        env = registry.make(TaskSpec.from_dict(self.spec), **self.options)
        if self.record_info:
            env.append_transform(RecordInfo(self.index))
        if self.seed is not None:
            env.append_transform(SeedEachEpisode(self.seed, self.seed_stride))
        return env
