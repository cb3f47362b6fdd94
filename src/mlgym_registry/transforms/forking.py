"""Forking a chain env: ``n`` envs in exactly the parent's state after its last step (``ChainEnv.fork``).

The backend forks itself (the local backend: ``backends/local/forking.py``); every other part of the chain is
copied as it stands, so each child keeps the parent's counts: turns and format errors in a row, the evaluations the
episode saw, the reward's best score so far, the task sampler's generator. The conversation is in the tensordict the
caller holds, not in the env: the caller steps each child from a clone of it.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..env_hooks import env_built, factory_pickled
from ..errors import EnvMisuseError
from .backend_env import BackendEnv, _close_quietly
from .driver_state import DRIVER_STATE, RESUME_AT


def branch_of(env: Any) -> Any:
    """The tensordict a child made with ``resume_on_reset`` resumes at: ``env``'s last output, refused when there is
    none or its episode is over."""
    branch = env.last_output()
    if branch is None:
        raise EnvMisuseError("resume_on_reset resumes at the env's last output: reset() and step() it first")
    done = branch.get("done", None)
    if done is not None and bool(done.any()):
        raise EnvMisuseError("resume_on_reset: the env's last step ended its episode (done), so there is nothing to "
                             "resume; fork at a step before the end, or fork without resume_on_reset")
    return branch.clone()


@contextlib.contextmanager
def _without_driver_state(env: Any) -> Iterator[None]:
    """``env`` without what its driver keeps on it while it is copied (nothing of it is copied)."""
    kept = {key: env.__dict__.pop(key) for key in DRIVER_STATE if key in env.__dict__}
    try:
        yield
    finally:
        env.__dict__.update(kept)


def _started_base(env: Any, what: str) -> BackendEnv:
    """The ``BackendEnv`` under the chain env ``env``, refused unless it has an episode to fork (``what``: the call)."""
    base = env.base_env
    if not isinstance(base, BackendEnv):
        raise TypeError(f"{what}() needs a chain over a BackendEnv, not over {type(base).__name__}")
    if not base.has_backend:
        raise EnvMisuseError(f"{what}() forks an episode: call env.reset() (and step it) first")
    return base


def fork_env(env: Any, n: int, *, resume_on_reset: bool = False) -> list[Any]:
    """``n`` copies of the chain env ``env`` (a ``TransformedEnv`` over a ``BackendEnv``), each over its own fork of
    the backend; closing any of them, the parent included, leaves the others running. ``resume_on_reset``: each
    child's resets return a copy of ``env``'s last output until it is stepped (``ChainEnv.fork``)."""
    base = _started_base(env, "fork")
    backend = base.backend
    fork = getattr(backend, "fork", None)
    if fork is None:
        raise NotImplementedError(
            f"the {type(backend).__name__} backend cannot fork; the local backend can (backend='local')")
    branch = branch_of(env) if resume_on_reset else None
    children = []
    try:
        for child_backend in fork(n):
            child = _copy_over(env, base, backend, child_backend)
            children.append(child)
            if branch is not None:
                child.__dict__[RESUME_AT] = branch.clone()
    except BaseException:
        for child in children:
            child.close(raise_if_closed=False)
        raise
    return children


def _fresh_caches(env: Any) -> dict[int, Any]:
    """A ``deepcopy`` memo that leaves the caches out: each transform's TorchRL ``_parent`` (an env rebuilt on demand
    from its container: a copy of one costs more than the rest of the chain), and what a transform names in
    ``fork_caches`` (started empty). ``_relink`` then points the copy's transforms at the copy."""
    memo: dict[int, Any] = {}
    compose = getattr(env, "transform", None)
    for transform in (compose, *(compose or ())):
        cached = transform.__dict__.get("_parent") if transform is not None else None
        if cached is not None:
            memo[id(cached)] = None
        for name in getattr(transform, "fork_caches", ()):
            cache = getattr(transform, name)
            memo[id(cache)] = type(cache)()
    return memo


def _relink(copied: Any) -> None:
    """Make ``copied``'s transforms (deep-copied: their containers are still the original's weak references) know
    their own chain, as TorchRL's ``TransformedEnv`` does when it is built."""
    compose = copied.transform
    compose.reset_parent()
    compose.set_container(copied)


def _copy_over(env: Any, base: BackendEnv, backend: Any, child_backend: Any) -> Any:
    """A copy of ``env`` whose ``BackendEnv`` holds ``child_backend`` and closes it with itself."""
    holder = [child_backend]
    memo: dict[int, Any] = {id(backend): child_backend, id(base._backend_holder): holder, id(base._finalizer): None,
                            **_fresh_caches(env)}
    try:
        with warnings.catch_warnings(), _without_driver_state(env):  # the parent's driver is not the child's
            warnings.simplefilter("ignore")  # tensordict's notes about deep-copying a stacked conversation
            child = copy.deepcopy(env, memo)
    except BaseException:
        child_backend.close()
        raise
    _relink(child)
    child_base = child.base_env
    child_base._finalizer = weakref.finalize(child_base, _close_quietly, child_base._backend_holder)
    env_built(child)  # a new env, as one the chain builds: the layers above attach to it (a pool being set up)
    return child


@dataclass
class ChainForkPoint:
    """A chain env's state at a fork, picklable: calling it makes one child env, in this process or in another one
    (``AsyncEnvPool([point] * n, backend="multiprocessing")`` or ``backend="threading"``: each pool adopts the
    children its setup makes, and closes them). The
    backend's point (``backends.local.forking.ForkPoint``) holds the frozen files while the point is open; close it
    once the envs are made."""

    backend: Any
    chain: bytes
    """The chain without its backend, pickled."""

    def __call__(self) -> Any:
        """One child: the chain as it stood at the fork, over a backend made from the backend's point."""
        child = pickle.loads(self.chain)
        base = child.base_env
        base._backend_holder.append(self.backend.make())
        base._finalizer = weakref.finalize(base, _close_quietly, base._backend_holder)
        env_built(child)  # as an env the chain builds: a pool setting itself up with this point adopts it
        return child

    def __getstate__(self) -> dict[str, Any]:
        factory_pickled()  # maybe by a multiprocessing AsyncEnvPool for its worker (env_hooks)
        return dict(self.__dict__)

    def close(self) -> None:
        """Let go of the point's hold on the frozen files (the envs made from it keep their own)."""
        self.backend.close()


def fork_point(env: Any, *, resume_on_reset: bool = False) -> ChainForkPoint:
    """``env``'s state as a ``ChainForkPoint`` (``ChainEnv.fork_point``); ``resume_on_reset``: each child's
    resets return a copy of ``env``'s last output until it is stepped."""
    base = _started_base(env, "fork_point")
    backend = base.backend
    if getattr(backend, "fork_point", None) is None:
        raise NotImplementedError(
            f"the {type(backend).__name__} backend cannot fork; the local backend can (backend='local')")
    branch = branch_of(env) if resume_on_reset else None
    memo: dict[int, Any] = {id(backend): None, id(base._backend_holder): [], id(base._finalizer): None,
                            **_fresh_caches(env)}
    with warnings.catch_warnings(), _without_driver_state(env):
        warnings.simplefilter("ignore")  # tensordict's notes about deep-copying a stacked conversation
        bare = copy.deepcopy(env, memo)
    _relink(bare)
    if branch is not None:
        bare.__dict__[RESUME_AT] = branch  # each child unpickles a copy of its own
    chain = pickle.dumps(bare)
    return ChainForkPoint(backend.fork_point(), chain)
