"""What every check of the kit shares: its error, how it names things, and how the hostile-input checks time a
component (``HostileReply``, ``check_linear_time``)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ConformanceError(AssertionError):
    """A component that does not honour its contract; the message says which part and why."""


def _fail(what: str, why: str) -> None:
    raise ConformanceError(f"{what}: {why}")


def _name(obj: Any) -> str:
    """How a message names ``obj``: a template set by its ``name``, a function or class by its qualified name, an
    instance by its class's."""
    from ..components.template_set import TemplateSet

    if isinstance(obj, TemplateSet):
        return repr(obj.name)
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def _text(exc: BaseException, limit: int = 200) -> str:
    """``exc``'s message on one line, cut to ``limit`` characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- hostile replies and their timing ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HostileReply:
    """A family of hostile replies, one per length: ``prefix + unit * n + middle + closer * n + suffix``, with ``n``
    as large as ``length`` allows (``make(length)``). ``megabyte``: also fed (and timed) at ``MEGABYTE`` characters,
    unless the component took more than ``MEGABYTE_SKIP_S`` at 10^5."""

    name: str
    unit: str
    closer: str = ""
    prefix: str = ""
    middle: str = ""
    suffix: str = ""
    megabyte: bool = False

    def make(self, length: int) -> str:
        """The reply of this family about ``length`` characters long (at least one unit)."""
        fixed = len(self.prefix) + len(self.middle) + len(self.suffix)
        count = max(1, (length - fixed) // (len(self.unit) + len(self.closer)))
        return self.prefix + self.unit * count + self.middle + self.closer * count + self.suffix


LENGTHS = (100, 1_000, 10_000, 100_000)
"""The lengths each hostile family is timed at; 10x apart."""

MEGABYTE = 1_000_000
"""The length after the last of ``LENGTHS`` for the families marked ``megabyte``, timed and judged (against
``MEGABYTE_FLOOR_S``) unless the component took more than ``MEGABYTE_SKIP_S`` at 10^5 characters. It is what catches
a quadratic component that is fast at 10^5 characters (a ``str.find`` restarted at every opener: 0.16 s there, 27x
the time at 10^4 because ``str.find`` switches to a faster algorithm on long text; 16 s at a megabyte)."""

MEGABYTE_SKIP_S = 0.5
"""A family the component took longer than this on at 10^5 characters is not fed a megabyte: even linear, that would
take seconds per call (and the growth up to 10^5 characters was judged)."""

GROWTH_MARGIN = 4.0
"""How much more than linear the time may grow before it fails: 10x the input may take up to 40x the time (a
loaded machine, caches; quadratic is 100x, cubic 1000x)."""

TIME_FLOOR_S = 0.02
"""Below this time on the longer reply the growth is not judged (timer noise and fixed costs dominate)."""

MEGABYTE_FLOOR_S = 0.2
"""The floor for the step from 10^5 characters to a megabyte, higher: a megabyte leaves the CPU's caches where 10^5
characters fit, which alone can make 10x the text take 20x to 40x the time. A quadratic component fast at 10^5
characters (a ``str.find`` restarted at every opener: 50 ms) takes seconds at a megabyte."""

REPEATS = 3
"""A time is the best of this many calls (one when a call takes more than ``SLOW_CALL_S``)."""

SLOW_CALL_S = 0.1

_clock = time.thread_time if time.get_clock_info("thread_time").resolution <= 1e-6 else time.perf_counter
"""What a call is timed with: the CPU time of this thread, which a machine loaded with other work does not inflate
(wall-clock time there varies 10x between two runs of the same call); wall-clock time where the thread clock is coarse
(Windows)."""

Call = Callable[[str, HostileReply], None]
"""Runs the component on one hostile reply of a family and checks what it gave (``ConformanceError`` when wrong)."""


def check_linear_time(call: Call, family: HostileReply, what: str, must: str) -> None:
    """Time ``call(reply, family)`` on the family's reply at each of ``LENGTHS`` (and at ``MEGABYTE`` when the family
    is marked ``megabyte``) and fail ``what`` when 10x the reply takes more than ``GROWTH_MARGIN`` x 10 the time.

    Times are the best of ``REPEATS`` calls with the garbage collector off; a failing ratio is measured again before
    it fails, and no ratio is judged when the longer call took under ``TIME_FLOOR_S`` (``MEGABYTE_FLOOR_S`` at a
    megabyte). ``must`` ends the failure's message: what the component must do, and where to look.
    """
    shorter: tuple[str, float] | None = None
    for length in LENGTHS:
        text = family.make(length)
        seconds = _best_time(call, text, family, REPEATS)
        if shorter is not None:
            _judge_growth(call, family, what, must, shorter, (text, seconds), TIME_FLOOR_S)
        shorter = (text, seconds)
    if not family.megabyte or shorter is None or shorter[1] > MEGABYTE_SKIP_S:
        return
    text = family.make(MEGABYTE)
    _judge_growth(call, family, what, must, shorter, (text, _best_time(call, text, family, 1)), MEGABYTE_FLOOR_S)


def _judge_growth(call: Call, family: HostileReply, what: str, must: str, shorter: tuple[str, float],
                  longer: tuple[str, float], floor: float) -> None:
    (short_text, short_s), (long_text, long_s) = shorter, longer
    if long_s < floor:
        return
    factor = len(long_text) / len(short_text)
    allowed = factor * GROWTH_MARGIN
    if long_s / max(short_s, 1e-9) <= allowed:
        return
    # measured again before failing: the best of more calls on the shorter reply, one more on the longer
    short_s = min(short_s, _best_time(call, short_text, family, 2 * REPEATS))
    long_s = min(long_s, _best_time(call, long_text, family, 1))
    growth = long_s / max(short_s, 1e-9)
    if long_s >= floor and growth > allowed:
        _fail(what, f"took {long_s:.3g} s on a hostile reply of {len(long_text):,} characters ({family.name}) and "
                    f"{short_s:.3g} s on one of {len(short_text):,}: {factor:.0f}x the reply took {growth:.0f}x the "
                    f"time (at most {allowed:.0f}x passes); {must}")


def _best_time(call: Call, text: str, family: HostileReply, repeats: int) -> float:
    best = _timed_call(call, text, family)
    for _ in range(repeats - 1):
        if best > SLOW_CALL_S:
            break
        best = min(best, _timed_call(call, text, family))
    return best


def _timed_call(call: Call, text: str, family: HostileReply) -> float:
    """Seconds ``call(text, family)`` took, with the garbage collector off."""
    enabled = gc.isenabled()
    gc.disable()
    start = _clock()
    try:
        call(text, family)
    finally:
        elapsed = _clock() - start
        if enabled:
            gc.enable()
    return elapsed
