"""Runs a task's evaluator with the agent's code kept in another process (standard library only).

Two roles, each started by the local backend inside its own sandbox:

``harness.py evaluate --workspace DIR --trusted PATHS --fds M,WAKE,RING -- SCRIPT ARGS...``
    (or, started ahead of its workspace, ``--go-fd G [--preload MODULES]``: it imports ``MODULES`` and waits for one
    JSON line on ``G`` with the script's ``argv`` and the ``trusted`` paths)
    Runs the pristine evaluation script as ``__main__``. Its top-level imports resolve as follows: a trusted name (an
    evaluation or protected file of the task, given by its path) loads that exact pristine file, from source; a name
    the workspace defines in any form (source, bytecode, package) and the standard library or site-packages do not is
    the *agent's* module, which never runs here: it is a proxy whose functions call the ``serve`` process over the
    channel; any other name loads from the standard library and site-packages, never from the workspace (a ``random.py``
    of the agent's shadows nothing). Pristine files load from their source, never from a bytecode cache the agent
    could have written. So agent code can neither rebind
    the evaluator's objects, nor exit it early, nor print into its output, which is the score's channel.

``harness.py serve --workspace DIR --memory-fd M [--go-fd G]``
    Imports the agent's modules and answers calls. Both processes share one memory region (a sealed memfd, ``M``,
    see ``Link``): requests are written into one half (marshal or pickle data, from the trusted evaluator), answers
    into the other (tagged bytes: struct-packed ints and lists of ints, else JSON with tuples marked). Whatever the
    agent's process answers is only ever data to the evaluator, bounded and validated, never code. Each side waits for
    the other by spinning briefly on the shared memory, then sleeping on a doorbell pipe (stdin here; the evaluator's
    is in ``--fds``), whose end of file also tells a process that its peer is gone.

An argument of any value the agent's own code could receive crosses: plain data by marshal, other objects by pickle;
an iterator (a generator, ``map``, ``itertools.count()``, a file's lines...) stays the evaluator's and crosses as an
``EvaluatorIterator``, whose every ``next`` asks the evaluator for one item (a ``NEXT`` message instead of an answer),
so the agent's code consumes it lazily and exactly as far as it iterates; a function or module of the agent's crosses
as a reference to the agent's own. What cannot cross (a lambda, a lock, an object of a class the evaluation script
defines) is refused before anything is sent, with an ``UncarriableValue`` naming the call and the argument.
"""

from __future__ import annotations

import builtins
import gc
import importlib
import importlib.machinery
import io
import json
import marshal
import mmap
import os
import pickle
import select
import struct
import sys
import types
from importlib import _bootstrap_external
from time import perf_counter as _clock

# Every import here is paid by both processes of every evaluation, so only cheap ones: importlib.abc, tempfile and
# platform took longer to import (about 15 ms) than the interpreter takes to start.

HARNESS_MODULE = "_mlgym_harness"
"""Another name of this module in ``sys.modules``, in both processes, by which a pickle names its classes: it runs as
``__main__``, which in the evaluator's process is the evaluation script's name while the script runs."""
if __name__ in sys.modules:
    sys.modules.setdefault(HARNESS_MODULE, sys.modules[__name__])

MAX_LINE = 64 << 20
"""The longest answer the evaluator reads from the agent's process (bytes)."""
MAX_REQUEST = 1 << 30
"""The longest request the agent's process accepts (bytes): they come from the trusted evaluator."""


# -- the wire format: JSON with tuples marked, so that `history` arguments keep their type ------------------------
def encode(value):
    """``value`` as JSON-ready data; raises TypeError for what cannot cross (functions, objects, ...)."""
    if type(value) is list and all(type(v) is int for v in value):
        return value  # the common answer of a `map`: moves
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return {"__pairs__": [[encode(k), encode(v)] for k, v in value.items()]}
        return {k: encode(v) for k, v in value.items()}
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and getattr(value, "shape", None) == ():
        return encode(item())
    tolist = getattr(value, "tolist", None)  # numpy arrays
    if callable(tolist):
        return encode(tolist())
    raise TypeError(f"a value of type {type(value).__name__} cannot be passed between the evaluator and agent code")


def decode(data):
    """The inverse of ``encode``."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if isinstance(data, dict):
        if set(data) == {"__tuple__"}:
            return tuple(decode(v) for v in data["__tuple__"])
        if set(data) == {"__pairs__"}:
            return {_hashable(decode(k)): decode(v) for k, v in data["__pairs__"]}
        return {k: decode(v) for k, v in data.items()}
    return data


def _hashable(value):
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


# -- the link: a shared memory region and two doorbell pipes --------------------------------------------------------
HEADER = 4096
"""Bytes at the start of the region that hold the counters and sleep flags, each on a cache line of its own."""
REQUEST_SEQ, REQUEST_ACK, ANSWER_SEQ, ANSWER_ACK, EVALUATOR_SLEEPS, AGENT_SLEEPS = 0, 64, 128, 192, 256, 320
CHUNK_HEADER = struct.Struct("<IB")
"""Before each chunk in an area: its length and whether more chunks of the same message follow."""
SPIN = 0.0002
"""How long (seconds) a waiting process first looks at the shared memory before it sleeps on its doorbell: a peer
that answers within it is seen without any system call. Each process then adapts its own spin to its peer: a wait
that ended within ``MAX_SPIN`` after a sleep makes the next spin at least twice as long (a sleep and a wake-up cost
far more than such a wait), a longer wait halves it, down to ``MIN_SPIN``. Halving on every wait that outlasted the
spin instead locked both processes into sleeping on every call as soon as the peer's work outgrew the spin."""
MAX_SPIN = 0.002
MIN_SPIN = 0.00002
SPIN_ROUND = range(32)
"""How many times a spinning process looks at the memory between two readings of the clock."""
BUSY_CHECK = 4096
"""Every this many waits, a process looks at the machine's load: when more processes are runnable than there are
cores, it does not spin at all (a spinning process takes the core its peer, or anyone, needs), it sleeps at once."""
NAP = 0.01
"""The longest a sleeping process waits before looking again, whatever the doorbell says (a wake-up lost to store
reordering between the two processes costs at most this)."""
ORDERED = os.uname().machine.lower() in ("x86_64", "amd64", "i386", "i686", "x86")
"""Whether this CPU keeps stores in order as other cores see them (x86): only then may a reader take a message it
saw in memory without a doorbell's system call in between; elsewhere every message rings the doorbell."""


_FENCE_LOCK = __import__("_thread").allocate_lock()


def _fence() -> None:
    """A full memory barrier: taking and releasing a lock is an atomic read-modify-write (a locked instruction on
    x86), which neither the compiler nor the CPU moves loads or stores across. Without it, each process could read
    the other's old flag and counter at once, and sleep until ``NAP`` ends."""
    _FENCE_LOCK.acquire()
    _FENCE_LOCK.release()


