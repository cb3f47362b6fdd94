"""Tasks of a user's MLGym checkout, registered as ``mlgym/<id>`` (filled in by the task-suite work)."""

from __future__ import annotations
