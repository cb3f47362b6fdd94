"""What an env's output costs to cross a process pool's queue: the messages the other side lacks, not the whole
conversation.

TorchRL's ``AsyncEnvPool(backend="multiprocessing")`` pickles every tensordict it moves between its worker processes
and the trainer: the env's output on the way up, and that same tensordict (with the policy's reply in it) on the way
down. A conversation is one small tensordict per message, so pickling it whole costs more the longer the episode (a
turn through the pool went from 18 to 100 ms over 90 turns while the env stepped in 3 ms at every length).

Both ends of the queue keep, per env, the last few message lists they exchanged (``Wire``): messages are written once
and never changed in place (``history.MessageStack``), so the sender finds the longest run of leading messages that the
receiver already holds (by identity, ``common_prefix``) and sends only where that run starts and what follows it; the
receiver builds the same stack from its own copies. Long strings cross the same way: the prompt a chat template renders
(``text.prompt``) is the whole conversation again, one turn longer than the last, so each end also keeps the last few
long strings exchanged, and a long string crosses as which of them it starts like, for how many characters, and the
rest. Both ends update their lists in the same order (a queue delivers
in order, and each env's requests and replies alternate), and each payload carries the count of updates it expects
the receiver to have made, so an end that went out of step fails loudly instead of building a wrong conversation.

Only what a pool's own queue carries between an env's worker and the trainer is encoded so (``may_encode``): in the
worker, an output of an env that lives there, put on a queue; in the trainer, an output put on the input queue of the
pool worker that hosts its env. A ``copy.deepcopy``, a ``torch.save``, a user's own ``pickle.dumps`` or a queue of the
user's carries a plain, self-contained pickle and leaves the lists alone.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

from ...transforms.history import MessageStack, common_prefix

RECENT_LISTS = 4
"""Message lists remembered per env: one output holds several histories (before the step, after it, the reset's)."""

LONG_TEXT = 2048
"""Characters from which a string outside a conversation stack crosses as what the other end lacks of it."""

RECENT_TEXTS = 12
"""Long strings remembered per env: an exchange holds several (the prompt before the step and after it, in both
outputs, and any long observation beside them), and the prompt must still be there at the next exchange."""

MIN_SHARED_TEXT = 256
"""Leading characters two strings must share for one to cross as a reference to the other."""

MAX_ENVS = 4096
"""Envs whose lists a process keeps; the least recently used are forgotten (a pool gone). An env that was closed keeps
its lists: TorchRL may reset it again, and its worker and the trainer must still agree on what crossed."""

_FEEDER_THREAD = "QueueFeederThread"
"""The name ``multiprocessing.queues.Queue`` gives the thread that pickles what is put on the queue."""


class WireOutOfStep(RuntimeError):
    """The two ends of a pool's queue disagree about what messages an env's conversation already crossed."""


@dataclass
class _Known:
    """What both ends hold of one env's conversations: the last message lists exchanged, and how many updates."""

    lists: deque = field(default_factory=lambda: deque(maxlen=RECENT_LISTS))
    texts: deque = field(default_factory=lambda: deque(maxlen=RECENT_TEXTS))
    updates: int = 0

    def remember(self, messages: list[Any]) -> None:
        self.lists.append(messages)
        self.updates += 1

    def remember_text(self, text: str) -> None:
        self.texts.append(text)
        self.updates += 1


class Wire:
    """One process's end of the pool queues it talks over: per env token, the message lists both ends hold."""

    def __init__(self) -> None:
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._lock = threading.Lock()

    def known(self, token: str) -> _Known:
        """The lists kept for the env ``token`` (made empty on first use; the most recently used are kept)."""
        entry = self._known.get(token)
        if entry is None:
            entry = self._known[token] = _Known()
            if len(self._known) > MAX_ENVS:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(token)
        return entry

    def encode(self, token: str, state: dict[str, Any]) -> bytes:
        """``state`` pickled with each conversation replaced by what the other end lacks of it."""
        with self._lock:
            known = self.known(token)
            buffer = io.BytesIO()
            _Encoder(buffer, known).dump(state)
            return buffer.getvalue()

    def decode(self, token: str, payload: bytes) -> dict[str, Any]:
        """The state ``encode`` pickled, its conversations rebuilt from the messages this end holds."""
        with self._lock:
            return _Decoder(io.BytesIO(payload), self.known(token), token).load()


WIRE = Wire()
"""This process's end (a worker's envs and the trainer's pool each talk through their process's own)."""


_POOLS: weakref.WeakSet = weakref.WeakSet()
"""The multiprocessing pools of this process whose input queues may carry encoded outputs (``watch_pool``)."""


def new_token() -> str:
    """A name for an env living in this process: its process id, then a random part."""
    return f"{os.getpid()}:{uuid.uuid4().hex}"


def watch_pool(pool: Any) -> None:
    """Let ``pool`` (a TorchRL ``AsyncEnvPool`` built here) carry its envs' outputs to their workers encoded."""
    _POOLS.add(pool)


def may_encode(token: str) -> bool:
    """Whether the pickling under way is a pool queue's, carrying an output of env ``token`` between the env's worker
    and the trainer: a queue's feeder thread is pickling it, and either the env lives in this process (its worker)
    or the queue is the input queue of the pool worker it lives in."""
    if threading.current_thread().name != _FEEDER_THREAD:
        return False
    host = int(token.split(":", 1)[0])
    return host == os.getpid() or host == _queue_destination()


def _queue_destination() -> int | None:
    """The process id of the pool worker at the other end of the queue this feeder thread feeds, if that queue is
    one of a watched pool's input queues (a ``multiprocessing`` queue keeps the feeder thread it started:
    ``Queue._thread``)."""
    feeder = threading.current_thread()
    for pool in list(_POOLS):
        for queue, worker in zip(getattr(pool, "input_queue", ()), getattr(pool, "threads", ()), strict=False):
            if getattr(queue, "_thread", None) is feeder:
                return worker.pid
    return None


class _TensorPickler(pickle.Pickler):
    """A pickler that writes plain CPU tensors as their raw bytes (``_tensor_bytes``)."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)

    def persistent_id(self, obj: Any) -> Any:
        return _tensor_bytes(obj) if type(obj) is torch.Tensor else None


class _Encoder(_TensorPickler):
    """A pickler that writes each conversation stack as (which list, how many of its messages, the rest) and each
    long string as (which string, how many of its characters, the rest).

    Pickle asks ``persistent_id`` about what a persistent id holds too, after the id was made: what an id carries is
    therefore bytes (pickled apart, or encoded), so that the strings and stacks both ends remember are the same ones,
    in the same order, on each side."""

    def __init__(self, file: io.BytesIO, known: _Known):
        super().__init__(file)
        self._known = known

    def persistent_id(self, obj: Any) -> Any:
        # called for every object pickled (hundreds an output): the exact type decides, no isinstance (tensordict's
        # classes are ABCs, whose checks cost several times a plain comparison)
        kind = type(obj)
        if kind is str:
            return _encoded_text(self._known, obj) if len(obj) >= LONG_TEXT else None
        if kind is torch.Tensor:
            return _tensor_bytes(obj)
        if kind is MessageStack:
            return _encoded(self._known, obj, obj.tensordicts)
        return None


_RAW_DTYPES = {dtype: str(dtype).removeprefix("torch.") for dtype in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
    torch.float64)}
"""The dtypes a tensor crosses as its raw bytes in (numpy reads them back under the same name)."""


def _tensor_bytes(tensor: torch.Tensor) -> tuple | None:
    """A plain CPU tensor as (its dtype, shape, raw bytes): torch's own pickling saves each storage as a small file,
    which cost a dozen of those (about 0.1 ms each) for every output's done flags and rewards; else None."""
    name = _RAW_DTYPES.get(tensor.dtype)
    if name is None or tensor.device.type != "cpu" or tensor.requires_grad:
        return None
    return ("tensor", name, tuple(tensor.shape), tensor.contiguous().numpy().tobytes())


def _best_reference(remembered: deque, value: Any, shared_start: Callable[[Any, Any], int]) -> tuple[int, int]:
    """Which of the ``remembered`` lists or strings shares the longest start with ``value`` (``shared_start``), and
    how long it is: (-1, 0) when none does. The longest are tried first, and one shared whole ends the search (no
    shorter one can share more), so a turn costs one pass over the conversation, not one per item remembered."""
    best, shared = -1, 0
    for index in sorted(range(len(remembered)), key=lambda each: len(remembered[each]), reverse=True):
        earlier = remembered[index]
        if len(earlier) <= shared or shared == len(value):
            break
        count = shared_start(earlier, value)
        if count > shared:
            best, shared = index, count
    return best, shared


def _encoded(known: _Known, stack: MessageStack, messages: list[Any]) -> tuple:
    """``stack`` as (which of ``known``'s lists, how many of its leading messages, the messages after them), the
    update count the receiver must have reached, and the stack's shape; ``known`` remembers its messages."""
    best, shared = _best_reference(known.lists, messages, common_prefix)
    expected = known.updates
    known.remember(list(messages))
    shape = (stack.stack_dim, tuple(stack.batch_size), stack._message_keys, stack._td_dim_name)
    return ("conversation", expected, best, shared, _plain_bytes(list(messages[shared:])), shape)


def _encoded_text(known: _Known, text: str) -> tuple:
    """``text`` as (which of ``known``'s strings it starts like, for how many characters, the rest as UTF-8) and the
    update count the receiver must have reached; ``known`` remembers it."""
    best, shared = _best_reference(known.texts, text, common_text_prefix)
    expected = known.updates
    known.remember_text(text)
    return ("text", expected, best, shared, text[shared:].encode("utf-8", "surrogatepass"))


def common_text_prefix(a: str, b: str) -> int:
    """How many leading characters the strings ``a`` and ``b`` share, compared at C speed (a bisection over
    ``startswith``: the usual case, one a prefix of the other, costs one comparison); 0 when they share fewer than
    ``MIN_SHARED_TEXT``."""
    if b.startswith(a):
        return len(a)
    if a.startswith(b):
        return len(b)
    if not b.startswith(a[:MIN_SHARED_TEXT]):
        return 0  # too little in common to be worth a reference (and no bisection over unrelated strings)
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low], and they differ within a[:high + 1]
    while low < high:
        middle = (low + high + 1) // 2
        if a.startswith(b[low:middle], low):
            low = middle
        else:
            high = middle - 1
    return low


