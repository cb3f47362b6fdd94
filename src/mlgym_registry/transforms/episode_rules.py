"""MLGym's rules of an episode that the chain enforces: its options' defaults (``chain``, which imports no torch)
and the env that counts format errors (``backend_env``) read them here."""

from __future__ import annotations

MAX_FORMAT_ERRORS = 3
"""Consecutive responses without a usable command after which the episode ends with ``exit_format`` (MLGym's rule)."""
