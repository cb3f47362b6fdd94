"""Readers never block: ``report``, ``replay`` and ``show`` skip (and name) what in a run folder is not a regular file.

A run folder may come from anywhere. A FIFO where a ``.traj`` or ``results.json`` belongs used to hang ``report`` (an
``open`` that waits for a writer), a symlink to ``/dev/zero`` would be read until memory ran out, and a link could
make a report read the reader's own files. Each test plants such entries and runs the real command in a fresh
process with a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlgym_registry.records.regular_files import MAX_FILE_BYTES, FileTooLarge, read_regular

pytestmark = pytest.mark.security

CLI = [sys.executable, "-m", "mlgym_registry.cli"]
TIMEOUT_S = 60  # far above what these commands take (a few seconds); a blocking read never returns
TASK = "blotto"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def traj_text(exit_status: str = "submitted") -> str:
    return json.dumps({"environment": "mlgym_main", "trajectory": [], "history": [],
                       "info": {"exit_status": exit_status, "score": [{"Score": 0.7}]}})


def run_folder(root: Path, run: int, *, traj: bool = True, results: bool = True) -> Path:
    """One run in MLGym's layout (``<model>__<task>__...``) with a sound ``.traj`` and ``results.json``."""
    folder = root / f"metagen-alpha__{TASK}__default__parallel_agents_run_{run}"
    folder.mkdir(parents=True)
    if traj:
        (folder / f"{TASK}.traj").write_text(traj_text())
    if results:
        (folder / "results.json").write_text(json.dumps({"agent": [{"Score": 0.7}], "baseline": {"Score": 0.5}}))
    return folder


def make_socket(path: Path) -> None:
    """A Unix socket file at ``path`` (bound from its folder: the full path may exceed the 108-byte limit)."""
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(path.name)
    finally:
        os.chdir(here)