def _machine_busy() -> bool:
    """Whether other processes want this machine's cores (True when it cannot tell): more processes are runnable than
    there are cores, besides the two ends of this link, in the least of three readings.

    The instant count, not the load average: the two processes of one evaluation spinning on an idle 2-core machine
    raise the load average to 2 within a minute, which would then stop them spinning for nothing; and the least of
    a few readings, so that a process that runs for an instant (the driver reading output) does not count.
    """
    try:
        cores = len(os.sched_getaffinity(0))
        running = min(_runnable() for _ in range(3))
        return running > cores + 1
    except (AttributeError, OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0] >= len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return True


def _runnable() -> int:
    """How many processes of the whole machine are runnable now (``/proc/loadavg``)."""
    with open("/proc/loadavg", "rb") as handle:
        return int(handle.read().split()[3].split(b"/")[0])


class PeerGone(Exception):
    """The process at the other end of the link ended."""


class Malformed(Exception):
    """What the other process wrote is not a message (a length out of bounds, a broken chunk)."""


class Link:
    """One process's end of the shared-memory channel: it writes messages into one area and reads the other's.

    A message is written as chunks of at most an area's size; the writer bumps its sequence byte after each chunk,
    the reader copies the chunk out and bumps its acknowledgement byte. A waiting process spins on the byte it
    waits for, then raises its sleep flag and waits on its doorbell pipe, which the other rings (one byte) when it
    sees the flag. Each side keeps its own counters: what the other writes into the region is only ever data to it,
    never trusted for a bound or a position.
    """

    def __init__(self, memory_fd: int, wake_fd: int, ring_fd: int, *, evaluator: bool):
        size = os.fstat(memory_fd).st_size
        if size < HEADER + 2 * 4096:
            raise ValueError(f"the channel's memory is too small ({size} bytes)")
        self._memory = mmap.mmap(memory_fd, size)
        area = (size - HEADER) // 2
        self._chunk = area - CHUNK_HEADER.size
        request, answer = HEADER, HEADER + area
        if evaluator:
            self._out, self._out_seq, self._out_ack = request, REQUEST_SEQ, REQUEST_ACK
            self._in, self._in_seq, self._in_ack = answer, ANSWER_SEQ, ANSWER_ACK
            self._mine, self._peer = EVALUATOR_SLEEPS, AGENT_SLEEPS
        else:
            self._out, self._out_seq, self._out_ack = answer, ANSWER_SEQ, ANSWER_ACK
            self._in, self._in_seq, self._in_ack = request, REQUEST_SEQ, REQUEST_ACK
            self._mine, self._peer = AGENT_SLEEPS, EVALUATOR_SLEEPS
        self._wake, self._ring_fd = wake_fd, ring_fd
        os.set_blocking(ring_fd, False)
        self._sent = self._received = 0
        self._spin = SPIN
        self._waits, self._busy = BUSY_CHECK, _machine_busy()

    def _wait(self, offset: int, want: int) -> None:
        """Until the byte at ``offset`` is ``want``: spin, then sleep on the doorbell."""
        memory = self._memory
        if memory[offset] == want:
            return
        self._waits -= 1
        if not self._waits:
            self._waits, self._busy = BUSY_CHECK, _machine_busy()
        if ORDERED and not self._busy:
            start = _clock()
            deadline = start + self._spin
            while True:
                for _ in SPIN_ROUND:
                    if memory[offset] == want:
                        return
                if _clock() >= deadline:
                    break
            self._sleep(offset, want)
            waited = _clock() - start
            if waited < MAX_SPIN:
                self._spin = min(MAX_SPIN, max(self._spin, 2 * waited))
            elif self._spin > MIN_SPIN:
                self._spin /= 2  # the peer works long between answers: spinning would only burn the core
            return
        self._sleep(offset, want)

    def _sleep(self, offset: int, want: int) -> None:
        """Until the byte at ``offset`` is ``want``, sleeping on the doorbell."""
        memory = self._memory
        while True:
            memory[self._mine] = 1
            _fence()  # the flag is seen before the byte is read again (the peer fences the other way in _ring)
            if ORDERED and memory[offset] == want:
                break
            if select.select([self._wake], [], [], NAP)[0]:
                try:
                    rung = os.read(self._wake, 4096)
                except OSError:
                    rung = b""
                if not rung:
                    memory[self._mine] = 0
                    raise PeerGone
            if memory[offset] == want:
                break
        memory[self._mine] = 0

    def _ring(self) -> None:
        _FENCE_LOCK.acquire()  # _fence(), inline: what was just written is seen before the peer's sleep flag is read
        _FENCE_LOCK.release()
        if not ORDERED or self._memory[self._peer]:
            try:
                os.write(self._ring_fd, b"\0")
            except BlockingIOError:
                pass  # the pipe is full of rings the peer has not read yet: it will wake anyway
            except OSError:
                raise PeerGone from None

    def send(self, data: bytes) -> None:
        """Write one message (any length), chunk by chunk as the reader takes them."""
        memory, total = self._memory, len(data)
        if total <= self._chunk and memory[self._out_ack] == self._sent:
            # the common case, without a wait: one chunk, and the reader took the previous message
            out = self._out
            CHUNK_HEADER.pack_into(memory, out, total, 0)
            memory[out + CHUNK_HEADER.size:out + CHUNK_HEADER.size + total] = data
            self._sent = sent = (self._sent + 1) & 255
            memory[self._out_seq] = sent
            self._ring()
            return
        chunk, position = self._chunk, 0
        while True:
            self._wait(self._out_ack, self._sent)  # the reader took the previous chunk: the area is free
            piece = data[position:position + chunk] if position or total > chunk else data
            more = position + chunk < total
            CHUNK_HEADER.pack_into(memory, self._out, len(piece), more)
            start = self._out + CHUNK_HEADER.size
            memory[start:start + len(piece)] = piece
            self._sent = (self._sent + 1) & 255
            memory[self._out_seq] = self._sent
            self._ring()
            position += chunk
            if not more:
                return

    def receive(self, limit: int) -> bytes:
        """The next message; ``Malformed`` when it breaks the framing or is longer than ``limit`` bytes."""
        memory, chunk, parts, total = self._memory, self._chunk, [], 0
        while True:
            want = (self._received + 1) & 255
            self._wait(self._in_seq, want)
            length, more = CHUNK_HEADER.unpack_from(memory, self._in)
            if length > chunk or (more and length != chunk) or total + length > limit:
                raise Malformed(f"a chunk of {length} bytes")
            start = self._in + CHUNK_HEADER.size
            piece = memory[start:start + length]
            self._received = want
            memory[self._in_ack] = want
            self._ring()
            if not more:
                if not parts:
                    return piece
                parts.append(piece)
                return b"".join(parts)
            parts.append(piece)
            total += length


# -- answers: tagged bytes, read as untrusted data -------------------------------------------------------------------
INT = struct.Struct("<q")
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
_INT_LISTS = {n: struct.Struct(f"<{n}q") for n in range(65)}