def _plain_bytes(value: Any) -> bytes:
    """``value`` pickled on its own, tensors as raw bytes."""
    buffer = io.BytesIO()
    _TensorPickler(buffer).dump(value)
    return buffer.getvalue()


def _out_of_step(token: str, expected: int, known: _Known) -> WireOutOfStep:
    return WireOutOfStep(
        f"env {token}'s conversation arrived after {expected} exchanges but this process counted "
        f"{known.updates}: a tensordict of one env was sent to another env's worker, or one end "
        "missed a message. Send each env the tensordict the pool returned for it.")


def _decoded(known: _Known, pid: Any, token: str) -> MessageStack:
    """The stack ``_encoded`` described, rebuilt from ``known``'s lists (which then remember its messages)."""
    kind, expected, best, shared, new, shape = pid
    if kind != "conversation" or expected != known.updates:
        raise _out_of_step(token, expected, known)
    if shared and not (0 <= best < len(known.lists) and shared <= len(known.lists[best])):
        raise WireOutOfStep(f"env {token}'s conversation shares {shared} messages with a list this process lacks")
    messages = (known.lists[best][:shared] if shared else []) + _TensorUnpickler(io.BytesIO(new)).load()
    known.remember(list(messages))
    return _stack_of(messages, *shape)


def _decoded_text(known: _Known, pid: tuple, token: str) -> str:
    """The string ``_encoded_text`` described, rebuilt from ``known``'s strings (which then remember it)."""
    _, expected, best, shared, rest = pid
    if expected != known.updates:
        raise _out_of_step(token, expected, known)
    if shared and not (0 <= best < len(known.texts) and shared <= len(known.texts[best])):
        raise WireOutOfStep(f"env {token}'s string shares {shared} characters with a string this process lacks")
    text = rest.decode("utf-8", "surrogatepass")
    if shared:
        text = known.texts[best][:shared] + text
    known.remember_text(text)
    return text


