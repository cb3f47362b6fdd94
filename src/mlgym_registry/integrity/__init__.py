"""The integrity audit: whether a task's reward can be gamed, measured by playing canaries against it.

``audit(task)`` plays a fixed suite of agent behaviours (``Canary``) through the task's real env and backend (the
honest baseline twice, null and degenerate submissions, planted hacks, farming) and judges each one's reward against
the honest reference; ``mlgym-registry check --integrity TASK`` prints the table. Plugins add canary sets through
the ``register_canaries`` hook, and a task file may declare its own (``canaries:``).

The names load on first use: the registry imports this package's plugin module whenever it loads its plugins, and
that must not cost the audit's imports.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "BOUNDS": "canaries",
    "FLOOR": "canaries",
    "PROMISE": "canaries",
    "REFERENCE": "canaries",
    "Canary": "canaries",
    "TaskShape": "canaries",
    "builtin_canaries": "canaries",
    "task_shape": "canaries",
    "CanaryResult": "auditor",
    "IntegrityReport": "auditor",
    "audit": "auditor",
}
"""Each exported name and the module of this package that defines it."""

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
