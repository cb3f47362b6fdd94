"""``check --integrity`` on forked envs as on fresh ones: every canary of the audit is played on an env whose workspace
is a fork's copy-on-write view (its files frozen into a layer at each reset, the env going on over it with a restarted
shell, as ``env.fork`` leaves a parent and its children), and the honest task still passes every canary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlgym_registry import registry
from mlgym_registry.backends.local import LocalBackend, forking
from mlgym_registry.integrity import audit

sys.path.insert(0, str(Path(__file__).parent))
import weak_tasks  # noqa: E402 - the tasks of this folder

BEST = "mlgym_best_improvement"


class ForkedAtReset(LocalBackend):
    """The local backend, on a fork's view from each reset on: its files frozen into a layer, the env over it."""

    def reset(self, **kwargs):
        out = super().reset(**kwargs)
        self.fork_point().close()
        assert self._res.view is not None
        return out


@pytest.fixture
def forked_backend(monkeypatch):
    # a fork of a parent that wrote little freezes a copy and leaves the parent on its own files: no copy here, so
    # that the env itself goes on over the frozen layer, as a parent with more written does
    monkeypatch.setattr(forking, "COPY_LIMIT_ENTRIES", -1)
    registry.register("backend", "local_forked_at_reset", ForkedAtReset)
    try:
        yield "local_forked_at_reset"
    finally:
        registry.unregister("backend", "local_forked_at_reset")


@pytest.mark.slow
def test_an_honest_task_passes_every_canary_on_forked_envs(tmp_path, forked_backend):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.HONEST_EVALUATOR, "honestLabels",
                               submission=weak_tasks.HONEST_SCHEMA)
    report = audit(spec, rewards=[BEST], backend=forked_backend)
    assert report.ok, report.table()
    assert report.gap[BEST] == 0.0


def test_a_weak_evaluator_is_caught_on_forked_envs_as_on_fresh_ones(tmp_path, forked_backend):
    spec = weak_tasks.csv_task(tmp_path / "task", weak_tasks.ACCEPTS_DUPLICATED_IDS, "dupLabels")
    names = ["first_row_everywhere", "constant_answer"]
    forked = {r.canary.name: r.verdict for r in audit(spec, canaries=names, backend=forked_backend).results}
    fresh = {r.canary.name: r.verdict for r in audit(spec, canaries=names).results}
    assert forked == fresh