def _tensor_from(pid: tuple) -> torch.Tensor:
    """The tensor ``_tensor_bytes`` described."""
    _, name, shape, raw = pid
    return torch.from_numpy(numpy.frombuffer(bytearray(raw), dtype=name).reshape(shape))


class _TensorUnpickler(pickle.Unpickler):
    """The unpickler of what ``_TensorPickler`` wrote."""

    def persistent_load(self, pid: Any) -> Any:
        return _tensor_from(pid)


class _Decoder(pickle.Unpickler):
    """The unpickler that rebuilds what ``_Encoder`` wrote from this end's own message lists and strings."""

    def __init__(self, file: io.BytesIO, known: _Known, token: str):
        super().__init__(file)
        self._known = known
        self._token = token

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "tensor":
            return _tensor_from(pid)
        if kind == "text":
            return _decoded_text(self._known, pid, self._token)
        return _decoded(self._known, pid, self._token)


def _stack_of(messages: list[Any], stack_dim: int, batch_size: tuple[int, ...], keys: tuple[str, ...] | None,
              dim_name: str | None) -> MessageStack:
    """The conversation stack of ``messages``, as the sender's was (``MessageStack._share``: the messages' keys are
    not read again, so this costs a list, not a pass over the conversation)."""
    stack = MessageStack.__new__(MessageStack)
    stack._is_locked = None
    stack.tensordicts = messages
    stack.stack_dim = stack_dim
    stack._batch_size = torch.Size(batch_size)
    stack.hook_out = None
    stack.hook_in = None
    stack._message_keys = keys
    if dim_name is not None:
        stack._td_dim_name = dim_name
    return stack