def pack_value(value) -> bytes:
    """An answer's value as bytes: ints and lists of ints struct-packed, other values as JSON (``encode``)."""
    if type(value) is int and INT_MIN <= value <= INT_MAX:
        return b"I" + INT.pack(value)  # the common answer, a move
    if type(value) is not int and type(value) is not list:
        value = encode(value)
    kind = type(value)
    if kind is int:
        if INT_MIN <= value <= INT_MAX:
            return b"I" + INT.pack(value)
    elif kind is list and all(type(v) is int for v in value):
        packer = _INT_LISTS.get(len(value)) or struct.Struct(f"<{len(value)}q")
        try:
            return b"L" + packer.pack(*value)
        except struct.error:  # an int beyond 64 bits: JSON has no bound
            pass
    elif value is None:
        return b"N"
    elif value is True:
        return b"T"
    elif value is False:
        return b"F"
    return b"J" + json.dumps(encode(value)).encode("ascii")


def pack_error(text: str) -> bytes:
    """An answer saying that the agent's code failed."""
    return b"E" + text.encode("utf-8", "replace")


def unpack_answer(data: bytes):
    """The value of an answer from the agent's process; ``AgentCodeError`` for an error or anything malformed."""
    tag, size = data[:1], len(data)
    if tag == b"I" and size == 9:
        return INT.unpack_from(data, 1)[0]
    if tag == b"L" and size % 8 == 1:
        count = size >> 3
        unpacker = _INT_LISTS.get(count) or struct.Struct(f"<{count}q")
        return list(unpacker.unpack_from(data, 1))
    if size == 1 and tag in (b"N", b"T", b"F"):
        return None if tag == b"N" else tag == b"T"
    if tag == b"E":
        raise AgentCodeError(data[1:].decode("utf-8", "replace"))
    if tag == b"J":
        try:
            value = _without_collections(json.loads, data[1:])
            if b'"__tuple__"' in data or b'"__pairs__"' in data:
                return decode(value)
            return value  # nothing was marked: JSON's own types are the values (a map of 10,000 moves decodes in C)
        except (ValueError, RecursionError):
            pass
    raise AgentCodeError("the agent's code answered with something that is not a value")


def _without_collections(load, data):
    """``load(data)`` with the garbage collector off. A message can hold many thousands of small containers (a
    ``map`` over games' histories, or its answers), and the collections their making triggers cost more than making
    them (5x for 10,000 histories); what a loader makes holds no cycles to collect."""
    if not gc.isenabled():
        return load(data)
    gc.disable()
    try:
        return load(data)
    finally:
        gc.enable()


def dump_request(value, iterators: Iterators | None = None, where: str = "the call") -> bytes:
    """A request's value as bytes: ``marshal`` (tagged ``m``) when it holds only core types (ints, strings, lists,
    tuples, dicts...: a game's histories), which writes and reads two to three times faster than ``pickle``; else
    ``pickle`` (tagged ``p``, see ``RequestPickler``: the iterators in it are entered in ``iterators``, and cross as
    ``EvaluatorIterator``). Requests come from the trusted evaluator, so the agent's process may load either.

    marshal writes any object with the buffer protocol that it meets among core types (a numpy array or scalar, a
    bytearray) as bytes: telling them apart costs a walk over every object (about the time marshal takes again),
    which the games' requests would pay on every call; it is not done.

    Raises ``UncarriableValue`` (or pickle's own error) for what cannot cross."""
    try:
        return b"m" + marshal.dumps(value)
    except ValueError:  # an object marshal does not know (instances of classes, iterators)
        pass
    buffer = io.BytesIO()
    RequestPickler(buffer, iterators, where).dump(value)
    return b"p" + buffer.getvalue()


# -- what pickle alone would get wrong: iterators, the agent's own functions, the evaluation script's objects ------
class UncarriableValue(TypeError):
    """A value the evaluator passes to the agent's code that cannot cross to the agent's process (a lambda, a lock,
    an open socket, an object of a class the evaluation script defines); raised in the evaluator before anything is
    sent, its message names the call and the argument. A ``TypeError``, as pickle's own refusal was."""


NEXT = struct.Struct("<cQ")
"""What the agent's process sends instead of an answer to ask for the next item of the evaluator's iterator number
``Q``: ``b"n"`` and that number. The evaluator's reply: ``b"i"`` and the item (a request's value), ``b"s"`` (it is
exhausted), ``b"r"`` and ``name\\0message`` (it raised) or ``b"x"`` (no such iterator: the call it was passed to
has ended)."""
REPLIES = frozenset((b"i", b"s", b"r", b"x"))
_PLAIN_TYPES: set[type] = set()
"""Types whose objects ``RequestPickler`` leaves to pickle: neither iterators, nor classes, nor functions."""
_FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType)


def is_iterator(value) -> bool:
    """Whether ``value`` is an iterator (its type has ``__next__`` and ``iter`` gives it back), not a container."""
    if not hasattr(type(value), "__next__"):
        return False
    try:
        return iter(value) is value
    except Exception:  # noqa: BLE001 - an __iter__ that raises: not an iterator to stream
        return False


class Iterators:
    """The evaluator's iterators the agent's process holds an ``EvaluatorIterator`` of, by number, while the calls
    they were passed to last; and what they raised as the agent's code iterated them."""

    def __init__(self):
        self.live: dict[int, list] = {}
        """number: [the iterator, what it was passed to, how many items it gave]"""
        self.raised: dict[int, tuple[BaseException, bool]] = {}
        """number: (what it raised last, whether that is raised whatever the agent's code made of it); one that is
        stays (what was raised before it is kept per iterator, not per request: the agent may ask without end)"""
        self.next_number = 0

    def add(self, iterator, where: str) -> int:
        """Enter ``iterator``, passed to ``where``; its number."""
        number = self.next_number
        self.next_number += 1
        self.live[number] = [iterator, f"the {type(iterator).__name__} passed to {where}", 0]
        return number

    def note(self, number: int, exc: BaseException, always: bool) -> None:
        """Iterator ``number`` raised ``exc`` in the agent's code (``always``: raise it whatever that code did)."""
        if not self.raised.get(number, (None, False))[1]:
            self.raised[number] = (exc, always)

    def end(self, start: int) -> list[tuple[BaseException, bool]]:
        """Forget the iterators numbered from ``start`` on (those of a call that ended); what they raised."""
        for number in [n for n in self.live if n >= start]:
            del self.live[number]
        ended = [number for number in self.raised if number >= start]
        return [self.raised.pop(number) for number in ended]


class RequestPickler(pickle.Pickler):
    """``pickle`` for the evaluator's requests, deciding what plain pickle would get wrong: an iterator would be
    copied (the evaluator's own would not advance as the agent's code consumes it) or refused (a generator): it is
    entered in the channel's ``Iterators`` and crosses as an ``EvaluatorIterator``; a class or function of the
    evaluation script (``__main__``) would be named by a reference the agent's process cannot resolve: it is refused
    here, not there, where the failure would look like the agent's code's."""

    def __init__(self, file, iterators: Iterators | None, where: str):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.iterators, self.where = iterators, where

    def reducer_override(self, obj):
        kind = type(obj)
        if kind in _PLAIN_TYPES:
            return NotImplemented
        if is_iterator(obj):
            if self.iterators is None:
                raise UncarriableValue(f"a {kind.__name__} (an iterator) cannot cross here")
            return EvaluatorIterator, (self.iterators.add(obj, self.where),)
        if isinstance(obj, type) or kind in _FUNCTION_TYPES:
            if getattr(obj, "__module__", None) == "__main__":
                what = "class" if isinstance(obj, type) else "function"
                raise UncarriableValue(
                    f"it is or holds the evaluation script's own {what} {getattr(obj, '__qualname__', '?')!r}, which "
                    "the agent's process cannot import (it never runs the evaluation script)")
            return NotImplemented
        if len(_PLAIN_TYPES) < 4096:
            _PLAIN_TYPES.add(kind)
        return NotImplemented


