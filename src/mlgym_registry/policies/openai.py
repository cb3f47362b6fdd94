"""A model behind an OpenAI-compatible chat endpoint as the agent: a hosted API, a vLLM or a ``transformers serve``.

``OpenAIPolicy("gpt-4o")`` or ``OpenAIPolicy("/models/qwen", base_url="http://127.0.0.1:8000/v1")`` sends the
conversation to the endpoint's ``/chat/completions`` and returns the answer's text. It needs the ``openai`` package
(``pip install 'mlgym-registry[openai]'``); the key comes from ``OPENAI_API_KEY`` or the variable ``api_key_env``
names (servers that check no key get a placeholder).

- Rate limits (429), timeouts, server errors (5xx) and dropped connections are retried with exponential backoff and
  jitter, or after what a ``Retry-After`` header asks. A refused connection (nothing listens there) is not: it fails
  at once. The client's own retries are off: every attempt goes through
  here and is counted.
- When the server says the conversation does not fit in the model's context, the oldest turns are dropped (the
  system message, the task message and the latest turns stay) and the call is made again; how many turns fit is
  remembered for the rest of the episode. When nothing is left to drop, the response is MLGym's ``exit_context``
  action, and the env autosubmits as MLGym's does.
- Anything else (an unreachable endpoint, a refused key, an unknown model) raises ``PolicyError``, one line naming
  the URL or the model and the fix.
- ``stats()`` is MLGym's ``model_stats`` for the episode: calls, tokens and cost, and the time spent waiting for the
  model; ``last_call()`` what the last answer cost (its ``finish_reason``, seconds and usage).
- With ``cost_limit``, the episode ends with MLGym's ``exit_cost`` (the env autosubmits) once its cost reaches the
  limit, as MLGym's agent does: the answer that crossed it is not used.
- When the episode's parser calls tools natively (``tool_calls``), its tools are sent as ``tools`` (with
  ``tool_choice`` when given), the conversation as structured messages (assistant ``tool_calls``, ``tool`` messages),
  and the answer's ``tool_calls`` come back in their text form (``components.tool_calling``).
"""

from __future__ import annotations

import email.utils
import importlib.util
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..options import InvalidOptionError, is_integer, is_number
from .base import Messages, Policy, PolicyError, fenced

INSTALL_HINT = "pip install 'mlgym-registry[openai]'"

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"

PLACEHOLDER_KEY = "EMPTY"
"""Sent when no key is set: local servers check none, but the client refuses to start without one."""

EXIT_CONTEXT_THOUGHT = "Exit due to context window"
"""The thought MLGym's agent records on the step that ends an episode whose conversation no longer fits."""

EXIT_COST_THOUGHT = "Exit due to cost limit"
"""The thought MLGym's agent records on the step that ends an episode whose cost reached its limit."""

RETRYABLE_STATUS = frozenset({408, 409, 429})
"""Statuses worth another attempt, besides every 5xx."""

CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
"""Error codes (OpenAI's; llama.cpp's error type) that say the conversation does not fit."""

CONTEXT_WORDS = re.compile(
    r"context[ _-]?(length|window|size|limit)|maximum (context|model) length|prompt is too long"
    r"|max_new_tokens`? must be <=",
    re.IGNORECASE,
)
"""How servers word a context overflow in a 400: OpenAI and older vLLM ("maximum context length"), vLLM's engine
("longer than the maximum model length"), llama.cpp ("exceeds the available context size"), Anthropic-compatible
gateways ("prompt is too long"), TGI ("inputs tokens + max_new_tokens must be <= N")."""

MESSAGE_CHARS = 300
"""A server's error message is cut to this many characters in our one-line errors."""


def import_openai() -> Any:
    """The ``openai`` module; ``PolicyError`` saying how to install it when it is missing."""
    try:
        import openai
    except ImportError:
        raise PolicyError(f"the openai policy needs the openai package: {INSTALL_HINT}") from None
    return openai


