"""``mlgym-registry serve TASK [TASK ...]``: serve tasks to OpenEnv clients (see docs/serving.md).

One process serves up to ``--max-sessions`` sessions and uses about one core; ``--workers N`` starts N server
processes on ports PORT..PORT+N-1 under this one, which passes SIGTERM and Ctrl-C on to them.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import subprocess
import sys
from typing import Any

from ..options import InvalidOptionError, cli_integer
from .run import (
    COMPONENT_OPTIONS,
    add_backend_option_argument,
    add_component_arguments,
    backend_options,
    component_choices,
    with_changes,
)

EXTRA_HINT = "serve needs the openenv extra: pip install 'mlgym-registry[openenv]' (see docs/serving.md)"

GRACEFUL_SHUTDOWN_S = 10
"""Seconds a stopping server waits for running steps before it closes their sessions anyway."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``serve``."""
    parser.add_argument("tasks", nargs="+", metavar="TASK",
                        help="registered task names (or task YAML files); with several, clients pick one at reset")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other needs a token)")
    parser.add_argument("--port", type=cli_integer(0), default=8000, help="port (default 8000; 0: any free port)")
    parser.add_argument("--token-env", default=None, metavar="NAME",
                        help="environment variable holding the token clients must send (Authorization: Bearer)")
    parser.add_argument("--token-file", default=None, metavar="PATH",
                        help="file holding the token on its first line (not readable by others)")
    parser.add_argument("--max-sessions", type=cli_integer(1), default=4,
                        help="sessions (sandboxes) one server process holds at once (default 4)")
    parser.add_argument("--idle-timeout", type=float, default=900.0, metavar="SECONDS",
                        help="close a session idle this long; a running step is never idle (default 900, 0: never)")
    parser.add_argument("--workers", type=cli_integer(1), default=1,
                        help="server processes, on ports PORT..PORT+N-1 (default 1; about one core each)")
    parser.add_argument("--max-steps", type=cli_integer(1), default=None,
                        help="steps before autosubmission (default: each task's)")
    parser.add_argument("--backend", default=None, help="backend name (default: each task's, usually 'local')")
    add_backend_option_argument(parser)
    add_component_arguments(parser)


def main(args: argparse.Namespace) -> int:
    """Check the settings, then serve until SIGTERM or Ctrl-C; 0 after a clean stop."""
    try:
        from ..faces import openenv as serving
    except ImportError as exc:
        raise InvalidOptionError(f"{EXTRA_HINT} ({exc})") from exc

    token = serving.load_token(args.token_env, args.token_file)
    serving.check_bind(args.host, token)
    if args.idle_timeout < 0:
        raise InvalidOptionError(f"--idle-timeout {args.idle_timeout:g}: 0 (never) or more seconds")
    if args.workers > 1:
        if args.port == 0:
            raise InvalidOptionError("--workers N needs a fixed --port: the workers listen on PORT..PORT+N-1")
        return run_workers(args)
    app = serving.create_app(task_specs(args), token=token, max_sessions=args.max_sessions,
                             idle_timeout_s=args.idle_timeout or None, host=args.host)
    return run_server(app, args)


def task_specs(args: argparse.Namespace) -> list[Any]:
    """The tasks with the command line's changes (``--max-steps``, ``--backend``, ``--training-timeout``, ``-o``,
    ``--parser``, ``--template``, ``--reward``, ``--isolator``, ``--history``) applied, keeping the names they were
    given by."""
    from ..registry import registry

    options = backend_options(args.backend_option)
    specs = []
    for name in args.tasks:
        spec = with_changes(registry.spec(name), max_steps=args.max_steps, backend=args.backend,
                            training_timeout=args.training_timeout, options=options,
                            components=component_choices(args))
        specs.append(name if spec == registry.spec(name) else spec)
    return specs


def run_server(app: Any, args: argparse.Namespace) -> int:
    """Serve ``app`` with uvicorn in this process until SIGTERM or Ctrl-C, then close every session."""
    import uvicorn

    from ..faces.openenv import close_all

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = announcing_server(config, args.tasks)
    stopped: list[int] = []
    # uvicorn raises the signal again after its graceful shutdown: with this handler that ends serving normally,
    # and the exit handlers (sandboxes, temporary folders) still run
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        close_all(app.state.serve_config)
    return 0 if server.started else 1


def announcing_server(config: Any, tasks: list[str]) -> Any:
    """uvicorn's server, printing one line with the address once it listens (tests and scripts wait for it)."""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if not self.started:
                return
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    host = f"[{host}]" if ":" in host else host
                    print(f"mlgym-registry: serving {', '.join(tasks)} at http://{host}:{port}", flush=True)

    return AnnouncingServer(config)


def run_workers(args: argparse.Namespace) -> int:
    """Start ``--workers`` server processes on consecutive ports and wait for them; SIGTERM and Ctrl-C are passed
    on, and each worker gets SIGTERM should this process die."""
    procs = [subprocess.Popen(worker_argv(args, args.port + i), preexec_fn=_terminate_with_parent)
             for i in range(args.workers)]

    def stop(signum: int, frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes = [proc.wait() for proc in procs]
    return max(codes) if any(codes) else 0


def worker_argv(args: argparse.Namespace, port: int) -> list[str]:
    """The command line of one worker: this command's settings, one process, on ``port``."""
    argv = [sys.executable, "-m", "mlgym_registry.cli", "serve", *args.tasks, "--host", args.host,
            "--port", str(port), "--max-sessions", str(args.max_sessions), "--idle-timeout", str(args.idle_timeout)]
    for flag, value in (("--token-env", args.token_env), ("--token-file", args.token_file),
                        ("--max-steps", args.max_steps), ("--backend", args.backend),
                        ("--training-timeout", args.training_timeout),
                        *((f"--{kind}", getattr(args, kind, None)) for kind in COMPONENT_OPTIONS)):
        if value is not None:
            argv += [flag, str(value)]
    for option in args.backend_option:
        argv += ["-o", option]
    return argv


def _terminate_with_parent() -> None:
    """In a worker between fork and exec: SIGTERM when the process that started it dies (Linux)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