def exception_payload(exc: BaseException) -> bytes:
    """``exc`` as the ``b"r"`` reply names it: its type (its bare name for a built-in one) and message."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    try:
        message = str(exc)[:4000]
    except Exception:  # noqa: BLE001 - an exception whose str() raises
        message = "(unprintable)"
    return f"{name}\0{message}".encode("utf-8", "replace")


def payload_exception(payload: bytes) -> BaseException:
    """The exception the agent's code sees for ``exception_payload``: the built-in type itself, else a
    ``RuntimeError`` naming it."""
    name, _, message = payload.decode("utf-8", "replace").partition("\0")
    kind = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(kind, type) and issubclass(kind, BaseException):
        try:
            return kind(message) if message else kind()
        except Exception:  # noqa: BLE001 - a built-in exception that needs other arguments (UnicodeDecodeError)
            pass
    return RuntimeError(f"the evaluator's iterator raised {name}: {message}")


def exception_line(exc: BaseException) -> str:
    """The last line of ``exc``'s traceback, as ``agent_error_text`` ends with it for a built-in exception."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() raises
        return type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class EvaluatorIterator:
    """An iterator of the evaluator's as the agent's code receives it: each ``next`` asks the evaluator's process for
    the next item of its own iterator, so the agent's code consumes it lazily and exactly as far as it iterates (an
    endless one included), and the evaluator's iterator is where the agent's code left it. It lasts as long as the
    call it was passed to; its items cross as the call's arguments do, and an exception the evaluator's iterator
    raises is raised here (a built-in one as itself)."""

    __slots__ = ("_number",)
    __module__ = HARNESS_MODULE

    def __init__(self, number: int):
        self._number = number

    def __iter__(self):
        return self

    def __next__(self):
        link = _AGENT_LINK
        if link is None:
            raise RuntimeError("an iterator of the evaluator's is only iterated in the agent's process")
        link.send(NEXT.pack(b"n", self._number))
        reply = link.receive(MAX_REQUEST)
        while reply[:1] not in REPLIES:
            link.send(_handle(reply))  # the evaluator's iterator calls the agent's code: answer that first
            reply = link.receive(MAX_REQUEST)
        tag = reply[:1]
        if tag == b"i":
            return load_request(memoryview(reply)[1:])
        if tag == b"s":
            raise StopIteration
        if tag == b"r":
            raise payload_exception(bytes(reply[1:]))
        raise RuntimeError("this iterator of the evaluator's was passed to a call that has ended: the evaluator "
                           "gives its items only while that call runs (keep its items, e.g. list(it), not it)")

    def __repr__(self) -> str:
        return f"<iterator of the evaluator's, number {self._number}>"


def load_request(data: memoryview):
    """The inverse of ``dump_request`` (in the agent's process): without garbage collections when it is large."""
    load = marshal.loads if data[:1] == b"m" else pickle.loads
    body = data[1:]
    return load(body) if len(body) < SMALL else _without_collections(load, body)


# -- requests: from the evaluator, with the calls of a function on a growing list sent as what is new --------
CALL = struct.Struct("<cHi")
"""``b"C"``, then the function's number and how many items of its previous list argument to keep (-1: none, the
pickle holds ``(args, kwargs)``; else the pickle holds the items to append)."""
MAX_FUNCTIONS = 1 << 16
SMALL = 1 << 16
"""A request shorter than this (bytes) holds too few containers for garbage collections to matter."""
_ATOMS = frozenset({int, float, complex, bool, str, bytes, type(None)})


def frozen(value) -> bool:
    """Whether ``value`` can never change: atoms, and tuples of frozen values (the moves of a game's history)."""
    kind = type(value)
    if kind in _ATOMS:
        return True
    if kind is not tuple:
        return False
    for item in value:
        if type(item) not in _ATOMS and not frozen(item):
            return False
    return True


# -- evaluator side -----------------------------------------------------------------------------------------------
class AgentCodeError(RuntimeError):
    """The agent's code raised, or answered with something that is not a value."""


