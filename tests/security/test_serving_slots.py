"""Serving slots cannot be hoarded: a slot is held by a live ``/ws`` connection only.

OpenEnv's ``POST /mcp`` ``openenv/session/create`` used to take a session slot with no WebSocket behind it (idle
reaping freed it only after ``--idle-timeout``, 900 s by default): two such calls filled a ``max_sessions=2``
server. Each test attacks a real server on 127.0.0.1 and judges from the host side with OpenEnv's own client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("openenv.core.env_server.http_server")
requests = pytest.importorskip("requests")
websockets_sync = pytest.importorskip("websockets.sync.client")

from openenv import GenericEnvClient  # noqa: E402

pytestmark = pytest.mark.security

TASK = "prisonersDilemma"
TOKEN = "slots-token-0123456789abcdef"
CEILING = 120.0
"""Seconds a request, a start or a freed slot may take before the test fails: a ceiling for a loaded machine, not a
timing (each comes at once when all is well)."""


class AppServer:
    """``create_app`` served by uvicorn in a thread on a free port of 127.0.0.1."""

    def __init__(self, **options):
        import uvicorn

        from mlgym_registry.faces.openenv import create_app

        self.server = uvicorn.Server(uvicorn.Config(create_app([TASK], **options), host="127.0.0.1", port=0,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + CEILING
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url, self.ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def two_slots() -> Iterator[AppServer]:
    srv = AppServer(max_sessions=2)
    yield srv
    srv.stop()


def create_call(server: AppServer, call_id: int, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(f"{server.url}/mcp", headers=headers, timeout=CEILING,
                         json={"jsonrpc": "2.0", "id": call_id, "method": "openenv/session/create", "params": {}})


def client(server: AppServer, **kwargs):
    return GenericEnvClient(base_url=server.url, message_timeout_s=60, **kwargs).sync()


def active_sessions(server: AppServer, headers: dict[str, str] | None = None) -> int:
    return requests.get(f"{server.url}/serving", headers=headers, timeout=CEILING).json()["active_sessions"]


def wait_for_sessions(server: AppServer, count: int, headers: dict[str, str] | None = None) -> bool:
    deadline = time.monotonic() + CEILING  # closing a session's env ends its sandbox: slower under load
    while active_sessions(server, headers) != count and time.monotonic() < deadline:
        time.sleep(0.05)
    return active_sessions(server, headers) == count


def test_http_session_create_takes_no_slot(two_slots):
    answers = [create_call(two_slots, i) for i in range(5)]  # more than the slots: none may be taken
    for i, answer in enumerate(answers):
        body = answer.json()
        assert answer.status_code == 200 and body["jsonrpc"] == "2.0" and body["id"] == i
        assert "result" not in body or body["result"] is None
        assert body["error"]["code"] == -32601 and "no HTTP sessions" in body["error"]["message"]
    assert active_sessions(two_slots) == 0
    with client(two_slots) as first, client(two_slots) as second:  # both slots are still free for real clients
        assert first.state()["step_count"] == 0 and second.state()["step_count"] == 0
        assert active_sessions(two_slots) == 2
        with client(two_slots) as third:  # the capacity refusal is still OpenEnv's own
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                third.state()
    assert wait_for_sessions(two_slots, 0)  # a slot lives exactly as long as its connection


def test_slot_frees_when_the_connection_goes(two_slots):
    with client(two_slots) as first:
        first.state()
        with client(two_slots) as second:
            second.state()
        assert wait_for_sessions(two_slots, 1)
        with client(two_slots) as again:
            assert again.state()["step_count"] == 0


def test_no_other_mcp_call_or_attach_takes_a_slot(two_slots):
    for call in ({"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {}},
                 {"jsonrpc": "2.0", "id": "b", "method": "openenv/session/close", "params": {"session_id": "x"}},
                 {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "x", "session_id": "y"}}):
        body = requests.post(f"{two_slots.url}/mcp", json=call, timeout=CEILING).json()
        assert body["id"] == call["id"] and body["error"]["code"] == -32601
    big = requests.post(f"{two_slots.url}/mcp", data=b"[" * 200_000, timeout=CEILING).json()
    assert big["error"]["code"] == -32600 and "bytes" in big["error"]["message"]
    with client(two_slots) as owner:
        owner.state()
        for path in ("/ws?session_id=anything", "/mcp"):  # attaching by id, and OpenEnv's MCP WebSocket
            with pytest.raises(Exception, match="403"):
                websockets_sync.connect(two_slots.ws_url + path, open_timeout=CEILING).recv(timeout=CEILING)
        assert active_sessions(two_slots) == 1


def test_token_still_guards_mcp_and_sessions():
    srv = AppServer(max_sessions=1, token=TOKEN)
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert create_call(srv, 1).status_code == 401
        assert create_call(srv, 2, headers=auth).json()["error"]["code"] == -32601
        assert active_sessions(srv, auth) == 0
        with client(srv, headers=auth) as env:
            assert env.state()["step_count"] == 0
    finally:
        srv.stop()
