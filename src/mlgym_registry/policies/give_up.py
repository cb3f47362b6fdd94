"""Giving up as MLGym does: once a policy cannot answer any more (``PolicyError``: its model is unreachable, its key
refused), answer MLGym's ``exit_api``, which autosubmits, so that the run is still scored and says why."""

from __future__ import annotations

from typing import Any

from .base import Policy, PolicyError

GAVE_UP_RESPONSE = "DISCUSSION\nThe model could not be reached.\n```\nexit_api\n```"
"""What ``GiveUpWithExitApi`` and ``interop.torchrl.collectors.TextPolicy`` answer once their policy gave up
(``PolicyError``): MLGym's ``exit_api``, which autosubmits."""


class GiveUpWithExitApi(Policy):
    """A policy that answers MLGym's ``exit_api`` (which autosubmits) once the policy it wraps gives up
    (``PolicyError``), and keeps why in ``error``: what a worker process does
    (``interop.torchrl.collectors.TextPolicy``), so one run at a time fails the same way as several at once."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.name = policy.name
        self.version = policy.version
        self.error = ""

    def __getattr__(self, name: str) -> Any:
        """What the wrapped policy says of itself (its ``model``, ``source``, ``url``, ``sampling``: what a run's
        provenance records), as if unwrapped."""
        if name == "policy":  # not set yet (while unpickling): no wrapped policy to ask
            raise AttributeError(name)
        return getattr(self.policy, name)

    def reset(self, spec: Any = None) -> None:
        """Start a new episode."""
        self.error = ""
        self.policy.reset(spec)

    def respond(self, messages: Any) -> str:
        """The wrapped policy's answer, or ``exit_api`` once it gave up."""
        if self.error:
            return GAVE_UP_RESPONSE
        try:
            return self.policy(messages)
        except PolicyError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return GAVE_UP_RESPONSE

    def last_generation(self) -> Any:
        """The wrapped policy's (None after it gave up)."""
        return None if self.error else self.policy.last_generation()

    def last_call(self) -> dict[str, Any] | None:
        """The wrapped policy's (None after it gave up)."""
        return None if self.error else self.policy.last_call()

    def stats(self) -> dict[str, Any] | None:
        """The wrapped policy's usage."""
        return self.policy.stats()

    def close(self) -> None:
        """Close the wrapped policy."""
        self.policy.close()
