"""OpenAI-compatible servers for tests: a scripted endpoint (``Endpoint``, ``http.server`` in a thread) that answers
each chat completion from a list of replies, so that rate limits, server errors, dropped connections, refused keys
and context overflows happen on demand, and ``transformers serve`` over the tiny model (``TinyServer``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "test-model"
ANSWER = "DISCUSSION\nI look around first.\n```\nls -a\n```"

# -- a scripted OpenAI-compatible endpoint -----------------------------------------------------------------------
Reply = dict[str, Any]


def completion(text: str = ANSWER, prompt_tokens: int = 11, completion_tokens: int = 7) -> Reply:
    """A 200 with a chat completion of ``text``."""
    return {"status": 200, "body": {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }}


def error(status: int, message: str, *, code: Any = None, kind: str = "invalid_request_error",
          headers: dict[str, str] | None = None) -> Reply:
    """An error in OpenAI's shape (``{"error": {...}}``), which vLLM also uses."""
    return {"status": status, "headers": headers or {},
            "body": {"error": {"message": message, "type": kind, "param": None, "code": code}}}


RESET: Reply = {"reset": True}
"""Close the connection without answering (a dropped connection)."""


class Endpoint:
    """An OpenAI-compatible endpoint on 127.0.0.1 that answers ``POST /v1/chat/completions`` from ``replies``:
    a list (one reply per request, the last one repeated) or a function of the request's JSON. ``GET /v1/models``
    lists ``models``. ``requests`` holds every chat request received, ``keys`` their ``Authorization`` headers."""

    def __init__(self, replies: list[Reply] | Callable[[dict[str, Any]], Reply], models: tuple[str, ...] = (MODEL,)):
        self.replies, self.models = replies, models
        self.requests: list[dict[str, Any]] = []
        self.keys: list[str | None] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    listed = [{"id": name, "object": "model", "created": 0, "owned_by": "test"}
                              for name in endpoint.models]
                    self._send({"status": 200, "body": {"object": "list", "data": listed}})
                else:
                    self._send({"status": 404, "body": {"detail": "Not Found"}})

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(request)
                endpoint.keys.append(self.headers.get("Authorization"))
                self._send(endpoint.reply(request))

            def _send(self, reply: Reply) -> None:
                if reply.get("reset"):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                data = json.dumps(reply["body"]).encode()
                self.send_response(reply["status"])
                for name, value in {"Content-Type": "application/json", **reply.get("headers", {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def reply(self, request: dict[str, Any]) -> Reply:
        if callable(self.replies):
            return self.replies(request)
        return self.replies[min(len(self.requests), len(self.replies)) - 1]

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SERVE = """
import sys
from mlgym_registry.testing.tiny_model import save_tiny_checkpoint
folder, port = sys.argv[1], sys.argv[2]
save_tiny_checkpoint(folder)
from transformers.cli.transformers import main  # what the `transformers` command runs
sys.argv = ["transformers", "serve", folder, "--host", "127.0.0.1", "--port", port, "--device", "cpu"]
sys.exit(main())
"""
"""Saves the tiny model and serves it from the same process: the two share the imports, which take most of the
start-up time."""

SERVE_WAIT = 600.0
"""A ceiling for the server's start, not a timing: on a loaded 2-core machine it can take minutes."""


class TinyServer:
    """``transformers serve`` pinned to the tiny model, in its own process group."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.model = str(folder / "tiny")
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = folder / "serve.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.started = time.monotonic()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-c", SERVE, self.model, str(self.port)], env=env,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.ready_after: float | None = None

    def wait(self) -> TinyServer:
        """Block until the server answers ``/health``."""
        while self.ready_after is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"transformers serve exited ({self.process.returncode}):\n{self.tail()}")
            if time.monotonic() - self.started > SERVE_WAIT:
                raise RuntimeError(f"transformers serve did not answer in {SERVE_WAIT:g} s:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        self.ready_after = time.monotonic() - self.started
            except OSError:
                time.sleep(0.2)
        return self

    def chat_requests(self) -> int:
        """Chat completions the server has answered so far (from its access log)."""
        return self.log.read_text(errors="replace").count('"POST /v1/chat/completions')

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
