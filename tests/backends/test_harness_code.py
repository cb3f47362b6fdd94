"""The evaluation harness runs from its code, compiled once by the driver (``backends/local/harness_code.py``): the
memory file that hands the code over cannot be changed, neither process holds it once the evaluation runs, the
harness sees the ``__file__`` and ``sys.argv`` running its script gives, and another interpreter runs the script."""

from __future__ import annotations

import os
import sys
import textwrap

from test_local_backend import tiny_spec

from mlgym_registry.backends.local import LocalBackend
from mlgym_registry.backends.local.harness_code import HARNESS_SOURCE, harness_command

COUNT_HARNESS_FILES = textwrap.dedent("""\
    import os


    def harness_files():
        names = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                names.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return sum("mlgym-registry-harness" in name for name in names)
    """)

STRATEGY = COUNT_HARNESS_FILES + textwrap.dedent("""\


    def row_strategy(history):
        return harness_files()
    """)

EVALUATE = COUNT_HARNESS_FILES + textwrap.dedent("""\
    import json
    import sys

    from strategy import row_strategy

    harness = sys.modules["_mlgym_harness"]
    compiled = "-c" in sys.orig_argv and harness.__file__.endswith("/harness.py")
    # thousands: the harness ran from its compiled code; tens: memory files the evaluator holds; ones: the agent's
    print(json.dumps({"Score": 1000 * compiled + 10 * harness_files() + row_strategy([])}))
    """)


def test_both_processes_run_the_compiled_harness_and_hold_no_copy_of_it(tmp_path):
    spec = tiny_spec(tmp_path)
    (tmp_path / "task_src" / "strategy.py").write_text(STRATEGY)
    (tmp_path / "task_src" / "evaluate.py").write_text(EVALUATE)
    backend = LocalBackend(spec)
    try:
        backend.reset()
        backend.install_tools()
        for _ in range(2):  # the first evaluation starts its processes; the second takes those started ahead
            observation, _, _, info = backend.step("validate")
            assert info["score"][-1:] == [{"Score": 1000}], observation
    finally:
        backend.close()


def test_the_handed_over_code_cannot_be_changed():
    start, fds = harness_command(sys.executable, str(HARNESS_SOURCE))
    try:
        assert start[:3] == [sys.executable, "-I", "-c"] and start[-1] == str(HARNESS_SOURCE)
        (fd,) = fds
        size = os.fstat(fd).st_size
        assert size == int(start[-2])
        for change in (lambda: os.pwrite(fd, b"x", 0), lambda: os.ftruncate(fd, 0),
                       lambda: os.ftruncate(fd, size + 1)):
            try:
                change()
            except PermissionError:
                continue
            raise AssertionError("the harness's memory file took a change")
    finally:
        for fd in fds:
            os.close(fd)


def test_another_interpreter_runs_the_harness_from_its_source(tmp_path):
    other = tmp_path / "python3"
    other.write_text("#!/bin/sh\nexec python3 \"$@\"\n")
    assert harness_command(str(other), "/opt/harness.py") == ([str(other), "-I", "/opt/harness.py"], ())
