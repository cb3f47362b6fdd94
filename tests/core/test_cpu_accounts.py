"""The suite's CPU accounts (``tests/cpu_accounts.py``), which ``make test``'s time table prints: a test's report
carries the CPU time of the child processes it waited for, and the machine's time is read from ``/proc/stat``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cpu_accounts
import pytest

TESTS = Path(__file__).resolve().parents[1]

BURN = "total = 0\nfor i in range(3_000_000):\n    total += i * i\n"
"""A child's fixed work: a few tenths of a CPU second, however loaded the machine (its CPU time, not its wall time)."""


def burn_in_a_child() -> None:
    subprocess.run([sys.executable, "-c", BURN], check=True)


def test_the_cpu_of_a_child_waited_for_is_counted():
    assert cpu_accounts.measured(burn_in_a_child) > 0.05


def test_the_machines_time_is_read_from_proc_stat(tmp_path):
    hertz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal, in clock ticks
    stat.write_text(f"cpu  {3 * hertz} {hertz} {2 * hertz} {10 * hertz} {hertz} 0 {hertz} 0 0 0\ncpu0 1 2 3\n")
    assert cpu_accounts.machine_cpu(str(stat)) == cpu_accounts.MachineCpu(busy=7.0, total=18.0)
    assert cpu_accounts.machine_cpu(str(tmp_path / "missing")) is None
    now = cpu_accounts.machine_cpu()
    assert now is not None and 0 < now.busy <= now.total


def test_each_report_carries_the_cpu_its_phase_waited_for(tmp_path):
    """An inner session with the plugin: the call of a test that runs a child carries its CPU, the others little."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(f"""
        import subprocess, sys

        def test_burns():
            subprocess.run([sys.executable, "-c", {BURN!r}], check=True)

        def test_idles(child_of_the_session):
            pass
    """))
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import json
        import subprocess
        import sys

        import cpu_accounts
        import pytest

        BURN = {BURN!r}

        def pytest_configure(config):
            config.pluginmanager.register(cpu_accounts.CpuPerReport())

        @pytest.fixture(scope="session")
        def child_of_the_session():
            child = subprocess.Popen([sys.executable, "-c", BURN])
            yield
            child.wait()

        def pytest_runtest_logreport(report):
            with open("reports.jsonl", "a") as file:
                file.write(json.dumps([report.nodeid, report.when, cpu_accounts.report_cpu(report),
                                       cpu_accounts.report_cpu(report, cpu_accounts.SESSION_END_PROPERTY)]) + "\\n")
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-c", os.devnull, "--rootdir", str(tmp_path), "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (tmp_path / "reports.jsonl").read_text().splitlines()]
    reports = {(nodeid.split("::")[-1], when): cpu for nodeid, when, cpu, _ in rows}
    session_end = sum(at_end for _, _, _, at_end in rows)
    assert len(reports) == 6  # setup, call and teardown of both
    assert reports["test_burns", "call"] > 0.05
    assert reports["test_burns", "call"] > 5 * reports["test_idles", "call"]
    # the last teardown, where the session's fixtures end (and its child is waited for), is counted apart
    assert reports["test_idles", "teardown"] == 0 and session_end > 0.05


@pytest.mark.parametrize("properties, expected", [([], 0.0), ([("cpu_seconds", 1.5), ("other", 9)], 1.5)])
def test_a_report_without_the_property_counts_nothing(properties, expected):
    report = pytest.TestReport("t.py::test", ("t.py", 0, "test"), {}, "passed", None, "call",
                               user_properties=properties)
    assert cpu_accounts.report_cpu(report) == expected
