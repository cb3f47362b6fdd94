"""The integrity audit: whether a task's reward can be gamed, measured by playing canaries against it.

``audit(task)`` plays a fixed suite of agent behaviours (``Canary``) through the task's real env and backend (the
honest baseline twice, null and degenerate submissions, planted hacks, farming) and judges each one's reward against
the honest reference; ``mlgym-registry check --integrity TASK`` prints the table. Plugins add canary sets through
the ``register_canaries`` hook, and a task file may declare its own (``canaries:``).
"""

from .audit import CanaryResult, IntegrityReport, audit
from .canaries import BOUNDS, FLOOR, PROMISE, REFERENCE, Canary, TaskShape, builtin_canaries, task_shape

__all__ = ["BOUNDS", "FLOOR", "PROMISE", "REFERENCE", "Canary", "CanaryResult", "IntegrityReport", "TaskShape",
           "audit", "builtin_canaries", "task_shape"]
