"""Adapter to the real MLGym (facebookresearch/MLGym, installed from its git checkout), in docker or podman.

``MLGymBackend`` registers the task with MLGym, builds ``gym.make("mlgym/<id>", devices=[...])`` and exposes it
through the backend contract (``backends/protocol.py``): reset as TorchRL does (``reset_container``, ``cd``,
``reset``), tools from MLGym's agent config (the ``state`` command and env variables through ``communicate``, the
command files through ``add_commands``, MLGym's own ``command_docs``), and MLGym's ``step`` 4-tuple unchanged.

What the adapter adds to MLGym (see ``docs/differences.md``):

- ``info["score"]`` accumulates over the episode, as the contract says (MLGym builds a fresh ``info`` every step and
  only its agent accumulates scores);
- the task config MLGym reads is always written from the spec as it is now (overrides, replays' starter files,
  ``spec.replace(...)``), with the spec's datasets as dataset configs; tasks whose ``secret_files`` or
  ``protected_files`` MLGym cannot enforce are refused unless ``allow_unprotected_files=True``;
- ``reset(seed=...)`` reaches MLGym's task, and an evaluation seed derived from it (``seeding.py``: the episode's in
  the seed's stream, never the raw seed) is exported as ``MLGYM_REGISTRY_EVAL_SEED`` in the container's shell, where
  MLGym runs the evaluator. The agent's shell is that shell, so there the agent can read the evaluator's seed;
- ``returncode`` after a step is the action's, not that of MLGym's ``export LAST_ACTION=...``;
- everything MLGym needs is checked at ``make()``, before a container starts: MLGym and its Python dependencies, the
  engine's command line, the Docker Engine API that MLGym reaches through docker-py (``DOCKER_HOST``, for podman
  too), the image, the task's entrypoint, dataset configs and starter files.

MLGym is imported lazily, only when a backend is made. Each missing piece is a ``BackendUnavailable`` naming the fix.

The modules: ``backend.py`` (``MLGymBackend``), ``checkout.py`` (the MLGym checkout and its tool files),
``engine.py`` (the container engine and its Engine API), ``task_config.py`` (the task config MLGym reads, written from
the spec) and ``task_checks.py`` (what a task needs from the checkout, and the tasks this backend refuses).
"""

from .backend import SEED_VARIABLE, MLGymBackend
from .checkout import CHECKOUT_URL, command_file_entry, in_directory, mlgym_checkout
from .engine import (
    CONTAINER_TYPES,
    DEFAULT_DOCKER_HOST,
    DEFAULT_IMAGE,
    check_container_engine,
    check_engine_api,
    docker_host,
    engine_api_get,
    podman_socket,
)
from .task_checks import refuse_unprotected_files

__all__ = [
    "CHECKOUT_URL", "CONTAINER_TYPES", "DEFAULT_DOCKER_HOST", "DEFAULT_IMAGE", "SEED_VARIABLE", "MLGymBackend",
    "check_container_engine", "check_engine_api", "command_file_entry", "docker_host", "engine_api_get",
    "in_directory", "mlgym_checkout", "podman_socket", "refuse_unprotected_files",
]
