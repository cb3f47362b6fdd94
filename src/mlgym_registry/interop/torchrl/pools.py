"""What TorchRL's ``AsyncEnvPool`` and ``ParallelEnv`` need of the env: outputs that stack and merge at any
conversation length, and a close that releases every sandbox.

**Stacking.** A pool stacks its envs' outputs with ``torch.stack`` by default (``stack="dense"``). An env's
conversation is a ``History`` whose message count is a batch dim, and the policy's token ids, log-probs and masks have
one length per env: envs at different turns cannot be stacked densely, and tensordict refuses ("The shapes of the
tensors to stack is incompatible ... for key prompt"); even at equal lengths, a dense stack of lazily stacked
conversations is one that ``reshape`` (which TorchRL's LLM wrappers call) leaves unreshaped. So every output the env
hands to a pool is a ``PoolOutput``: a ``TensorDict`` that ``torch.stack`` stacks lazily, as ``stack="lazy"`` does,
so each env keeps its own shapes. Only what an env a pool drives returns to the pool is marked (``drivers``: the
env is told once, as it is built), so everything else (``rollout``, a user's own ``torch.stack``) behaves as before.

**ParallelEnv.** What the env returns to a ``ParallelEnv`` worker is a ``ParallelOutput``, whose ``where`` takes
whole envs when TorchRL merges the envs it restarted into the others; a worker that consolidates (TorchRL's default)
gets dense conversations, which tensordict 0.14 can rebuild in the parent (a lazy stack it cannot).

**Closing.** TorchRL 0.14's threading pool does not close its envs on ``close()`` (its multiprocessing pool does, in
each worker), and every ``EnvBase`` counts as closed from construction, so ``collector.shutdown()`` skips
``pool.close()``. An env built by a threading pool's setup adopts the pool: the pool counts as open until it is
closed, and closing it closes each of its envs.

**Stack frames.** TorchRL 0.14 gives an env no way to learn which pool builds it, nor a pool's code any hook of ours,
so two things are read from the stack, here alone, and listed in ``internals``: the pool being set up
(``constructing_pool``: the ``self`` of a frame of the pool's own module, once per env built or factory pickled), and
whether a ``view(-1)`` of a batch is the pool's reading of env indices (``reading_env_indices``: the code alone, no
locals).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, is_non_tensor, is_tensorclass, lazy_stack

from ...transforms.history import messages_shared_in_clones
from . import pool_wire

_SEARCHED_FRAMES = 40
"""How far up the stack the pool that is building an env is looked for (the factory's own calls sit in between)."""


class PoolOutput(TensorDict):
    """A ``TensorDict`` that ``torch.stack`` stacks lazily (``lazy_stack``): what the env returns to a pool.

    It names the env it came from (``_mlgym_env``), and a multiprocessing pool's queue carries it, on its way to the
    trainer and back to the env's worker, as the messages the other end lacks (``pool_wire``), so that a turn through
    the pool costs the same at any conversation length.
    """

    _mlgym_env: str | None = None

    @classmethod
    def __torch_function__(cls, func: Any, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None):
        if func is torch.stack:
            return lazy_stack(*args, **(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)

    def _clone(self, recurse: bool = True) -> PoolOutput:
        # TorchRL's multiprocessing pool clones what came off its queue (to own its tensors' memory), then drops what
        # it cloned: an output just rebuilt from the wire already owns its memory, and nothing else holds it, so that
        # first clone is the output itself; other clones share the messages (written once and never changed) rather
        # than copy them one by one, and keep the env's name
        if self.__dict__.pop("_mlgym_fresh", False):
            return self
        with messages_shared_in_clones():
            result = _recast(super()._clone(recurse), PoolOutput)
        result._mlgym_env = self._mlgym_env
        return result

    def unbind(self, dim: int) -> tuple[TensorDictBase, ...]:
        # an AsyncEnvPool flattens its batch of outputs (``view(-1)``) at every send only to read each env's index,
        # then drops the flattened copy: there each env's row is a view into this output, read where asked, rather
        # than every key of the output (each conversation, each string) unbound into a new tensordict
        if dim == 0 and self.batch_dims == 1 and reading_env_indices():
            return tuple(self._get_sub_tensordict(index) for index in range(self.batch_size[0]))
        return super().unbind(dim)

    def __reduce_ex__(self, protocol: int) -> Any:
        token = self._mlgym_env
        if token is None or not pool_wire.may_encode(token):
            return super().__reduce_ex__(protocol)
        return _from_wire, (token, pool_wire.WIRE.encode(token, self.__getstate__()))


def _from_wire(token: str, payload: bytes) -> PoolOutput:
    """The ``PoolOutput`` that ``PoolOutput.__reduce_ex__`` sent over a pool's queue."""
    output = PoolOutput.__new__(PoolOutput)
    output.__setstate__(pool_wire.WIRE.decode(token, payload))
    output._mlgym_fresh = True  # its tensors were made by the decoding and are held by nothing else
    return output


def _pool_module() -> Any:
    """TorchRL's ``torchrl.envs.async_envs`` when it is loaded (else None: no pool can be calling)."""
    return sys.modules.get("torchrl.envs.async_envs")


_INDEX_READER = "_maybe_make_tensordict"
"""The ``AsyncEnvPool`` method that flattens a batch of outputs only to read their env indices."""

_INDEX_READER_FRAMES = 8
"""How far up the stack it is looked for (tensordict's ``view``, its decorator and ``_view`` sit in between)."""


def reading_env_indices(depth: int = 2) -> bool:
    """Whether the function ``depth`` frames up runs inside ``AsyncEnvPool._maybe_make_tensordict``, whose
    ``view(-1)`` of a batch of outputs serves only to read each env's index (told by the code alone, no locals)."""
    module = _pool_module()
    if module is None:
        return False
    frame = sys._getframe(depth)
    for _ in range(_INDEX_READER_FRAMES):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == _INDEX_READER and code.co_filename == module.__file__:
            return True
        frame = frame.f_back
    return False


def for_pool(tensordict: TensorDictBase, env: str | None = None) -> TensorDictBase:
    """``tensordict`` as a ``PoolOutput`` of the env whose token is ``env`` (``drivers.env_token``)."""
    output = _recast(tensordict, PoolOutput)
    if env is not None:
        output._mlgym_env = env
    return output


def _recast(tensordict: TensorDictBase, cls: type[TensorDict]) -> TensorDictBase:
    """``tensordict`` as a ``cls`` (a plain ``TensorDict`` changes class in place; anything else is copied
    shallowly)."""
    if isinstance(tensordict, cls):
        return tensordict
    if type(tensordict) is TensorDict:
        tensordict.__class__ = cls
        return tensordict
    return cls._new_unsafe(
        source={key: tensordict.get(key) for key in tensordict.keys()},
        batch_size=tensordict.batch_size,
        device=tensordict.device,
    )


# -- ParallelEnv workers ----------------------------------------------------------------------------------------------
class ParallelOutput(TensorDict):
    """A ``TensorDict`` whose ``where`` merges whole envs: what the env returns to a ``ParallelEnv`` worker.

    When some of a ``ParallelEnv``'s envs end their episode, TorchRL merges their reset outputs into the others'
    outputs with ``node.where(~reset, other=reset_output, out=node)`` (``torchrl.envs.utils._update_during_reset``).
    tensordict's ``where`` goes leaf by leaf, down to each message of each conversation, and fails on conversations
    of different lengths. A ``where`` whose condition is the same across each env's row (one reset flag per env) takes
    each env's output whole, from one side or the other, and stacks the envs lazily. The class survives the pipe
    (both pickling and consolidation keep it) and the parent's stacking of its workers' outputs.
    """

    def _clone(self, recurse: bool = True) -> ParallelOutput:
        # TorchRL's ParallelEnv clones what came off a worker's pipe (to keep the worker's last output): the messages,
        # written once and never changed, are shared rather than copied one by one
        with messages_shared_in_clones():
            return _recast(super()._clone(recurse), ParallelOutput)

    def where(self, condition: torch.Tensor, other: Any, *, out: TensorDictBase | None = None, pad: Any = None,
              update_batch_size: bool = False) -> TensorDictBase:
        """tensordict's ``where``, except that one choice per env (the condition's first dim) takes whole envs."""
        choices = _row_choices(self, condition, other)
        if choices is None:
            return super().where(condition, other, out=out, pad=pad, update_batch_size=update_batch_size)
        merged = lazy_stack([mine if keep else theirs
                             for keep, mine, theirs in zip(choices, self.unbind(0), other.unbind(0), strict=True)])
        if out is None:
            return merged
        for key in set(out.keys()) - set(merged.keys()):
            del out[key]
        for key in merged.keys():
            out._set_str(key, merged.get(key), inplace=False, validated=True)
        return out


def _row_choices(tensordict: TensorDictBase, condition: Any, other: Any) -> list[bool] | None:
    """Per env (first dim), True to keep ``tensordict``'s row, False to take ``other``'s; None when ``condition``
    is not one choice per env or ``other`` is not a tensordict of the same envs."""
    if not isinstance(other, TensorDictBase) or tensordict.ndim == 0 or not isinstance(condition, torch.Tensor):
        return None
    if other.batch_size[:1] != tensordict.batch_size[:1] or condition.ndim == 0:
        return None
    if condition.shape[0] != tensordict.batch_size[0]:
        return None
    rows = condition.reshape(condition.shape[0], -1)
    keep, take = rows.all(1), ~rows.any(1)
    if not bool((keep | take).all()):
        return None
    return keep.tolist()


def for_parallel(tensordict: TensorDictBase, consolidating: bool) -> TensorDictBase:
    """``tensordict`` as a ``ParallelOutput``, its conversations dense when the worker consolidates it."""
    return _recast(_densified(tensordict) if consolidating else tensordict, ParallelOutput)


def _densified(value: Any) -> Any:
    """``value`` with every lazy stack of tensordicts in it made dense (a tensorclass such as ``History`` keeps its
    class); strings (``NonTensorData``, ``NonTensorStack``) are left as they are: consolidation carries them. Only
    what holds a lazy stack is copied, shallowly."""
    if is_non_tensor(value):
        return value
    if is_tensorclass(value):
        inner = value._tensordict
        dense = _densified(inner)
        return value if dense is inner else type(value)._from_tensordict(dense)
    if isinstance(value, LazyStackedTensorDict):
        return value.contiguous()
    if not isinstance(value, TensorDictBase):
        return value
    changed = {}
    for key in value.keys():
        item = value.get(key)
        dense = _densified(item)
        if dense is not item:
            changed[key] = dense
    if not changed:
        return value
    out = value.copy()
    for key, dense in changed.items():
        out.set(key, dense)
    return out


# -- closing -----------------------------------------------------------------------------------------------------------
def constructing_pool() -> Any:
    """The ``AsyncEnvPool`` whose setup is building an env (threading) or sending an env factory to a worker
    (multiprocessing) right now, if one is (else None). Only frames of the pool's own module have their locals read
    (for the pool), never a user's."""
    module = _pool_module()
    if module is None:
        return None
    pool_class, pool_file = module.AsyncEnvPool, module.__file__
    frame = sys._getframe(1)
    for _ in range(_SEARCHED_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_filename == pool_file:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, pool_class):
                return candidate
        frame = frame.f_back
    return None


def adopt_constructing_pool() -> None:
    """``adopt_pool`` the pool being set up, if one is: called as an env factory is pickled for a pool's worker
    process (``Registry.__reduce__``, ``EnvFactory``), where nothing else of ours runs in the pool's own process."""
    pool = constructing_pool()
    if pool is not None:
        adopt_pool(pool)


def adopt_pool(pool: Any) -> None:
    """Make ``pool`` (an ``AsyncEnvPool`` being set up) count as open until it is closed, so that
    ``collector.shutdown()`` closes it, and a threading pool close its envs (which live in this process; a
    multiprocessing pool's workers close theirs). Idempotent."""
    if pool.__dict__.get("_mlgym_adopted"):
        return
    pool.__dict__["_mlgym_adopted"] = True
    pool_wire.watch_pool(pool)
    # EnvBase.__init__ (run after the pool's setup) sets is_closed=True only when no value is there yet
    pool.__dict__["is_closed"] = False
    shutdown = type(pool).shutdown
    owner = weakref.ref(pool)  # no cycle through the pool's own __dict__: its __del__ still shuts it down

    def shutdown_and_close_envs() -> None:
        """The pool's own shutdown (its threads or workers end), then each env here's ``close()`` (its sandbox
        ends)."""
        pool = owner()
        if pool is None:
            return
        shutdown(pool)
        for env in getattr(pool, "envs", ()):
            if not env.is_closed:
                env.close(raise_if_closed=False)
        pool.__dict__["is_closed"] = True

    pool.shutdown = shutdown_and_close_envs
