"""Policies: things that produce the model's text for the next turn (scripted, replay, human, transformers).

A policy is called with the conversation so far (``[{"role", "content"}, ...]``) and returns the next response text.
``make_policy("scripted" | "replay:PATH" | "human" | "transformers:DIR")`` builds one from a command-line string.
"""

from __future__ import annotations

from typing import Any

from .base import Policy, PolicyExhausted

POLICY_KINDS = ("scripted", "replay", "human", "transformers")

__all__ = ["POLICY_KINDS", "Policy", "PolicyExhausted", "make_policy"]


def make_policy(text: str, *, task_id: str | None = None, **options: Any) -> Policy:
    """Build a policy from ``"scripted"``, ``"replay:PATH.traj"``, ``"human"`` or ``"transformers:MODEL_DIR"``."""
    kind, _, argument = text.partition(":")
    if kind == "scripted":
        from .scripted import ScriptedPolicy

        return ScriptedPolicy(task_id=task_id)
    if kind == "human":
        from .human import HumanPolicy

        return HumanPolicy(**options)
    if kind in ("replay", "transformers") and not argument:
        raise ValueError(f"policy {kind!r} needs a path: --policy {kind}:{'PATH.traj' if kind == 'replay' else 'DIR'}")
    if kind == "replay":
        from .replay import ReplayPolicy

        return ReplayPolicy(argument)
    if kind == "transformers":
        from .transformers import TransformersPolicy

        return TransformersPolicy(argument, **options)
    raise ValueError(f"unknown policy {text!r}; choose one of: scripted, replay:PATH, human, transformers:DIR")
