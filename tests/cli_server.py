"""Runs the tests' ``mlgym-registry`` command lines (``run_cli`` and the docs' shell blocks, see ``cli_commands.py``),
each in a process of its own forked from this one, as ``python -m mlgym_registry.cli ARGS`` would run it.

A command that plays an episode spends most of a short run importing torch, tensordict, TorchRL and transformers
(about 5 s of a 7 s ``run`` on an idle 2-core machine, several times that on a loaded one). This server imports them
once, as it starts, and every command starts from a fork that has them instead of a fresh interpreter that imports
them again (a command that needs none of them costs the same either way). Nothing of this package is imported here:
each command imports ``mlgym_registry``, loads its plugins and runs ``mlgym_registry.cli`` as ``__main__`` in its own
process, with its own working folder, environment, umask, standard streams and exit status.

Protocol, one JSON object a line: the test writes ``{"argv", "cwd", "env", "umask", "stdout", "stderr"}`` to this
process's standard input; it answers ``{"pid": PID}`` when the command's process is started, then ``{"exit": CODE}``
(``-N`` for a process that signal N ended) when it is over. It ends at the end of its input.
"""

from __future__ import annotations

import json
import os
import sys

PRELOAD = ("torch", "tensordict", "torchrl", "torchrl.envs", "transformers", "transformers.utils.chat_template_utils")
"""What a fresh interpreter of an episode command spends its start importing (tensordict brings in torch._dynamo,
torchrl.envs Ray)."""


def preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # the command imports it itself, and reports the error where it happens
            pass


def run_command(request: dict) -> None:
    """In the forked process: become ``python -m mlgym_registry.cli ARGV`` started in ``cwd`` with ``env``; never
    returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        import random
        import tempfile

        tempfile.tempdir = None  # from TMPDIR as the command's environment sets it, not as the server's was
        random.seed()  # a fresh interpreter's randomness, not a copy of the server's
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], written),
                                (2, request["stderr"], written)):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = ["-m", *request["argv"]]
        sys.path[0] = os.getcwd()  # as `python -m` puts it
        import runpy

        runpy.run_module("mlgym_registry.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:  # as the interpreter turns it into an exit status
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports an uncaught exception
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    preload()
    while line := sys.stdin.readline():
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_command(request)
        reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        reply({"exit": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
