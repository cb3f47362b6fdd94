"""Policies: things that produce the model's text for the next turn (scripted, replay, human, transformers, openai).

A policy is called with the conversation so far (``[{"role", "content"}, ...]``) and returns the next response text.
``make_policy("scripted" | "replay:PATH" | "human" | "transformers:DIR" | "openai:MODEL")`` builds one from a
command-line string; ``PolicyText`` is such a string that also carries the policy's keyword options.
"""

from __future__ import annotations

from typing import Any

from .base import Generation, Policy, PolicyError, PolicyExhausted

POLICY_KINDS = ("scripted", "replay", "human", "transformers", "openai")

__all__ = ["POLICY_KINDS", "Generation", "Policy", "PolicyError", "PolicyExhausted", "PolicyText", "make_policy",
           "policy_modules"]

_MODULES = {
    "scripted": ("mlgym_registry.policies.scripted",),
    "replay": ("mlgym_registry.policies.replay",),
    "transformers": ("mlgym_registry.policies.transformers",),
    "openai": ("openai", "mlgym_registry.policies.openai"),
}
"""What building a policy of each kind imports, beyond what every worker imports anyway."""


def policy_modules(text: str) -> tuple[str, ...]:
    """The modules ``make_policy(text)`` imports: worker processes that each build that policy can share them by
    having their fork server import them first (``scale.workers.start_worker_server(also_import=...)``)."""
    return _MODULES.get(str(text).partition(":")[0], ())


class PolicyText(str):
    """A policy string (``"openai:MODEL"``) with the keyword options to build it with.

    It goes wherever a policy string goes (worker processes, Ray actors: it pickles with its options) and
    ``make_policy`` builds the policy with those options, so no live client ever has to travel.
    """

    options: dict[str, Any]

    def __new__(cls, text: str, options: dict[str, Any] | None = None) -> PolicyText:
        self = super().__new__(cls, text)
        self.options = dict(options or {})
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return PolicyText, (str(self), self.options)


def make_policy(text: str, *, task_id: str | None = None, parser: Any = None, **options: Any) -> Policy:
    """Build a policy from ``"scripted"``, ``"replay:PATH.traj"``, ``"human"``, ``"transformers:MODEL_DIR"`` or
    ``"openai:MODEL"`` (``options``: ``OpenAIPolicy``'s, e.g. ``base_url=``); a ``PolicyText``'s own options are used
    too, under those given here.

    ``parser`` is the env's parser (a parser, a registered name or a lazy ``"module:attr"`` reference) for the
    scripted policy, which writes its commands in that parser's format (a spec given to its ``reset`` names the
    parser too, and wins); the other policies ignore it (a model reads the format from the system prompt)."""
    options = {**getattr(text, "options", {}), **options}
    kind, _, argument = text.partition(":")
    if kind == "scripted":
        from .scripted import ScriptedPolicy

        return ScriptedPolicy(task_id=task_id, parser=parser)
    if kind == "human":
        from .human import HumanPolicy

        return HumanPolicy(**options)
    if kind == "openai" and not argument:
        raise ValueError("policy 'openai' needs a model name: --policy openai:MODEL (e.g. openai:gpt-4o)")
    if kind in ("replay", "transformers") and not argument:
        raise ValueError(f"policy {kind!r} needs a path: --policy {kind}:{'PATH.traj' if kind == 'replay' else 'DIR'}")
    if kind == "replay":
        from .replay import ReplayPolicy

        return ReplayPolicy(argument)
    if kind == "transformers":
        from .transformers import TransformersPolicy

        return TransformersPolicy(argument, **options)
    if kind == "openai":
        from .openai import OpenAIPolicy

        return OpenAIPolicy(argument, **options)
    raise ValueError(f"unknown policy {str(text)!r}; choose one of: scripted, replay:PATH, human, transformers:DIR, "
                     f"openai:MODEL")