@dataclass
class ModelStats:
    """MLGym's ``model_stats``: usage of the model in the current episode (``total_cost`` spans every episode this
    policy played), plus how often calls were retried and the conversation trimmed."""

    total_cost: float = 0.0
    task_cost: float = 0.0
    tokens_sent: int = 0
    tokens_received: int = 0
    api_calls: int = 0
    api_retries: int = 0
    context_trims: int = 0
    empty_responses: int = 0
    """Answers whose content was empty or null."""
    missing_usage: int = 0
    """Answers without ``usage``: their tokens and cost are unknown (counted as 0)."""
    model_seconds: float = 0.0
    """Seconds spent waiting for the model: every attempt of every call, and the waits between retries."""
    max_call_seconds: float = 0.0
    """The longest of those calls."""
    truncated_responses: int = 0
    """Answers cut at the token limit (``finish_reason`` ``length``)."""

    def to_dict(self) -> dict[str, Any]:
        """MLGym's keys in its order, then ``instance_cost`` (MLGym's log name for ``task_cost``) and ours."""
        data = asdict(self)
        ours = {key: data.pop(key) for key in ("api_retries", "context_trims", "empty_responses", "missing_usage",
                                                "model_seconds", "max_call_seconds", "truncated_responses")}
        return {**data, "instance_cost": self.task_cost, **ours}