@pytest.fixture
def hostile(tmp_path) -> dict[str, Path]:
    """A folder of runs with a sound run and, where run files belong: a FIFO, a socket, a symlink to /dev/zero, a
    folder, a file over the size cap (sparse), a symlink out of the folder, and a FIFO ``settings.json``."""
    root = tmp_path / "runs"
    run_folder(root, 0)
    planted = {"root": root}
    fifo = run_folder(root, 1, traj=False) / f"{TASK}.traj"
    os.mkfifo(fifo)
    results_fifo = run_folder(root, 2, results=False) / "results.json"
    os.mkfifo(results_fifo)
    sock = run_folder(root, 3, traj=False) / f"{TASK}.traj"
    make_socket(sock)
    zero = run_folder(root, 4, traj=False) / f"{TASK}.traj"
    zero.symlink_to("/dev/zero")
    folder = run_folder(root, 5, traj=False) / f"{TASK}.traj"
    folder.mkdir()
    big = run_folder(root, 6, results=False) / "results.json"
    with open(big, "wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used, and nothing of it may be read
    secret = tmp_path / "outside" / "secret.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"agent": [{"Score": 42.0}], "baseline": {"Score": 0.5}}))
    outside = run_folder(root, 7, results=False) / "results.json"
    outside.symlink_to(secret)
    sound = root / next(p.name for p in root.iterdir() if p.name.endswith("_run_0"))
    settings = sound / "settings.json"
    os.mkfifo(settings)
    (run_folder(root, 8, results=False) / "results.json").symlink_to(sound / "results.json")  # inside: read
    planted.update(fifo=fifo, results_fifo=results_fifo, socket=sock, zero=zero, folder=folder, big=big,
                   outside=outside, settings=settings)
    return planted


def test_report_finishes_and_names_every_irregular_file(hostile, tmp_path):
    out = tmp_path / "report"
    result = cli("report", str(hostile["root"]), "--out", str(out), "--no-plot", "--no-noise-band")
    assert result.returncode == 0, result.stderr
    warnings = result.stderr
    expected = {"fifo": "is a FIFO (named pipe), not a regular file (never opened)",
                "results_fifo": "is a FIFO (named pipe), not a regular file (never opened)",
                "socket": "is a socket, not a regular file (never opened)",
                "zero": "is a character device (through a symlink), not a regular file (never opened)",
                "folder": "is a folder, not a file",
                "big": f"is larger than {MAX_FILE_BYTES:,} bytes",
                "outside": "is a symlink out of",
                "settings": "is a FIFO (named pipe), not a regular file (never opened)"}
    for name, reason in expected.items():
        line = next((w for w in warnings.splitlines() if str(hostile[name]) in w), None)
        assert line is not None and reason in line, (name, warnings)
    with open(out / "runs.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9  # every run is still listed; the linked-in score of 42 is nowhere
    scored = {row["Run"][-5:] for row in rows if row["Best"]}
    assert scored == {"run_0", "run_1", "run_3", "run_4", "run_5", "run_8"}, rows  # run_8: a link inside is read
    # (the folders' own paths are taken out: pytest's temporary folder can be named pytest-42)
    written = ((out / "runs.csv").read_text() + (out / "summary.md").read_text()).replace(str(tmp_path), "")
    assert "42" not in written
    assert f"{len(expected)} unreadable files" in result.stdout


@pytest.mark.parametrize("name, reason", [
    ("fifo", "is a FIFO (named pipe)"),
    ("socket", "is a socket"),
    ("zero", "is a character device (through a symlink)"),
    ("folder", "is a folder"),
])
def test_show_refuses_what_is_not_a_regular_file(hostile, name, reason):
    result = cli("show", str(hostile[name]))
    assert result.returncode == 2 and result.stdout == ""
    assert str(hostile[name]) in result.stderr and reason in result.stderr, result.stderr


def test_show_refuses_a_file_over_the_cap(tmp_path):
    big = tmp_path / "huge.traj"
    with open(big, "wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)
    result = cli("show", str(big))
    assert result.returncode == 2 and f"larger than {MAX_FILE_BYTES:,} bytes" in result.stderr, result.stderr


def test_show_follows_a_symlink_to_a_regular_file(tmp_path):
    real = tmp_path / "real.traj"
    real.write_text(traj_text("early_exit"))
    (tmp_path / "link.traj").symlink_to(real)
    result = cli("show", str(tmp_path / "link.traj"))
    assert result.returncode == 0 and "early_exit" in result.stdout, result.stderr


def test_replay_of_a_folder_skips_and_names_them(hostile, tmp_path):
    folder = tmp_path / "trajs"
    folder.mkdir()
    os.mkfifo(folder / "a.traj")
    make_socket(folder / "b.traj")
    (folder / "c.traj").symlink_to("/dev/zero")
    (folder / "d.traj").mkdir()
    result = cli("replay", str(folder), "--out", str(tmp_path / "out"))
    assert result.returncode != 0 and "no .traj file in the folder" in result.stderr, result.stderr
    for entry, reason in (("a", "FIFO"), ("b", "socket"), ("c", "character device"), ("d", "folder")):
        line = next(w for w in result.stderr.splitlines() if f"{entry}.traj" in w)
        assert reason in line and "skipped" in line, line
    assert not (tmp_path / "out").exists()


def test_replay_refuses_a_named_fifo_and_never_reads_a_fifo_beside_the_run(hostile, tmp_path):
    result = cli("replay", str(hostile["fifo"]), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "is a FIFO (named pipe)" in result.stderr, result.stderr
    # a sound .traj whose results.json (read for the run's record) is a FIFO: read past, then the unknown task
    result = cli("replay", str(hostile["results_fifo"].parent / f"{TASK}.traj"), "--task", "noSuchTask",
                 "--out", str(tmp_path / "out2"))
    assert result.returncode == 2 and "noSuchTask" in result.stderr, result.stderr


def test_a_file_growing_past_the_cap_is_refused(tmp_path):
    path = tmp_path / "grows.json"
    path.write_bytes(b"x" * 2048)
    with pytest.raises(FileTooLarge, match="larger than 1,024 bytes"):
        read_regular(path, limit=1024)
    assert read_regular(path, limit=4096) == b"x" * 2048