class AgentChannel:
    """The evaluator's end of the link to the ``serve`` process."""

    def __init__(self, memory_fd: int, wake_fd: int, ring_fd: int):
        self._link = Link(memory_fd, wake_fd, ring_fd, evaluator=True)
        self._functions: dict[tuple[str, str], int] = {}
        self._lists: dict[int, list] = {}  # per function: the list argument the agent's process holds a copy of
        self._iterators = Iterators()
        self.failed = False
        """True once any answer was an error: the agent's code failed, even if the script caught it."""

    def ask(self, **request):
        """Send one request and return the decoded ``value`` of its answer (or raise ``AgentCodeError``)."""
        return self.send(**request)()

    def send(self, **request):
        """Send one request; a function that waits for its answer and returns its decoded ``value``.

        One request at a time: call that function before sending the next.
        """
        start = self._iterators.next_number
        self._send(b"G" + self._dump(request, _request_call(request), lambda: _request_arguments(request)))
        if self._iterators.next_number == start:
            return self._answer
        return lambda: self._answer(start)

    def call(self, module: str, name: str, args: tuple, kwargs: dict, function: AgentFunction | None = None):
        """``module.name(*args, **kwargs)`` in the agent's process.

        A call whose one argument is a list of frozen items (a game's history) sends only what changed since the
        previous call of the same function: how many leading items are the very same objects, and the new ones.
        The agent's process rebuilds the list and gives the function a fresh copy of it each call.
        """
        number = function._number if function is not None else None
        if number is None:
            number = self._functions.get((module, name))
        if number is None:
            if len(self._functions) >= MAX_FUNCTIONS:
                return self.ask(op="call", module=module, name=name, args=args, kwargs=kwargs)
            number = len(self._functions)
            self.ask(op="bind", module=module, name=name, number=number)
            self._functions[module, name] = number
        if function is not None:
            function._number = number  # its later calls skip the lookup
        start = self._iterators.next_number
        frame = None
        if not kwargs and len(args) == 1 and type(args[0]) is list:
            frame = self._delta(number, args[0])
        if frame is None:
            self._lists.pop(number, None)
            frame = CALL.pack(b"C", number, -1) + self._dump(
                (args, kwargs), f"{module}.{name}", lambda: _labelled(args, kwargs))
        try:
            self._link.send(frame)
            data = self._link.receive(MAX_LINE)
            if data[:1] == b"n":
                data = self._give_items(data)
        except (PeerGone, OSError, ValueError, Malformed) as exc:
            self._lost(exc)
        if self._iterators.next_number != start:
            return self._settle(data, start)
        if data[:1] == b"I" and len(data) == 9:
            return INT.unpack_from(data, 1)[0]  # the common answer, a move: unpack_answer's first case, inline
        try:
            return unpack_answer(data)
        except AgentCodeError:
            self.failed = True
            raise

    def _dump(self, value, where: str, arguments) -> bytes:
        """``dump_request(value)``, its iterators entered for the call ``where``; when part of it cannot cross, an
        ``UncarriableValue`` naming the call and the first of ``arguments()`` (label, value) that cannot."""
        start = self._iterators.next_number
        try:
            data = dump_request(value, self._iterators, where)
        except Exception as exc:  # noqa: BLE001 - pickle raises TypeError, PicklingError, AttributeError, ...
            self._iterators.end(start)
            raise refusal(where, arguments(), exc) from None
        if len(data) >= MAX_REQUEST:
            self._iterators.end(start)
            raise UncarriableValue(f"the arguments of {where} take {len(data)} bytes, more than the agent's process "
                                   f"accepts ({MAX_REQUEST}); pass less, or an iterator of the parts")
        return data

    def _give_items(self, data: bytes) -> bytes:
        """Answer the agent's process's requests for items of the evaluator's iterators (``NEXT``, starting with
        ``data``) until it sends something else: the answer of the call under way."""
        while data[:1] == b"n":
            if len(data) != NEXT.size:
                raise Malformed(f"a request for an item of {len(data)} bytes")
            self._link.send(self._item(NEXT.unpack(data)[1]))
            data = self._link.receive(MAX_LINE)
        return data

    def _item(self, number: int) -> bytes:
        """The reply to the agent's process's request for the next item of iterator ``number``. What the evaluator's
        iterator raises goes to the agent's code, as it would pass through it in one process (``_settle``)."""
        iterators = self._iterators
        entry = iterators.live.get(number)
        if entry is None:
            return b"x"
        iterator, label, given = entry
        try:
            item = next(iterator)  # the evaluator's own code, which may call the agent's in turn
        except StopIteration:
            return b"s"
        except BaseException as exc:  # noqa: BLE001 - whatever it raised, the agent's code is waiting for the item
            iterators.note(number, exc, False)
            return b"r" + exception_payload(exc)
        entry[2] = given + 1
        where = f"item {given + 1} of {label}"
        try:
            reply = b"i" + self._dump(item, where, lambda: [("the item", item)])
        except UncarriableValue as exc:
            iterators.note(number, exc, True)
            return b"r" + exception_payload(exc)
        return reply

    def _settle(self, data: bytes, start: int):
        """The value of the answer ``data`` to a call whose iterators are numbered from ``start``, which end with it.

        An exception the evaluator's iterator raised in the agent's code is raised again when the agent's code
        answered with it (it did not handle it), as it would have passed through that code in one process; one
        saying an item could not cross is raised whatever the agent's code made of it."""
        raised = self._iterators.end(start)
        for exc, always in raised:
            if always:
                raise exc
        try:
            return unpack_answer(data)
        except AgentCodeError as error:
            text = str(error).rstrip()
            for exc, _ in reversed(raised):
                line = exception_line(payload_exception(exception_payload(exc)))
                if text == line or text.endswith("\n" + line):
                    raise exc from None
            self.failed = True
            raise

    def _delta(self, number: int, items: list) -> bytes | None:
        """The frame of a call on the list ``items``, sent as a change to the previous one; None when an item is
        not frozen (then the whole argument is sent)."""
        held = self._lists.get(number)
        keep = 0
        if held is not None:
            limit = min(len(held), len(items))
            while keep < limit and items[keep] is held[keep]:
                keep += 1
        tail = items[keep:]
        for item in tail:
            if type(item) not in _ATOMS and not frozen(item):
                return None
        if held is None:
            self._lists[number] = held = []
        del held[keep:]
        held += tail
        return CALL.pack(b"C", number, keep) + dump_request(tail)

    def _lost(self, exc: BaseException):
        """Raise the ``AgentCodeError`` for a link that failed with ``exc``."""
        self.failed = True
        if isinstance(exc, Malformed):
            raise AgentCodeError("the agent's code answered with something that is not a value") from None
        raise AgentCodeError(f"the process running the agent's code is gone ({exc or 'it ended'})") from None

    def _send(self, frame: bytes) -> None:
        try:
            self._link.send(frame)
        except (PeerGone, OSError, ValueError) as exc:
            self.failed = True
            raise AgentCodeError(f"the process running the agent's code is gone ({exc or 'it ended'})") from None

    def _answer(self, start: int | None = None):
        try:
            try:
                data = self._link.receive(MAX_LINE)
                if data[:1] == b"n":
                    data = self._give_items(data)
            except (PeerGone, OSError):
                raise AgentCodeError("the process running the agent's code ended (it exited or was killed)") from None
            except Malformed:
                raise AgentCodeError("the agent's code answered with something that is not a value") from None
            if start is not None:
                return self._settle(data, start)
            return unpack_answer(data)
        except AgentCodeError:
            self.failed = True
            raise


ADVICE = ("Pass plain data instead (numbers, strings, bytes, lists, tuples, dicts, sets, numpy values, objects of "
          "classes a module other than the evaluation script defines), or an iterator: it crosses as an iterator whose "
          "items the agent's code fetches as it goes")


def refusal(where: str, arguments: list, error: BaseException) -> UncarriableValue:
    """The ``UncarriableValue`` for a call ``where`` whose arguments could not cross with ``error``: it names the first
    of ``arguments`` (label, value) that cannot cross on its own, its type, why, and what to pass instead."""
    for label, value in arguments:
        try:
            dump_request(value, Iterators(), where)
        except Exception as exc:  # noqa: BLE001 - the culprit, with its own reason
            return UncarriableValue(f"{where}: {label} (a {type(value).__name__}) cannot be sent to the agent's "
                                    f"process, which runs the agent's code: {_reason(exc)}. {ADVICE}.")
    return UncarriableValue(f"{where}: its arguments cannot be sent to the agent's process, which runs the agent's "
                            f"code: {_reason(error)}. {ADVICE}.")


def _reason(exc: BaseException) -> str:
    try:
        return f"{exc}" if isinstance(exc, UncarriableValue) else f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose str() raises
        return type(exc).__name__


def _labelled(args: tuple, kwargs: dict) -> list:
    """A call's arguments as (label, value): ``positional argument 1``..., ``keyword argument 'x'``."""
    return [*((f"positional argument {index + 1}", value) for index, value in enumerate(args)),
            *((f"keyword argument {key!r}", value) for key, value in kwargs.items())]


def _request_call(request: dict) -> str:
    """What a ``b"G"`` request calls, as messages name it (``strategy.row_strategy``, ``...map``)."""
    name = f"{request.get('module')}.{request.get('name')}"
    return f"{name}.map" if request.get("op") == "map" else name


def _request_arguments(request: dict) -> list:
    """The arguments of a ``b"G"`` request as (label, value), for ``refusal``."""
    if request.get("op") == "map":
        return [(f"call {index + 1}, {label}", value) for index, call in enumerate(request.get("calls") or [])
                for label, value in _labelled(tuple(call), {})]
    return _labelled(tuple(request.get("args") or ()), dict(request.get("kwargs") or {}))