class OpenAIPolicy(Policy):
    """Answers each turn with the chat model ``model`` served at ``base_url`` (default: ``OPENAI_BASE_URL`` or
    OpenAI's API).

    ``temperature``, ``top_p`` and ``max_tokens`` are sent when given (else the server's defaults apply).
    ``timeout`` is each call's limit in seconds; ``max_retries`` how many failed attempts of a call are retried,
    ``backoff`` and ``max_backoff`` the first and the longest wait between them. ``price_in`` and ``price_out`` are
    prices per million tokens sent and received, for the cost in ``stats()`` (0 when not given). ``cost_limit``
    (dollars per episode; it needs a price) ends the episode with ``exit_cost`` once its cost reaches it. With
    ``trim_context=False`` a context overflow ends the episode at once, as in MLGym.

    The object holds only these options until the first call, so it can be rebuilt in a worker process from them.
    """

    name = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str | None = None,
                 temperature: float | None = None, top_p: float | None = None, max_tokens: int | None = None,
                 timeout: float = 300.0, max_retries: int = 5, backoff: float = 1.0, max_backoff: float = 60.0,
                 price_in: float = 0.0, price_out: float = 0.0, cost_limit: float | None = None,
                 trim_context: bool = True, tool_choice: str | None = None):
        if not isinstance(model, str) or not model.strip():
            raise InvalidOptionError("the openai policy needs a model name: --policy openai:MODEL")
        _check("temperature", temperature, lambda v: is_number(v) and v >= 0, "a number >= 0", optional=True)
        _check("top_p", top_p, lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]", optional=True)
        _check("max_tokens", max_tokens, lambda v: is_integer(v) and v >= 1, "an integer >= 1", optional=True)
        _check("timeout", timeout, lambda v: is_number(v) and v > 0, "a number of seconds > 0")
        _check("max_retries", max_retries, lambda v: is_integer(v) and v >= 0, "an integer >= 0")
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff), ("price_in", price_in),
                            ("price_out", price_out)):
            _check(name, value, lambda v: is_number(v) and v >= 0, "a number >= 0")
        _check("cost_limit", cost_limit, lambda v: is_number(v) and v > 0, "a number of dollars > 0", optional=True)
        if cost_limit is not None and not (price_in or price_out):
            raise InvalidOptionError(f"--cost-limit {cost_limit:g} needs the model's prices to count the cost: pass "
                                     f"--price-in and --price-out (USD per million tokens)")
        if base_url is not None and not re.match(r"https?://", str(base_url)):
            raise InvalidOptionError(f"--base-url {base_url!r} must be an http:// or https:// URL, "
                                     f"e.g. http://127.0.0.1:8000/v1")
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise PolicyError(f"--api-key-env {api_key_env}: the environment variable {api_key_env} is not set; "
                              f"export {api_key_env}=<your key>")
        if importlib.util.find_spec("openai") is None:
            raise PolicyError(f"the openai policy needs the openai package: {INSTALL_HINT}")
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.sampling = {key: value for key, value in (("temperature", temperature), ("top_p", top_p),
                                                       ("max_tokens", max_tokens)) if value is not None}
        self.timeout, self.max_retries = float(timeout), max_retries
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.price_in, self.price_out = float(price_in), float(price_out)
        self.cost_limit = None if cost_limit is None else float(cost_limit)
        self.trim_context = trim_context
        self.tool_choice = tool_choice
        self.tools: list[dict[str, Any]] | None = None
        """The JSON-schema tools sent with each call: the episode's parser's, when it calls tools natively."""
        self.usage = ModelStats()
        self._last_call: dict[str, Any] | None = None
        self._keep: int | None = None  # messages after the head that fit the context; None: all of them
        self._client: Any = None
        self._openai: Any = None
        self._random = random.Random()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = state["_openai"] = None  # each process opens its own connection
        return state

    @property
    def url(self) -> str:
        """The endpoint's base URL, as the client resolves it."""
        if self._client is not None:
            return str(self._client.base_url).rstrip("/")
        return (self.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")

    def reset(self, spec: Any = None) -> None:
        """Start an episode: its usage counts from zero (``total_cost`` goes on) and the whole conversation is sent
        again."""
        self.usage = ModelStats(total_cost=self.usage.total_cost)
        self.tools = spec_tools(spec)
        self._keep = None
        self._last_call = None

    def stats(self) -> dict[str, Any]:
        """MLGym's ``model_stats`` of the episode so far."""
        return self.usage.to_dict()

    def last_call(self) -> dict[str, Any] | None:
        """What the last answer was: its ``finish_reason``, ``model_seconds`` (retries included) and ``usage``
        (``prompt_tokens``, ``completion_tokens``; None when the answer had none). None before the first answer, and
        for an answer made up without a call (``exit_context``, ``exit_cost`` once over the limit); the ``exit_cost``
        that replaces the answer crossing the limit keeps that answer's call, which was paid for."""
        return None if self._last_call is None else dict(self._last_call)

    def close(self) -> None:
        """Close the connection."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def respond(self, messages: Messages) -> str:
        """The model's answer to ``messages``, after retries and trimming; ``exit_context`` in a fenced block when
        the conversation cannot be cut to fit."""
        self._last_call = None
        if self._over_cost_limit():
            return fenced(EXIT_COST_THOUGHT, "exit_cost")
        if self._client is None:
            self._connect()
        chat = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in messages]
        head = head_length(chat)
        started = time.monotonic()
        while True:
            sent = self._window(chat, head)
            try:
                completion = self._with_retries(self._create, model=self.model, **self._request(sent),
                                                **self.sampling)
            except self._openai.APIStatusError as exc:
                if not is_context_overflow(exc):
                    self._timed(started)
                    raise self._status_failure(exc, 1) from exc
                if not self._trim(chat, head, len(sent) - head):
                    self._timed(started)
                    return fenced(EXIT_CONTEXT_THOUGHT, "exit_context")
                continue
            except PolicyError:
                self._timed(started)
                raise
            text = self._answer(completion, self._timed(started))
            if self._over_cost_limit():  # as MLGym: the answer that crossed the limit is not used
                return fenced(EXIT_COST_THOUGHT, "exit_cost")
            return text

    def _over_cost_limit(self) -> bool:
        return self.cost_limit is not None and self.usage.task_cost >= self.cost_limit

    def _timed(self, started: float) -> float:
        """Count the seconds since ``started`` as time spent waiting for the model; return them."""
        seconds = time.monotonic() - started
        self.usage.model_seconds += seconds
        self.usage.max_call_seconds = max(self.usage.max_call_seconds, seconds)
        return seconds

    def check_endpoint(self) -> None:
        """Raise ``PolicyError`` now if the endpoint cannot be reached, refuses the key or does not list the model
        (a server without a model list passes)."""
        if self._client is None:
            self._connect()
        try:
            served = [model.id for model in self._with_retries(self._client.models.list)]
        except self._openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise self._status_failure(exc, 1) from exc
            return
        if served and self.model not in served:
            raise self._not_served(served)

    # -- calls -----------------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        openai = import_openai()
        key = os.environ.get(self.api_key_env or DEFAULT_API_KEY_ENV) or PLACEHOLDER_KEY
        self._client = openai.OpenAI(api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0)
        self._openai = openai

    def _create(self, **body: Any) -> Any:
        """``POST /chat/completions`` with ``body`` sent as it is, answered as the SDK's ``ChatCompletion``.

        The SDK's ``chat.completions.create`` first walks every message against its typed parameters (at 200
        messages, 94 ms of CPU a call, more than the env's whole turn, and growing with the conversation); this
        body is plain JSON already (strings, lists and dicts), which that walk would return unchanged."""
        return self._client.post("/chat/completions", body=body, cast_to=self._openai.types.chat.ChatCompletion)

    def _with_retries(self, call: Callable[..., Any], **kwargs: Any) -> Any:
        """``call(**kwargs)``, retried after rate limits, server errors, timeouts and dropped connections.

        ``PolicyError`` once the retries are spent; any other failed status is raised as the client raised it.
        """
        failures = 0
        while True:
            try:
                return call(**kwargs)
            except self._openai.APIStatusError as exc:
                if not (exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500):
                    raise
                if failures >= self.max_retries:
                    raise self._status_failure(exc, failures + 1) from exc
                failed: Exception = exc
            except self._openai.APIConnectionError as exc:  # refused, reset, timed out
                if failures >= self.max_retries or connection_refused(exc):  # nothing listens: retrying is no use
                    raise self._connection_failure(exc, failures + 1) from exc
                failed = exc
            failures += 1
            self._wait(failures, failed)

    def _answer(self, completion: Any, seconds: float = 0.0) -> str:
        """Count a completion's usage and cost, and keep what the call was (``last_call``); return its text."""
        try:
            text = completion.choices[0].message.content if completion.choices else ""
            finish = completion.choices[0].finish_reason if completion.choices else None
            if self.tools and completion.choices:
                text = with_tool_calls(text, completion.choices[0].message)
        except AttributeError:
            raise PolicyError(f"{self.url} answered with something that is not a chat completion "
                              f"({str(completion)[:80]!r}): is --base-url an OpenAI-compatible endpoint?") from None
        usage = getattr(completion, "usage", None)
        sent = int(getattr(usage, "prompt_tokens", 0) or 0)
        received = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = (sent * self.price_in + received * self.price_out) / 1e6
        stats = self.usage
        stats.api_calls += 1
        stats.tokens_sent += sent
        stats.tokens_received += received
        stats.task_cost += cost
        stats.total_cost += cost
        stats.missing_usage += usage is None
        stats.empty_responses += not text
        stats.truncated_responses += finish == "length"
        self._last_call = {
            "finish_reason": finish if finish is None else str(finish),
            "model_seconds": round(seconds, 4),
            "usage": None if usage is None else {"prompt_tokens": sent, "completion_tokens": received},
        }
        return text or ""

    def _request(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The ``messages`` (and, in a tool-calling episode, ``tools`` and ``tool_choice``) of a call."""
        if not self.tools:
            return {"messages": messages}
        from ..components.tool_calling import structured_messages

        request = {"messages": structured_messages(messages, json_arguments=True), "tools": self.tools}
        if self.tool_choice is not None:
            request["tool_choice"] = self.tool_choice
        return request

    def _wait(self, failures: int, exc: Exception) -> None:
        """Sleep before attempt ``failures + 1``: what the server asked, else exponential backoff with jitter."""
        self.usage.api_retries += 1
        delay = retry_after(exc)
        if delay is None:
            ceiling = min(self.max_backoff, self.backoff * 2 ** (failures - 1))
            delay = ceiling * (0.5 + 0.5 * self._random.random())
        time.sleep(min(delay, self.max_backoff))

    # -- context overflow ------------------------------------------------------------------------------------------
    def _window(self, chat: list[dict[str, str]], head: int) -> list[dict[str, str]]:
        """The head and the latest turns that fit (all of them until an overflow was seen)."""
        if self._keep is None or len(chat) - head <= self._keep:
            return chat
        start = len(chat) - self._keep
        while start < len(chat) - 1 and chat[start]["role"] != "assistant":
            start += 1
        return chat[:head] + chat[start:]

    def _trim(self, chat: list[dict[str, str]], head: int, kept: int) -> bool:
        """Keep one turn fewer than the ``kept`` messages after the head just sent; False when no turn is left to
        drop (or trimming is off)."""
        if not self.trim_context:
            return False
        first = len(chat) - kept
        for start in range(first + 1, len(chat) - 1):
            if chat[start]["role"] == "assistant":  # the kept turns start with an answer: roles still alternate
                self._keep = len(chat) - start
                self.usage.context_trims += 1
                return True
        return False

    # -- errors ----------------------------------------------------------------------------------------------------
    def _status_failure(self, exc: Any, attempts: int) -> PolicyError:
        status, message = exc.status_code, server_message(exc)
        what = f"({status}: {message})"
        if status in (401, 403):
            fix = (f"set {self.api_key_env} to a valid key" if self.api_key_env
                   else "set OPENAI_API_KEY, or pass --api-key-env NAME to read the key from another variable")
            return PolicyError(f"{self.url} refused the API key {what}: {fix}")
        if status == 404 or (status in (400, 422) and self.model in message):
            unknown = self._unknown_model()
            if unknown is not None:
                return unknown
        if status == 404:
            return PolicyError(f"{self.url}/chat/completions was not found for model {self.model!r} {what}: check "
                               f"--base-url (OpenAI-compatible servers answer under /v1, e.g. http://HOST:PORT/v1)")
        if status == 429:
            return PolicyError(f"{self.url} still rate-limits model {self.model!r} after {attempts} attempts {what}: "
                               f"try again later, lower --num-envs, or allow more retries")
        if status >= 500 or status in RETRYABLE_STATUS:
            return PolicyError(f"{self.url} failed {attempts} times for model {self.model!r} {what}: check the "
                               f"server's log, or try again later")
        return PolicyError(f"{self.url} rejected the request for model {self.model!r} {what}: check the model name "
                           f"and the options sent ({', '.join(self.sampling) or 'none'})")

    def _connection_failure(self, exc: Any, attempts: int) -> PolicyError:
        if isinstance(exc, self._openai.APITimeoutError):
            return PolicyError(f"{self.url} did not answer within {self.timeout:g} s ({attempts} attempts): raise "
                               f"--timeout, or check that the server is up")
        reason = one_line(str(exc.__cause__ or exc))
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        return PolicyError(f"cannot reach {self.url} ({reason}; {tries}): start the server or pass --base-url URL")

    def _unknown_model(self) -> PolicyError | None:
        """The error for a model the server does not list, or None when it lists it (or cannot list)."""
        try:
            served = [model.id for model in self._client.models.list(timeout=min(self.timeout, 10.0))]
        except Exception:  # the list only makes the error message better
            return None
        return self._not_served(served) if served and self.model not in served else None

    def _not_served(self, served: list[str]) -> PolicyError:
        shown = ", ".join(served[:10]) + (", ..." if len(served) > 10 else "")
        return PolicyError(f"model {self.model!r} is not served at {self.url}; the server serves: {shown} "
                           f"(pass one of them: --policy openai:{served[0]})")


def _check(name: str, value: Any, accepts: Any, expected: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not accepts(value):
        raise InvalidOptionError(f"{name} must be {expected}, got {value!r}")


def with_tool_calls(content: str | None, message: Any) -> str:
    """An answer's ``content`` followed by its ``tool_calls`` in their text form (``content`` alone without any)."""
    from ..components.tool_calling import ToolCall, response_text

    calls = [ToolCall(str(call.function.name), call.function.arguments, call.id)
             for call in (getattr(message, "tool_calls", None) or []) if getattr(call, "function", None) is not None]
    return response_text(content, calls) if calls else (content or "")


def head_length(messages: list[dict[str, str]]) -> int:
    """How many messages at the start trimming never drops: the system message(s) and the first task message."""
    index = 0
    while index < len(messages) and messages[index]["role"] == "system":
        index += 1
    if index < len(messages) and messages[index]["role"] == "user":
        index += 1
    return index


def connection_refused(exc: BaseException) -> bool:
    """True when a failed call's cause is a refused connection (nothing listens at the address)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionRefusedError) or "connection refused" in str(current).lower():
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def server_message(exc: Any) -> str:
    """The message in a failed call's error body (OpenAI's ``error.message``, FastAPI's ``detail``), on one line."""
    body = getattr(exc, "body", None)
    message: Any = None
    if isinstance(body, dict):
        message = body.get("message") or body.get("detail") or body.get("error")
    elif isinstance(body, str):
        message = body
    return one_line(str(message if message else getattr(exc, "message", exc)))


def one_line(text: str) -> str:
    """``text`` on one line, cut to ``MESSAGE_CHARS``."""
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def is_context_overflow(exc: Any) -> bool:
    """True when a failed call says the conversation does not fit in the model's context."""
    if getattr(exc, "status_code", None) not in (400, 413, 422):
        return False
    if {str(getattr(exc, "code", "") or ""), str(getattr(exc, "type", "") or "")} & CONTEXT_CODES:
        return True
    return bool(CONTEXT_WORDS.search(server_message(exc)))


def retry_after(exc: Any) -> float | None:
    """Seconds a failed call's ``retry-after-ms`` or ``Retry-After`` header (seconds or a date) asks to wait, or
    None."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(float(value) / scale, 0.0)
        except ValueError:
            pass
        if name == "retry-after":
            try:
                return max(email.utils.parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
            except (TypeError, ValueError):
                return None
    return None


def spec_tools(spec: Any) -> list[dict[str, Any]] | None:
    """The tools of the parser a ``TaskSpec`` names (as the env resolves it), or None (no spec, or a text-language
    parser): what the policy sends as ``tools``."""
    if spec is None or not getattr(spec, "parser", None):
        return None
    from ..components.tool_calling import parser_tools
    from ..registry import registry

    return parser_tools(registry.component(spec, "parser"))
