"""``ChainEnv``: the env ``registry.make`` returns, TorchRL's ``TransformedEnv`` with guards of ours."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase
from torchrl.envs import TransformedEnv

from ..env_hooks import env_built
from .base import refuse_stepped
from .driver_state import LAST_OUTPUT, RESUME_AT

OutputAdapter = Callable[[TensorDictBase, "ChainEnv"], TensorDictBase]
"""What the code driving an env does to each output before the env returns it: ``adapter(output, env)``."""


class ChainEnv(TransformedEnv):
    """TorchRL's ``TransformedEnv`` over the chain, with three additions.

    - A tensordict that was already stepped is refused before anything runs (``EnvMisuseError`` naming
      ``env.step_mdp``): without it the backend runs the command, and tensordict then fails with an error about lazy
      batch sizes.
    - It is a context manager: ``with registry.make(...) as env:`` closes it, and its backend, on the way out.
    - The code that drives it may have its outputs handed over in a form of its own (``hand_outputs_to``), told once:
      the layers above attach to each env as it is built (``env_hooks``), and the env never asks who calls it.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        env_built(self)

    def hand_outputs_to(self, adapter: OutputAdapter | None) -> None:
        """Pass what the env's outermost calls return (``step``, ``reset``, ``step_and_maybe_reset``, ``_step``,
        ``_reset``) through ``adapter(output, env)`` from now on (None: return them as they are). The calls the env
        makes of itself inside one of those are left alone."""
        self.__dict__["_output_adapter"] = adapter

    def fork(self, n: int = 1, *, resume_on_reset: bool = False) -> list[ChainEnv]:
        """``n`` independent envs in exactly this one's state after its last step (``transforms/forking.py``): the
        workspace's files (shared copy-on-write), the shell's working directory and exported variables, every count
        of the chain, the episode's seeds. Step each from a clone of the tensordict you hold; each closes on its own.
        ``resume_on_reset``: until a child is first stepped, its ``reset`` returns (a copy of) this env's last
        output, the branch, instead of starting an episode, so that TorchRL's loop (a pool's ``reset``, then
        ``step``; LLMCollector resets twice before its first step) drives it from there; once stepped, its resets
        start new episodes. Refused while the agent's background processes run
        (docs/training.md, "Branching an episode")."""
        from .forking import fork_env

        return fork_env(self, n, resume_on_reset=resume_on_reset)

    def fork_point(self, *, resume_on_reset: bool = False) -> Any:
        """This env's state as a picklable ``transforms.forking.ChainForkPoint``: calling it makes a child, in this
        process or in a worker (``AsyncEnvPool([point] * n, backend="multiprocessing")``); ``point.close()`` once the
        children are made. ``resume_on_reset`` as for ``fork``: a pool's resets before its first step resume at the
        branch."""
        from .forking import fork_point

        return fork_point(self, resume_on_reset=resume_on_reset)

    def last_output(self) -> TensorDictBase | None:
        """The tensordict the next step would start from, as this env's last outermost call left it: a reset's
        output, a step's ``next`` (``step_mdp``), ``step_and_maybe_reset``'s second output; None before any."""
        kind, out = self.__dict__.get(LAST_OUTPUT, (None, None))
        if kind == "step":
            return self.step_mdp(out)
        if kind == "step_and_maybe_reset":
            return out[1]
        return out

    def __enter__(self) -> ChainEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """``with registry.make(...) as env:`` closes the env (and its backend) on the way out."""
        self.close(raise_if_closed=False)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``TransformedEnv.step``, after checking that ``tensordict`` is a step's input, not its output."""
        refuse_stepped(tensordict)
        return self._handed_out(super().step, tensordict, kind="step")

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """``TransformedEnv.reset`` (a fork's child made with ``resume_on_reset``: its first returns the branch)."""
        return self._handed_out(super().reset, tensordict, kind="reset", **kwargs)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """``TransformedEnv.step_and_maybe_reset``."""
        return self._handed_out(super().step_and_maybe_reset, tensordict, kind="step_and_maybe_reset")

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        branch = self.__dict__.get(RESUME_AT)
        if branch is not None:  # a child made to resume, not stepped yet: the branch again, no new episode
            return self._handed_out(branch.clone, kind="reset")
        return self._handed_out(super()._reset, tensordict, kind="reset", **kwargs)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.__dict__.pop(RESUME_AT, None)  # stepped: its later resets start new episodes
        return self._handed_out(super()._step, tensordict, kind="next")  # its output is where the next step starts

    def _handed_out(self, call: Callable[..., Any], *args: Any, kind: str, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, its output (or each of its outputs) passed through the adapter of
        ``hand_outputs_to`` when this is the outermost of the env's calls; the output kept as the last one
        (``last_output``, of ``kind``: how the next step's start is read from it)."""
        state = self.__dict__
        adapter = state.get("_output_adapter")
        if adapter is None:
            out = call(*args, **kwargs)
            state[LAST_OUTPUT] = (kind, out)  # an outer call, returning after the inner, has the last word
            return out
        depth = state.get("_call_depth", 0)
        state["_call_depth"] = depth + 1
        try:
            out = call(*args, **kwargs)
        finally:
            state["_call_depth"] = depth
        if depth:
            return out
        state[LAST_OUTPUT] = (kind, out)
        if isinstance(out, tuple):
            return tuple(adapter(item, self) for item in out)
        return adapter(out, self)