class AgentFunction:
    """A function of the agent's, called in the agent's process. ``map`` calls it on many argument tuples at once."""

    def __init__(self, channel: AgentChannel, module: str, name: str):
        self._channel, self._module, self.__name__ = channel, module, name
        self.__qualname__ = name
        self._number: int | None = None  # the number the agent's process knows it by, once bound

    def __call__(self, *args, **kwargs):
        return self._channel.call(self._module, self.__name__, args, kwargs, self)

    def map(self, calls):
        """``[self(*args) for args in calls]`` in one round trip."""
        return self.map_later(calls)()

    def map_later(self, calls):
        """Start ``map(calls)`` in the agent's process; a function that waits for its results. The evaluator may
        compute meanwhile, but must collect the results before it asks the agent's code anything else."""
        calls = list(calls)
        wait = self._channel.send(op="map", module=self._module, name=self.__name__, calls=calls)

        def results():
            values = wait()
            if not isinstance(values, list) or len(values) != len(calls):
                self._channel.failed = True
                raise AgentCodeError(f"{self.__name__}.map answered with the wrong number of results")
            return values

        return results

    def __reduce__(self):
        # passed to the agent's code (or copied): it is the agent's own function there
        return getattr, (_ModuleByName(self._module), self.__name__)

    def __repr__(self) -> str:
        return f"<agent function {self._module}.{self.__name__}>"


class _ModuleByName:
    """A module, pickled as its name: the process that loads the pickle imports its own module of that name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return importlib.import_module, (self.name,)


class AgentModule(types.ModuleType):
    """A module of the agent's: attribute reads fetch values or function proxies from the agent's process."""

    def __init__(self, name: str, channel: AgentChannel):
        super().__init__(name)
        self.__dict__["_channel"] = channel

    def __reduce__(self):
        # passed to the agent's code (or copied): it is the agent's own module there
        return importlib.import_module, (self.__name__,)

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        kind = self._channel.ask(op="describe", module=self.__name__, name=attribute)
        if kind == "missing":
            raise AttributeError(f"the agent's module {self.__name__!r} has no attribute {attribute!r}")
        if kind == "callable":
            return AgentFunction(self._channel, self.__name__, attribute)
        if kind == "module":
            return importlib.import_module(f"{self.__name__}.{attribute}")
        return self._channel.ask(op="get", module=self.__name__, name=attribute)


class _AgentLoader:
    """Makes the modules of the agent's (``AgentModule``): their code runs in the other process."""

    def __init__(self, channel: AgentChannel):
        self.channel = channel

    def create_module(self, spec):
        module = AgentModule(spec.name, self.channel)
        module.__path__ = []  # a package as far as the import system cares: submodules are the agent's too
        return module

    def exec_module(self, module):
        self.channel.ask(op="import", module=module.__name__)


class PristineLoader(importlib.machinery.SourceFileLoader):
    """Loads a pristine evaluation file from its source, never from a bytecode cache beside it: the ``__pycache__``
    of the workspace is the agent's, which could hold a ``.pyc`` whose header matches the pristine file."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class EvaluationFinder:
    """Decides, for every import of the evaluator, between the pristine file, the agent's process and the system."""

    def __init__(self, workspace: str, trusted: list[str], channel: AgentChannel | None, system_path: list[str]):
        self.workspace, self.channel, self.system_path = workspace, channel, system_path
        self.trusted = {_module_name(path): path for path in trusted}

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in self.trusted:
            if fullname != top:
                return None  # a submodule of a trusted package: its own __path__ points into the pristine copy
            return self._trusted_spec(top, self.trusted[top])
        if not self._in_workspace(top):
            return None
        system = importlib.machinery.PathFinder.find_spec(top, self.system_path)
        if system is not None:
            # the workspace shadows a real module: always the real one, whatever sys.path the evaluator built
            return importlib.machinery.PathFinder.find_spec(fullname, self.system_path if fullname == top else path)
        if self.channel is None:  # this task's evaluator loads the agent's code itself (models cross as objects)
            return importlib.machinery.PathFinder.find_spec(fullname, [self.workspace] if fullname == top else path)
        return importlib.machinery.ModuleSpec(fullname, _AgentLoader(self.channel), is_package=True)

    def _trusted_spec(self, name: str, relative: str):
        """The pristine file itself: never a package or bytecode of the same name that the agent put beside it."""
        path = os.path.join(self.workspace, relative)
        if relative.endswith(".py"):
            return _bootstrap_external.spec_from_file_location(name, path, loader=PristineLoader(name, path))
        init = os.path.join(path, "__init__.py")
        return _bootstrap_external.spec_from_file_location(
            name, init, loader=PristineLoader(name, init), submodule_search_locations=[path]
        )

    def _in_workspace(self, name: str) -> bool:
        """Whether the workspace defines an importable ``name`` in any form (source, bytecode, extension, package)."""
        return importlib.machinery.PathFinder.find_spec(name, [self.workspace]) is not None


def _module_name(relative: str) -> str:
    return relative[:-3] if relative.endswith(".py") else relative.rstrip("/")


def evaluate(workspace: str, trusted: list[str], fds: str, argv: list[str], status_fd: int | None = None,
             trace: bool = False) -> None:
    """Run the evaluation script ``argv[0]`` as ``__main__`` with the import rules of ``EvaluationFinder``.

    When ``status_fd`` is given, one JSON line is written to it as the script ends, saying how (see ``run_status``):
    the backend tells the agent's failures from the infrastructure's by it, never by the script's output. With
    ``trace``, that line also holds what the process trusted (``InputTrace``).
    """
    opened = InputTrace() if trace else None
    if opened is not None:
        sys.addaudithook(opened)
    channel = None
    if fds.strip(","):
        memory_fd, wake_fd, ring_fd = (int(x) for x in fds.split(","))
        channel = AgentChannel(memory_fd, wake_fd, ring_fd)
    system_path = [p for p in sys.path if p and os.path.abspath(p) != os.path.abspath(workspace)]
    # byte code: the pristine files load from source (PristineLoader), everything else from the system folders,
    # whose caches the interpreter reads as usual (a private cache folder would compile numpy and the like anew at
    # every evaluation); the script itself runs from source, as ``python script.py`` does
    sys.meta_path.insert(0, EvaluationFinder(workspace, trusted, channel, system_path))
    seed_global_randomness(os.environ.get(EVALUATION_SEED_VARIABLE))
    if opened is not None:
        opened.follow_randomness(workspace)
    sys.argv = list(argv)
    status = os.fdopen(status_fd, "w", encoding="utf-8") if status_fd is not None else None
    import runpy  # here, not at the top: the agent's process has no use for it

    try:
        runpy.run_path(argv[0], run_name="__main__")
    except BaseException as exc:
        _report(status, {**run_status(exc, channel), **({} if opened is None else {"trace": opened.report()})})
        raise
    traced = {} if opened is None else {"trace": opened.report()}
    _report(status, {"status": "finished", "modules": system_modules(workspace, trusted), **traced})


