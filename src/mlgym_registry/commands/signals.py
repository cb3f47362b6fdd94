"""Signals during a command: SIGTERM ends it the way Ctrl-C does (clean-up runs), and a Ctrl-C during clean-up waits
until the clean-up is done."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(143)`` so that clean-up (``finally``) runs as it does for Ctrl-C."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    with on_sigterm(stop):
        yield


@contextmanager
def on_sigterm(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Call ``handler`` on SIGTERM while the block runs (the previous handler comes back after); a no-op outside
    the main thread, where Python cannot set signal handlers."""
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that arrives while cleaning up until the clean-up is done (then raise it)."""
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt
