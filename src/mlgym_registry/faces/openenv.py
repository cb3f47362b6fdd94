"""The OpenEnv face: tasks served over OpenEnv's WebSocket protocol (``mlgym-registry serve``, ``create_app``).

Built on OpenEnv's own ``HTTPEnvServer`` in its production mode: ``/ws`` sessions with ``reset``, ``step`` and
``state``, plus ``/health``, ``/metadata``, ``/schema``, ``POST /mcp`` and the task routes (``/mlgym/tasks``, ...);
the stateless HTTP ``/reset``, ``/step`` and ``/state`` are not registered and there is no web UI. Each session plays
the env ``registry.make`` builds (through ``gymnasium.MLGymRegistryEnv``: the same components, sandbox, rewards and
seeding), built on the session's first reset, never for ``/metadata`` or the task routes.

A session is one ``/ws`` connection and lives exactly as long as it (or its running step): the env has no MCP tools,
so OpenEnv's HTTP MCP sessions (``openenv/session/create`` on ``POST /mcp``, then ``/ws?session_id=``) would only
hold capacity with no connection behind them. ``POST /mcp`` answers every call with a JSON-RPC error, the MCP
WebSocket is not registered, attaching to a session by id is refused, and a session is never created off a
WebSocket connection.

Safe by default: ``create_app`` refuses browsers (an ``Origin`` header) and foreign ``Host`` headers unless a token
is set; with a token, every request but ``/health`` must carry ``Authorization: Bearer <token>``, on HTTP and on
the WebSocket handshake alike; ``check_bind`` refuses a non-loopback address without a token. Needs the
``[openenv]`` extra (see docs/serving.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hmac
import ipaddress
import json
import os
import stat
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import JsonRpcErrorCode, JsonRpcResponse
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata

from ..backends.protocol import EVALUATION_STATUS_KEY, INFRA_ERROR
from ..client import DEFAULT_MESSAGE_TIMEOUT_S, ENV_NAME, MlgymAction, MlgymObservation, MlgymState
from ..errors import MLGymRegistryError

DEFAULT_MAX_SESSIONS = 4
"""Sessions one server process holds at once (each is a sandbox; one process uses about one core)."""

DEFAULT_IDLE_TIMEOUT_S = 900.0
"""Seconds a session may sit without a message before it is closed (a running step never counts as idle)."""

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""Host names that need no token."""

MIN_TOKEN_CHARS = 16
"""The shortest token accepted."""

SPLIT = "test"
"""The one split of the task routes: every served task."""

OPEN_PATHS = ("/health",)
"""Paths answered without a token (OpenEnv's ``AutoEnv`` probes ``/health`` before connecting)."""

RESET_OPTIONS = ("seed", "episode_id", "task", "index", "split", "prompt")
"""What ``reset`` takes."""

SESSION_PATH = "/ws"
"""The one route that opens a session: a session is its WebSocket connection."""

MCP_PATH = "/mcp"
"""OpenEnv's MCP route: ``POST`` answers JSON-RPC errors only; its WebSocket is not registered."""

MCP_MAX_BODY_BYTES = 64 * 1024
"""The most of a ``POST /mcp`` body read (enough for any JSON-RPC call; the answer is an error anyway)."""

MCP_REFUSAL = ("this server has no MCP tools and no HTTP sessions: a session is one WebSocket connection to /ws, "
               "opened by OpenEnv's EnvClient (see docs/serving.md)")
"""Why every ``POST /mcp`` call is refused."""

_CONNECTION: contextvars.ContextVar[str | None] = contextvars.ContextVar("mlgym_registry_connection", default=None)
"""The ASGI scope type (``http``, ``websocket``) of the request being handled, set by ``Guard``."""


class ServingError(MLGymRegistryError):
    """A serving setting that is refused (a non-loopback address without a token, an unreadable token, ...)."""


@dataclass
class ServedTask:
    """A task a server serves: the name clients pick it by and its spec as a dict."""

    name: str
    spec: dict[str, Any]

    def describe(self, index: int) -> dict[str, Any]:
        """The task as the task routes list it."""
        description = (self.spec.get("description") or "").strip()
        return {"index": index, "name": self.name, "id": self.spec.get("id"), "title": self.spec.get("name"),
                "max_steps": self.spec.get("max_steps"), "training_timeout": self.spec.get("training_timeout"),
                "baseline": (self.spec.get("baseline_scores") or [None])[0],
                "description": description.splitlines()[0] if description else ""}


@dataclass
class ServeConfig:
    """What every session of a server shares: the tasks and the limits."""

    tasks: list[ServedTask]
    max_sessions: int = DEFAULT_MAX_SESSIONS
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S
    live: set[TaskEnvironment] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def task(self, name: str | None = None, index: int | None = None) -> ServedTask:
        """The task named ``name`` (a served name or its spec's id) or at ``index``; the only one when neither."""
        if index is not None:
            if not 0 <= index < len(self.tasks):
                raise ValueError(f"task index {index} out of range: {len(self.tasks)} task(s) served")
            return self.tasks[index]
        if name is None:
            if len(self.tasks) == 1:
                return self.tasks[0]
            raise ValueError(f"several tasks are served; choose one with reset(task=...): {self.names()}")
        for task in self.tasks:
            if name in (task.name, task.spec.get("id")):
                return task
        raise ValueError(f"unknown task {name!r}; this server serves {self.names()}")

    def names(self) -> list[str]:
        """The served tasks' names."""
        return [task.name for task in self.tasks]

    def message_timeout_s(self) -> float:
        """A client message timeout no step of these tasks outlasts: a training command and an evaluation, each up
        to the task's ``training_timeout``, plus a margin."""
        longest = max((task.spec.get("training_timeout") or 3600) for task in self.tasks)
        return max(DEFAULT_MESSAGE_TIMEOUT_S, 2.0 * longest + 120.0)


class TaskEnvironment(Environment[MlgymAction, MlgymObservation, MlgymState]):
    """One session's env: cheap to construct (OpenEnv builds one for ``/metadata`` and each task route); the task's
    env is built by the first ``reset`` and rebuilt only when a reset picks another task."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: ServeConfig):
        super().__init__()
        self.config = config
        self._gym: Any = None
        self._task: ServedTask | None = None
        self._state = MlgymState()
        self._render_prompt = False
        self._closed = False
        with config.lock:
            config.live.add(self)

    # -- OpenEnv's Environment -----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any) -> MlgymObservation:
        """Start an episode of ``task`` (a served name; or ``index``), seeded with ``seed``; ``prompt=True`` adds
        the rendered prompt to every observation of the episode."""
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(f"reset() got unknown option(s) {unknown}; it takes {list(RESET_OPTIONS)}")
        if options.get("split") not in (None, SPLIT):
            raise ValueError(f"unknown split {options['split']!r}; the one split is {SPLIT!r}")
        self._check_open()
        task = self.config.task(options.get("task"), options.get("index"))
        self._state = MlgymState(episode_id=episode_id, task=task.name, seed=seed, episode_done=True)
        self._ensure_env(task)
        self._render_prompt = bool(options.get("prompt", False))
        message, info = self._gym.reset(seed=seed)
        self._state = MlgymState(episode_id=episode_id or uuid.uuid4().hex, task=task.name, seed=seed)
        metadata = {"task": task.name, "system": info.get("system", "")}
        return MlgymObservation(message=message, reward=None, done=False, metadata=metadata,
                                prompt=self._prompt())

    def step(self, action: MlgymAction, timeout_s: float | None = None, **kwargs: Any) -> MlgymObservation:
        """Send the model's reply; an error before the first reset and after the episode ended."""
        self._check_open()
        if self._gym is None or self._state.task is None:
            raise RuntimeError("step() before reset(): reset the session to start an episode")
        if self._state.episode_done:
            raise RuntimeError("the episode is over (or its reset failed): reset() to start another")
        message, reward, terminated, truncated, info = self._gym.step(action.response)
        done = terminated or truncated
        self._state = self._state.model_copy(update={"step_count": self._state.step_count + 1, "episode_done": done,
                                                     "exit_status": str(info.get("exit_status") or "")})
        metadata = jsonable({**info, "terminated": terminated, "truncated": truncated})
        # an infra_error step is never paid: no reward at all (OpenEnv's None), and metadata["infra_error"] says why
        paid = None if info.get(EVALUATION_STATUS_KEY) == INFRA_ERROR else reward
        return MlgymObservation(message=message, reward=paid, done=done, metadata=metadata, prompt=self._prompt())

    @property
    def state(self) -> MlgymState:
        """The session's state; OpenEnv reads it on its event loop, so it is a snapshot, never computed here."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """The server's name and what it serves."""
        from .._version import __version__

        return EnvironmentMetadata(
            name=ENV_NAME, version=__version__, author="mlgym-registry",
            description=f"MLGym tasks as LLM-agent environments (mlgym-registry): {', '.join(self.config.names())}. "
                        "Action {'response': the model's reply}; reset(task=..., seed=...).")

    def close(self) -> None:
        """Close the task's env (its sandbox, processes and files); closing twice is allowed."""
        self._closed = True
        gym, self._gym = self._gym, None
        if gym is not None:
            gym.close()
        with self.config.lock:
            self.config.live.discard(self)

    # -- OpenEnv's task provider ---------------------------------------------------------------------------------
    def list_splits(self) -> list[str]:
        """One split, ``test``: the served tasks."""
        return [SPLIT]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        """The served tasks (name, id, title, step budget, baseline, first line of the description)."""
        self._check_split(split)
        return [task.describe(i) for i, task in enumerate(self.config.tasks)]

    def num_tasks(self, split: str) -> int:
        """How many tasks are served."""
        self._check_split(split)
        return len(self.config.tasks)

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        """The task at ``index``; pass ``index`` (or its ``name`` as ``task``) to ``reset``."""
        return self.list_tasks(split)[index]

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        """The tasks in ``[start, stop)``."""
        return self.list_tasks(split)[start:stop]

    # -- helpers -------------------------------------------------------------------------------------------------
    def _ensure_env(self, task: ServedTask) -> None:
        if self._gym is not None and self._task is task:
            return
        if self._gym is not None:
            gym, self._gym = self._gym, None
            gym.close()
        from .gymnasium import MLGymRegistryEnv

        self._gym, self._task = MLGymRegistryEnv(task.spec), task

    def _prompt(self) -> str | None:
        if not self._render_prompt or self._gym is None:
            return None
        from ..episodes.episode import text_at

        td = getattr(self._gym, "_td", None)  # the chain's latest output, which holds the rendered prompt
        return None if td is None else text_at(td, self._gym.layout.prompt)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this session is closed (idle too long, or the server is stopping); reconnect")

    @staticmethod
    def _check_split(split: str) -> None:
        if split != SPLIT:
            raise IndexError(f"unknown split {split!r}; the one split is {SPLIT!r}")


class _SessionServer(HTTPEnvServer):
    """OpenEnv's server, with a session that is running a reset or step never reaped as idle (OpenEnv 0.10 times
    idleness from the last finished message, so a training command longer than the idle timeout would lose its
    session), sessions created for WebSocket connections only, and no harness check."""

    async def _create_session(self) -> tuple[str, Environment]:
        # The routes that would create a session over HTTP are gone (create_app); this keeps any other path OpenEnv
        # may grow from taking a slot with no connection behind it, which idle reaping would free only much later.
        if _CONNECTION.get() != "websocket":
            raise ServingError(f"sessions are created only for a WebSocket connection to {SESSION_PATH}")
        return await super()._create_session()

    async def _run_in_session_executor(self, session_id: str, func: Any, *args: Any, **kwargs: Any) -> Any:
        busy = self._session_websocket_attachments  # OpenEnv's reaper skips the sessions in this set
        exempted = session_id not in busy
        if exempted:
            busy.add(session_id)
        try:
            return await super()._run_in_session_executor(session_id, func, *args, **kwargs)
        finally:
            if exempted:
                busy.discard(session_id)
            self._update_session_activity(session_id)

    def _factory_produces_harness_env(self) -> bool:
        return False  # never a harness env (OpenEnv would build one and import FastMCP's server to find out)


def served_tasks(tasks: Iterable[Any]) -> list[ServedTask]:
    """``tasks`` (registered names, task YAML paths, ``TaskSpec``s or their dicts) resolved once, as served."""
    from ..registry import registry

    served = []
    for task in tasks:
        spec = registry.spec(task)
        registry.resolve(spec)  # unknown components and bad options fail now, not at a client's reset
        name = task if isinstance(task, str) else spec.id
        served.append(ServedTask(str(name), spec.to_dict()))
    names = [task.name for task in served]
    if not served or len(set(names)) != len(names):
        raise ServingError(f"serve needs one or more distinct tasks; got {names}")
    return served


def create_app(tasks: Sequence[Any], *, token: str | None = None, max_sessions: int = DEFAULT_MAX_SESSIONS,
               idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S, host: str = "127.0.0.1") -> Any:
    """The ASGI app serving ``tasks`` (names, task YAML paths or ``TaskSpec``s) over OpenEnv's protocol.

    ``token``: required on every request but ``/health`` (``Authorization: Bearer <token>``); without one, only
    requests addressed to ``host`` or a loopback name, and from no browser, are answered. ``max_sessions`` sessions
    at once (more are refused with OpenEnv's ``CAPACITY_REACHED``); a session idle for ``idle_timeout_s`` seconds
    is closed (None: never). Run it with uvicorn (``serve`` does).
    """
    if max_sessions < 1:
        raise ServingError(f"max_sessions={max_sessions}; at least 1")
    if token is not None:
        check_token(token)
    config = ServeConfig(served_tasks(tasks), max_sessions=max_sessions, idle_timeout_s=idle_timeout_s)
    app = FastAPI(title="mlgym-registry (OpenEnv)", version="1.0.0", docs_url=None, redoc_url=None,
                  description="MLGym tasks over OpenEnv's WebSocket protocol: see docs/serving.md")
    server = _SessionServer(functools.partial(TaskEnvironment, config), MlgymAction, MlgymObservation,
                            concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions,
                                                                 session_timeout=idle_timeout_s),
                            env_name=ENV_NAME, state_cls=MlgymState)
    server.register_routes(app, mode="production")
    replace_mcp_routes(app)
    app.state.serve_config, app.state.openenv_server = config, server

    @app.get("/serving", tags=["Environment Info"], summary="What this server serves and its limits")
    async def serving_info() -> dict[str, Any]:
        return {"tasks": config.names(), "max_sessions": max_sessions, "active_sessions": server.active_sessions,
                "idle_timeout_s": idle_timeout_s, "message_timeout_s": config.message_timeout_s()}

    async def close_sessions() -> None:
        await asyncio.to_thread(close_all, config)

    app.router.on_shutdown.append(close_sessions)
    return Guard(app, token=token, hosts=allowed_hosts(host))


def replace_mcp_routes(app: FastAPI) -> None:
    """Drop OpenEnv's ``/mcp`` routes (HTTP sessions with no connection, and a session per MCP WebSocket, for an env
    without MCP tools) and answer ``POST /mcp`` with a JSON-RPC error, as ``openenv validate`` expects."""
    app.router.routes[:] = [route for route in app.router.routes if getattr(route, "path", None) != MCP_PATH]

    @app.post(MCP_PATH, tags=["MCP"], summary="Refused: this server has no MCP tools or HTTP sessions")
    async def mcp_refused(request: Request) -> dict[str, Any]:
        return await mcp_refusal(request)


async def mcp_refusal(request: Request) -> dict[str, Any]:
    """The JSON-RPC error ``POST /mcp`` answers: a parse error, or the method refused (with the call's ``id``)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MCP_MAX_BODY_BYTES:
            message = f"request over {MCP_MAX_BODY_BYTES} bytes; {MCP_REFUSAL}"
            return JsonRpcResponse.error_response(JsonRpcErrorCode.INVALID_REQUEST, message).model_dump()
    try:
        call = json.loads(bytes(body))
    except ValueError:
        return JsonRpcResponse.error_response(JsonRpcErrorCode.PARSE_ERROR).model_dump()
    call = call if isinstance(call, dict) else {}
    given = call.get("id")
    request_id = given if isinstance(given, (str, int)) and not isinstance(given, bool) else None
    method = call.get("method") if isinstance(call.get("method"), str) else None
    message = f"method {method!r} refused: {MCP_REFUSAL}"
    return JsonRpcResponse.error_response(JsonRpcErrorCode.METHOD_NOT_FOUND, message,
                                          request_id=request_id).model_dump()


def close_all(config: ServeConfig) -> None:
    """Close every session's env (on shutdown: the sandboxes, processes and temporary folders go with them)."""
    with config.lock:
        envs = list(config.live)
    for env in envs:
        try:
            env.close()
        except Exception:  # noqa: BLE001 - one env failing to close must not keep the others open
            pass


class Guard:
    """ASGI middleware: the token, and without a token the ``Host`` and ``Origin`` checks, on HTTP and WebSocket
    requests alike; a WebSocket asking to attach to an existing session (``/ws?session_id=``) is refused too. A
    refused WebSocket is closed before it is accepted (the client sees HTTP 403)."""

    def __init__(self, app: Any, *, token: str | None, hosts: set[str]):
        self.app, self.token, self.hosts = app, token, hosts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)  # app.state, app.routes, ... of the FastAPI app behind

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        problem = self.problem(scope) or attach_problem(scope)
        if problem is None:
            connection = _CONNECTION.set(scope["type"])
            try:
                return await self.app(scope, receive, send)
            finally:
                _CONNECTION.reset(connection)
        status, reason = problem
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008, "reason": reason})
        body = json.dumps({"detail": reason}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def problem(self, scope: dict[str, Any]) -> tuple[int, str] | None:
        """``(status, reason)`` when the request is refused, else None."""
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        if self.token is None:
            host = host_name(headers.get("host", ""))
            if host not in self.hosts:
                return 403, f"host {host!r} refused: without a token only loopback names are served"
            if "origin" in headers:  # a web page (the browser's own WebSocket or fetch), never a training client
                return 403, "requests from browsers are refused"
            return None
        if scope.get("path") in OPEN_PATHS:
            return None
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return 401, "missing or wrong token: send 'Authorization: Bearer <token>'"
        return None


def attach_problem(scope: dict[str, Any]) -> tuple[int, str] | None:
    """``(403, reason)`` for a WebSocket asking to attach to a session by id: each connection has its own."""
    if scope["type"] != "websocket":
        return None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    if "session_id" in query:
        return 403, f"attaching to a session by id is refused: each {SESSION_PATH} connection is its own session"
    return None


def host_name(host_header: str) -> str:
    """The host of a ``Host`` header, without its port or IPv6 brackets."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str) -> set[str]:
    """The ``Host`` names answered without a token: the loopback names and the bound address."""
    return {*LOOPBACK_NAMES, host.strip("[]").lower()}


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen on ``host`` when it is not a loopback address and no token is set."""
    if token is None and not is_loopback(host):
        raise ServingError(f"--host {host}: listening beyond this machine needs a token (--token-env NAME or "
                           "--token-file PATH); the server runs the client's commands")


def check_token(token: str) -> str:
    """``token`` when it is long enough and prints (no spaces or control characters)."""
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or any(c.isspace() for c in token):
        raise ServingError(f"the token must be at least {MIN_TOKEN_CHARS} printable characters without spaces "
                           "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def load_token(token_env: str | None = None, token_file: str | None = None) -> str | None:
    """The token from the environment variable ``token_env`` or the file ``token_file`` (first line; it must not be
    readable by others); None when neither is given."""
    if token_env and token_file:
        raise ServingError("give the token one way: --token-env or --token-file, not both")
    if token_env:
        value = os.environ.get(token_env)
        if not value:
            raise ServingError(f"--token-env {token_env}: the environment variable is not set or empty")
        return check_token(value.strip())
    if token_file:
        path = Path(token_file)
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ServingError(f"--token-file {token_file}: readable by others (mode {stat.S_IMODE(mode):o}); "
                               f"chmod 600 it")
        lines = path.read_text().splitlines()
        return check_token(lines[0].strip() if lines else "")
    return None


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: numpy and torch scalars as numbers, anything else unknown as its text."""
    def default(obj: Any) -> Any:
        item = getattr(obj, "item", None)
        if callable(item):
            try:
                return item()
            except (TypeError, ValueError):
                pass
        if isinstance(obj, (set, tuple)):
            return list(obj)
        return str(obj)

    return json.loads(json.dumps(value, default=default))