class InputTrace:
    """An audit hook (``sys.addaudithook``) that keeps what the evaluator's process trusted: the paths it opens or
    lists (``opened``), the strings it runs as code (``evaluated``: ``eval`` and ``exec`` of a string), the commands
    it starts (``spawned``) and the classes it unpickles (``unpickled``), in order and once each, at most ``MAX`` of
    each; with ``follow_randomness``, also where its randomness comes from (``randomness``). For the checks that an
    evaluation reads only the task's files and the declared submission and runs nothing of the submission's
    (``mlgym-registry check --integrity``, the tests)."""

    MAX = 5_000
    TEXT = 400
    """The most characters of one compiled source or command kept."""
    OPENED = frozenset({"open", "os.listdir", "os.scandir", "glob.glob", "os.chdir"})
    SPAWNED = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"})

    def __init__(self):
        self._kept: dict[str, dict[str, None]] = {"opened": {}, "evaluated": {}, "spawned": {}, "unpickled": {}}
        self._randomness = None
        # the interpreter's own folders (the standard library, site-packages), read-only to every sandbox: left out
        # so that the report stays small
        self._system = tuple(sorted({os.path.join(os.path.abspath(p), "") for p in
                                     (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(__file__))}))

    def __call__(self, event: str, args: tuple) -> None:
        if not args:
            return
        if event in self.OPENED:
            path = os.fsdecode(args[0]) if isinstance(args[0], bytes) else args[0]
            if isinstance(path, str):
                path = os.path.abspath(path)
                if not path.startswith(self._system):
                    self._keep("opened", path)
        elif event == "compile" and len(args) > 1 and args[1] == "<string>":  # eval or exec of a string
            source = args[0]
            if isinstance(source, bytes):
                source = source.decode("utf-8", "replace")
            if isinstance(source, str):
                self._keep("evaluated", source[:self.TEXT])
        elif event in self.SPAWNED:
            self._keep("spawned", " ".join(map(str, args[:2]))[:self.TEXT])
        elif event == "pickle.find_class" and len(args) > 1:
            self._keep("unpickled", f"{args[0]}.{args[1]}")

    def _keep(self, kind: str, value: str) -> None:
        kept = self._kept[kind]
        if len(kept) < self.MAX:
            kept.setdefault(value, None)

    def follow_randomness(self, workspace: str) -> None:
        """Also keep where the evaluation's randomness comes from (``randomness_trace``), once the harness has
        seeded the global generators: its seeds, its draws of fresh entropy, the seeded generators it used."""
        # beside this file, loaded by its path (``-I``: this file's folder is not on sys.path), by traced ones only
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "randomness_trace.py")
        spec = _bootstrap_external.spec_from_file_location("_mlgym_randomness_trace", path)
        module = types.ModuleType(spec.name)
        module.__file__ = path
        spec.loader.exec_module(module)
        self._randomness = module.RandomnessTrace(workspace)
        self._randomness.install(AfterImport)

    def report(self) -> dict[str, list[str]]:
        """What was kept, by kind (``randomness`` too, once ``follow_randomness`` was called)."""
        kept = {kind: list(values) for kind, values in self._kept.items()}
        if self._randomness is not None:
            kept["randomness"] = self._randomness.report()
        return kept


EVALUATION_SEED_VARIABLE = "MLGYM_REGISTRY_EVAL_SEED"
"""The evaluator's seed, set in its process only (``mlgym_registry.seeding.EVALUATION_SEED_VARIABLE``: this module
imports nothing of the package's)."""


def seed_global_randomness(seed: str | None) -> None:
    """Seed the global generators an evaluation script may draw from without reading the seed itself (``random``,
    numpy's legacy one, at its import or now), so that every evaluator's randomness follows the evaluation seed:
    unpredictable to the agent, the same for the same seed. MLGym's game evaluators draw from ``random`` unseeded."""
    if seed is None or not seed.lstrip("-").isdigit():
        return
    value = int(seed) % 2**32
    import random

    random.seed(value)
    if "numpy" in sys.modules:  # preloaded
        _seed_numpy(sys.modules["numpy"], value)
    else:
        sys.meta_path.insert(0, AfterImport("numpy", lambda numpy: _seed_numpy(numpy, value)))


def _seed_numpy(numpy, value: int) -> None:
    try:
        numpy.random.seed(value)
    except Exception:  # noqa: BLE001 - a numpy without its legacy generator: nothing to seed
        pass


class AfterImport:
    """Calls ``then(module)`` once the module ``name`` has been imported (a finder that wraps its own loader): for
    what must happen to a module as soon as the evaluation imports it (numpy's seeding, the randomness trace)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:  # the others decide, the evaluation's own rules first
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            then(module)

        spec.loader.exec_module = exec_module
        return spec


STARTUP_MODULES = frozenset(sys.modules)


def system_modules(workspace: str, trusted: list[str]) -> list[str]:
    """The top-level modules of the system folders (not the workspace's, not the agent's) imported since this
    process started, at most 64: the backend has the next evaluation of the task preload them."""
    skip = {_module_name(path) for path in trusted} | {"__main__"}
    names = set()
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        if name != top or top in STARTUP_MODULES or top in skip or top.startswith("_"):
            continue
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if isinstance(module, AgentModule) or origin.startswith(workspace):
            continue
        names.add(top)
    return sorted(names)[:64]


def run_status(exc: BaseException, channel: AgentChannel | None) -> dict:
    """How an evaluation script that raised ``exc`` ended.

    ``finished`` (it exited with status 0), ``agent_code`` (the agent's code raised, died or answered with no value,
    whatever the script made of it), ``missing_module`` (an import the agent's process was not asked for failed:
    ``name`` says which; the backend decides whether it was the agent's to provide) or ``failed`` (the script itself
    raised or exited non-zero: for a task that scores a file, the file was not what it expects).
    """
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return {"status": "finished"}
    if isinstance(exc, AgentCodeError) or (channel is not None and channel.failed):
        return {"status": "agent_code"}
    if isinstance(exc, ModuleNotFoundError):
        return {"status": "missing_module", "name": (exc.name or "").partition(".")[0]}
    return {"status": "failed"}


def _report(status, data: dict) -> None:
    if status is None:
        return
    try:
        status.write(json.dumps(data) + "\n")
        status.flush()
    except (OSError, ValueError):
        pass


# -- agent side ---------------------------------------------------------------------------------------------------
def serve(workspace: str, memory_fd: int, seed: int | None = None) -> None:
    """Answer the evaluator's requests about the agent's modules until the evaluator is gone.

    The link is the shared memory ``memory_fd``, with this process's doorbell on stdin and the evaluator's on stdout.
    ``seed`` (the episode's agent seed, derived apart from the evaluator's) seeds ``random``, and numpy once the
    agent's code imported it, so a stochastic strategy is reproducible; this process never learns the evaluator's.
    """
    global _AGENT_WORKSPACE, _AGENT_LINK, _AGENT_SEED
    _AGENT_WORKSPACE = os.path.abspath(workspace)
    link = _AGENT_LINK = Link(memory_fd, os.dup(0), os.dup(1), evaluator=False)
    _AGENT_SEED = seed
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # what the agent's code prints goes nowhere: only answers cross
    sys.path.insert(0, workspace)
    if seed is not None:
        import random

        random.seed(seed)
    functions, lists = _AGENT_FUNCTIONS, _AGENT_LISTS
    while True:
        try:
            frame = link.receive(MAX_REQUEST)
            if frame[:1] == b"C":
                answer = _call(frame, functions, lists)
            else:
                answer = _request_answer(frame, seed, functions)
            link.send(answer)
        except PeerGone:
            return


_AGENT_LINK: Link | None = None
"""The agent's process's end of the link (``serve``), which an ``EvaluatorIterator`` asks for items through."""
_AGENT_SEED: int | None = None
_AGENT_FUNCTIONS: dict[int, tuple[types.ModuleType, str]] = {}
"""The agent's functions the evaluator bound, by number."""
_AGENT_LISTS: dict[int, list] = {}
"""Per bound function: its list argument as the evaluator last sent it (see ``AgentChannel.call``)."""


