"""The descriptors an evaluation hands its sandboxed processes never take the number the sandbox's start-up shell
opens its seccomp filter on: a process holding few descriptors (a fresh worker, say) got an ``infra_error`` for every
evaluation whose channel landed there."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from mlgym_registry.backends.local.kernel_counts import SECCOMP_FD

SCRIPT = textwrap.dedent(f"""\
    import json, os
    from mlgym_registry import registry
    from mlgym_registry.backends.local import LocalBackend

    backend = LocalBackend(registry.spec("battleOfSexes"), seed=0)
    backend.reset()
    backend.install_tools()
    backend._res.stop_evaluation()  # no evaluation started ahead: the next one opens its descriptors now
    # every free descriptor below the filter's taken, so that the evaluation's next ones land on it
    taken = []
    while (fd := os.open(os.devnull, os.O_RDONLY)) < {SECCOMP_FD}:
        taken.append(fd)
    os.close(fd)
    statuses = [backend.step("validate")[3]["evaluation_status"] for _ in range(2)]
    backend.close()
    print(json.dumps(statuses))
    """)


def test_an_evaluation_whose_descriptors_would_land_on_the_filters_number_still_scores():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["ok", "ok"], done.stderr
