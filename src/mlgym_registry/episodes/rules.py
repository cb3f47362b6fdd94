"""MLGym's rules of an episode that both the chain's options (``chain``) and its env (``transforms.backend_env``)
need, kept apart so that neither imports the other."""

from __future__ import annotations

MAX_FORMAT_ERRORS = 3
"""Consecutive responses without a usable command after which the episode ends with ``exit_format`` (MLGym's rule)."""