def _handle(frame: bytes) -> bytes:
    """The answer to one request (what ``serve``'s loop does with it), for requests that come while the agent's code
    waits for an item of the evaluator's iterator, which the evaluator's code computes by calling the agent's."""
    if frame[:1] == b"C":
        return _call(frame, _AGENT_FUNCTIONS, _AGENT_LISTS)
    return _request_answer(frame, _AGENT_SEED, _AGENT_FUNCTIONS)


def _request_answer(frame: bytes, seed: int | None, functions: dict) -> bytes:
    """The answer to a ``b"G"`` request."""
    try:
        request = load_request(memoryview(frame)[1:])
    except BaseException as exc:  # noqa: BLE001 - unpickling imports modules of the agent's, which may raise anything
        return _failure(exc)
    return _pack_answer(_answer(request, seed, functions))


def _call(frame: bytes, functions: dict, lists: dict) -> bytes:
    """The answer to a ``b"C"`` frame (see ``AgentChannel.call``)."""
    try:
        _, number, keep = CALL.unpack_from(frame)
        payload = load_request(memoryview(frame)[CALL.size:])
        module, name = functions[number]
        if keep < 0:
            lists.pop(number, None)
            args, kwargs = payload
        else:
            held = lists.setdefault(number, [])
            if keep > len(held):
                raise ValueError("the evaluator's list and this process's copy differ")
            del held[keep:]
            held += payload
            args, kwargs = (held.copy(),), {}
        function = getattr(module, name)
        result = function(*args, **kwargs)
        return pack_value(result)
    except BaseException as exc:  # noqa: BLE001 - the agent's code may raise anything, SystemExit included
        return _failure(exc)


_AGENT_WORKSPACE = ""
"""The agent's workspace as this (``serve``) process sees it: the frames of files in it are the agent's own."""


def agent_error_text(exc: BaseException) -> str:
    """``exc`` as the agent should see it: the traceback of its own frames (files in its workspace), none of the
    harness's, then ``Type: message``; just ``Type: message`` when no frame is the agent's."""
    import traceback  # only when the agent's code failed

    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if _AGENT_WORKSPACE and not frame.filename.startswith("<")  # "<frozen importlib._bootstrap>"
              and os.path.abspath(frame.filename).startswith(_AGENT_WORKSPACE + os.sep)]
    head = ["Traceback (most recent call last):\n", *traceback.format_list(frames)] if frames else []
    return "".join(head + traceback.format_exception_only(type(exc), exc)).rstrip()


def _failure(exc: BaseException) -> bytes:
    try:
        return pack_error(agent_error_text(exc))
    except BaseException as inner:  # noqa: BLE001 - an exception whose str() raises
        return pack_error(f"{type(exc).__name__} (unprintable: {type(inner).__name__})")


def _pack_answer(answer: dict) -> bytes:
    if "error" in answer:
        return pack_error(str(answer["error"]))
    try:
        return pack_value(answer.get("value"))
    except BaseException as exc:  # noqa: BLE001 - a value that cannot cross, or whose conversion raised
        return _failure(exc)


def _answer(request: dict, seed: int | None, functions: dict | None = None) -> dict:
    try:
        op, module_name = request["op"], request["module"]
        if op == "import":
            importlib.import_module(module_name)
            numpy = sys.modules.get("numpy")
            if numpy is not None and seed is not None:
                numpy.random.seed(seed % 2**32)
            return {"value": None}
        module = importlib.import_module(module_name)
        name = request["name"]
        if op == "bind" and functions is not None:
            functions[request["number"]] = (module, name)
            return {"value": None}
        if op == "describe":
            if not hasattr(module, name):
                return {"value": "missing"}
            value = getattr(module, name)
            kind = "module" if isinstance(value, types.ModuleType) else "callable" if callable(value) else "value"
            return {"value": kind}
        function = getattr(module, name)
        if op == "get":
            return {"value": function}
        if op == "call":
            return {"value": function(*request["args"], **request["kwargs"])}
        if op == "map":
            return {"value": [function(*args) for args in request["calls"]]}
        return {"error": f"unknown request {op!r}"}
    except BaseException as exc:  # noqa: BLE001 - the agent's code may raise anything, SystemExit included
        try:
            return {"error": agent_error_text(exc)}
        except BaseException as inner:  # noqa: BLE001 - an exception whose str() raises
            return {"error": f"{type(exc).__name__} (unprintable: {type(inner).__name__})"}


def wait_for_go(fd: int) -> dict | None:
    """Block until the backend's go arrives on ``fd`` (one line: JSON for the evaluator); None when the backend closed
    the pipe without one (the started evaluation was not needed)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        data += chunk
    os.close(fd)
    try:
        message = json.loads(data)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def preload(names: list[str]) -> None:
    """Import the system modules ``names`` (what the previous evaluation of the task imported) before the
    workspace is there: its view is still empty, so nothing of the agent's can stand in for them."""
    for name in names:
        if name.isidentifier():
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a module that fails now fails again, visibly, when the script imports it
                sys.modules.pop(name, None)


def main(argv: list[str]) -> None:
    """Command line: see the module's docstring."""
    role, rest = argv[0], argv[1:]
    options = {}
    while rest and rest[0] != "--":
        options[rest[0].lstrip("-")] = rest[1]
        rest = rest[2:]
    go_fd = int(options["go-fd"]) if options.get("go-fd", "").isdigit() else None
    if role == "serve":
        if go_fd is not None and wait_for_go(go_fd) is None:
            return
        seed = int(options["seed"]) if options.get("seed", "").isdigit() else None
        serve(options["workspace"], int(options["memory-fd"]), seed)
        return
    trusted = [n for n in options.get("trusted", "").split(",") if n]
    trace = False
    status_fd = int(options["status-fd"]) if options.get("status-fd", "").isdigit() else None
    script = rest[1:]
    if go_fd is not None:
        preload([n for n in options.get("preload", "").split(",") if n])
        message = wait_for_go(go_fd)
        if message is None:
            return
        script = [str(a) for a in message.get("argv", [])]
        trusted = [str(t) for t in message.get("trusted", [])]
        trace = message.get("trace") is True
    evaluate(options["workspace"], trusted, options.get("fds", ""), script, status_fd, trace)


if __name__ == "__main__":
    main(sys.argv[1:])
