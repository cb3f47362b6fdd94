"""Frozen layers of forked envs: the last hold removes one, and no copy of a hold in another process keeps it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from mlgym_registry.backends.local import layers

CEILING = 60.0
"""Seconds a test waits for a layer to go (a ceiling for a loaded machine: it returns as soon as it is gone)."""


def gone_within(folder: Path, ceiling: float = CEILING) -> bool:
    deadline = time.monotonic() + ceiling
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not folder.exists()


@pytest.fixture
def layer(tmp_path) -> layers.Layer:
    source = tmp_path / "files"
    source.mkdir()
    (source / "answer.txt").write_text("42\n")
    held = layers.Layer.freeze(source, tmp_path)
    yield held
    held.release()


def test_the_last_hold_removes_the_layer(layer):
    other = layer.share()
    layer.release()
    assert (layer.tree / "answer.txt").read_text() == "42\n"
    layer.release()  # idempotent: still held by the other
    assert layer.folder.exists()
    other.release()
    assert not layer.folder.exists()


def test_a_process_forked_while_a_layer_is_held_does_not_keep_it(layer):
    """A worker forked from the driver (multiprocessing's fork, a pool's worker) lives on without holding the layer."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked worker: says it is up, then lives on
        os.write(ready_write, b"up")
        time.sleep(120)
        os._exit(0)
    try:
        os.close(ready_write)
        assert os.read(ready_read, 2) == b"up"
        layer.release()
        assert not layer.folder.exists()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_read)


def test_a_program_being_started_does_not_keep_a_layer(layer):
    """A program started with a ``preexec_fn`` (as the shells are) runs Python between its fork and its program;
    a layer let go meanwhile is removed at once."""
    in_child_read, in_child_write = os.pipe()
    go_read, go_write = os.pipe()

    def between_fork_and_exec() -> None:
        os.write(in_child_write, b"in")
        os.read(go_read, 1)  # held here until the test has let go of the layer

    starter = threading.Thread(target=subprocess.run, args=(["true"],),
                               kwargs={"preexec_fn": between_fork_and_exec, "pass_fds": (in_child_write, go_read)})
    starter.start()
    try:
        assert os.read(in_child_read, 2) == b"in"
        layer.release()
        assert not layer.folder.exists()
    finally:
        os.write(go_write, b"g")
        starter.join()
        for fd in (in_child_read, in_child_write, go_read, go_write):
            os.close(fd)


def test_a_layer_held_by_a_copy_in_a_program_goes_once_the_program_ends(layer):
    """A copy no hook can drop (a child that runs no Python before its program, given the lock here on purpose) makes
    the letting go find the layer held: it is looked at again, and removed once the copy is gone."""
    program = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=(layer.fd,))
    try:
        layer.release()
        assert layer.folder.exists()
    finally:
        program.stdin.close()
        program.wait()
    assert gone_within(layer.folder)


def test_a_layer_another_env_holds_stays(layer):
    other = layer.share()
    try:
        layer.release()
        time.sleep(layers._Reaper.DELAYS[1] * 2)  # the reaper has looked again by now: the layer is still held
        assert (other.tree / "answer.txt").read_text() == "42\n"
    finally:
        other.release()
    assert not layer.folder.exists()
