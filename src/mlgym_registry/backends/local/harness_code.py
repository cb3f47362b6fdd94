"""How a process starts the evaluation harness: from its code, compiled once per driver, instead of its source.

Both processes of every evaluation run ``harness.py``, and Python compiles a script from source each time it runs
one (it caches the bytecode of imported modules only): 20 ms of CPU for the harness's 1,400 lines, two thirds of what
starting each process costs before the evaluation's own work. So the driver compiles it once, for the path the
process sees it at, and hands each process the compiled code in a sealed memory file (``memfd``: nothing can change
it once written), which a short ``-c`` program loads and runs as ``__main__``, with ``__file__`` and ``sys.argv``
as running the script would give. Tracebacks still show the harness's lines: the code names its file.

Only where the process's interpreter is the driver's own program (a virtual environment of it is): compiled code is
valid for one version of Python. Any other interpreter (a task's environment on another Python) runs the script.
"""

from __future__ import annotations

import functools
import marshal
import os
import sys
from pathlib import Path

from .kernel_counts import above_sandbox_fds

HARNESS_SOURCE = Path(__file__).parent / "harness" / "harness.py"
"""The harness's source, in the package."""

LOADER = (
    "import marshal,os,sys\n"
    "_harness=marshal.loads(os.pread(int(sys.argv[1]),int(sys.argv[2]),0))\n"
    "os.close(int(sys.argv[1]))\n"
    "__file__=sys.argv[3]\n"
    "sys.argv=sys.argv[3:]\n"
    "exec(_harness)\n"
)
"""The ``-c`` program: ``LOADER FD SIZE PATH ARGS...`` runs the code in memory file ``FD`` as the script ``PATH``
run with ``ARGS`` would run (its module is ``__main__``, as a script's is)."""


def harness_command(python: str, shown_path: str) -> tuple[list[str], tuple[int, ...]]:
    """The start of the command line that runs the harness (its role and options follow), and the descriptors the
    process must be handed (``pass_fds``; the caller closes them once it has started): the memory file holding the
    harness's code, or none where the process runs it from its source (``shown_path``, where it sees the file)."""
    if not _same_interpreter(python):
        return [python, "-I", shown_path], ()
    code = compiled(shown_path)
    fd = _sealed_memory(code)
    return [python, "-I", "-c", LOADER, str(fd), str(len(code)), shown_path], (fd,)


@functools.cache
def compiled(shown_path: str) -> bytes:
    """The harness compiled for a process that sees it at ``shown_path`` (the name its code and tracebacks give),
    marshalled."""
    source = HARNESS_SOURCE.read_bytes()
    return marshal.dumps(compile(source, shown_path, "exec", dont_inherit=True))


@functools.cache
def _same_interpreter(python: str) -> bool:
    return os.path.realpath(python) == os.path.realpath(sys.executable)


def _sealed_memory(data: bytes) -> int:
    """A memory file holding ``data``, sealed against any change, above the descriptor the sandbox's start-up
    shell takes (``kernel_counts.above_sandbox_fds``)."""
    import fcntl

    fd = os.memfd_create("mlgym-registry-harness", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return above_sandbox_fds(fd)
    except BaseException:
        os.close(fd)
        raise
