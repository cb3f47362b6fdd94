"""The integrity audit in the conformance kit: ``check_integrity`` (and the ``integrity_audit`` fixture over it, in
``fixture.py``), so a plugin's own CI fails when one of its tasks pays a canary more than honest play."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import ConformanceError


def check_integrity(task: Any, *, rewards: Sequence[str] | None = None, canaries: Sequence[str] | None = None,
                    **make_options: Any) -> Any:
    """Audit ``task`` (``mlgym_registry.integrity.audit``) and return its ``IntegrityReport``; raise
    ``ConformanceError`` with the audit's table when any canary beat honesty, broke its bound or a reference failed."""
    from ..integrity import audit

    report = audit(task, rewards=rewards, canaries=canaries, **make_options)
    if not report.ok:
        raise ConformanceError(f"task {report.task!r} failed its integrity audit:\n{report.table()}")
    return report

