"""The integrity audit in the conformance kit: ``check_integrity`` and the ``integrity_audit`` pytest fixture, so a
plugin's own CI fails when one of its tasks pays a canary more than honest play."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def _integrity_audit() -> Callable[..., Any]:
    return check_integrity


try:
    import pytest
except ImportError:  # pytest is only needed by people testing plugins
    integrity_audit = None
else:
    integrity_audit = pytest.fixture(_integrity_audit)
    integrity_audit.__doc__ = (
        "A pytest fixture: ``integrity_audit(task, rewards=None, canaries=None, **make_options)`` runs the integrity "
        "audit of ``task`` and fails the test (``ConformanceError``, with the audit's table) when a canary beat "
        "honesty; it returns the ``IntegrityReport``."
    )
