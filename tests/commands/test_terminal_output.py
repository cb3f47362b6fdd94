"""The progress bar of many-episode runs (tqdm's): where it writes, how often, and what its line says."""

from __future__ import annotations

import io
import time

from mlgym_registry.commands.terminal_output import LOG_REDRAW_S, TERMINAL_REDRAW_S, progress_bar, show_progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_the_bar_goes_to_stderr_by_default_and_ends_with_the_final_counts_and_note(capsys):
    bar = progress_bar(2, "blotto: episodes done")
    show_progress(bar, 1, "3 steps")
    show_progress(bar, 2, "7 steps")
    bar.close()
    captured = capsys.readouterr()
    assert captured.out == ""
    final = captured.err.split("\r")[-1]
    assert final.startswith("blotto: episodes done: 100%")
    assert " 2/2 [" in final
    assert final.endswith(", 7 steps]\n")


def test_a_log_gets_the_first_and_last_state_not_a_line_per_step():
    log = io.StringIO()
    bar = progress_bar(4, "blotto: episodes done", stream=log)
    assert bar.mininterval == LOG_REDRAW_S
    for done in range(5):
        show_progress(bar, done, f"{done * 3} steps")
    bar.close()
    snapshots = log.getvalue().strip("\r\n").split("\r")
    assert len(snapshots) == 2
    assert " 0/4 [" in snapshots[0]
    assert " 4/4 [" in snapshots[1] and snapshots[1].endswith(", 12 steps]")


def test_a_terminal_shows_new_steps_even_when_no_episode_ended():
    terminal = Terminal()
    bar = progress_bar(2, "blotto: episodes done", stream=terminal)
    assert bar.mininterval == TERMINAL_REDRAW_S
    show_progress(bar, 0, "1 steps")
    time.sleep(TERMINAL_REDRAW_S * 2)
    show_progress(bar, 0, "2 steps")  # a step, no episode finished: the redraw shows it
    shown = terminal.getvalue().split("\r")[-1]
    assert " 0/2 [" in shown and shown.endswith("<?, ?episode/s, 2 steps]")  # any elapsed time: a loaded machine
    bar.close()
    assert terminal.getvalue().endswith("\n")
