"""Conformance checks for execution backends."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..specs import TaskSpec
from ._common import _fail, _name


def check_backend(factory: Callable[..., Any], spec: TaskSpec | str = "prisonersDilemma", **options: Any) -> None:
    """Run a short episode on a backend and check MLGym's contract: reset, tools, a command, step counting, the
    five-key ``info``, a validate and a submit whose ``info["score"]`` accumulates (the submission's score after the
    validation's, when the starter code validates), and a ``close`` that leaves nothing behind.

    ``task_workspace`` is the workspace's path as the agent sees it; it need not exist on this machine (a container's
    or a sandbox's path). A backend whose workspace is a folder here exposes it as ``host_workspace``: the kit then
    checks that it exists after ``reset()`` and is gone after ``close()``. A container backend (``mlgym``) has none,
    and the kit checks its workspace only through the agent's shell (``ls`` shows the starter files)."""
    from ..backends.protocol import EVALUATION_STATUS_KEY, EVALUATION_STATUSES, INFO_KEYS, ToolSet
    from ..registry import registry

    what = f"backend {_name(factory)}"
    spec = registry.spec(spec) if isinstance(spec, str) else spec
    backend = factory(spec, **options)
    workspace: Path | None = None
    try:
        reset = backend.reset(seed=0)
        if not (isinstance(reset, tuple) and len(reset) == 2 and isinstance(reset[0], dict)):
            _fail(what, f"reset() returned {reset!r}; it must return ({{'observation': None}}, {{}})")
        # ``task_workspace`` is where the agent sees its workspace (a path inside a sandbox or container may not
        # exist here); a backend whose workspace is a folder on this machine names it ``host_workspace``
        host = getattr(backend, "host_workspace", None)
        workspace = Path(host) if host is not None else None
        if workspace is not None and not workspace.is_dir():
            _fail(what, f"host_workspace {workspace} is not a directory after reset()")
        if not str(backend.task_workspace).startswith("/"):
            _fail(what, f"task_workspace {backend.task_workspace!r} is not an absolute path")
        tools = backend.install_tools()
        if not isinstance(tools, ToolSet):
            _fail(what, f"install_tools() returned {type(tools).__name__}; it must return a ToolSet")
        output = backend.communicate("echo conformance")
        if output.strip() != "conformance" or backend.returncode != 0:
            _fail(what, f"communicate('echo conformance') gave {output!r} (returncode {backend.returncode})")
        state = json.loads(backend.communicate(tools.state_command))
        if not {"open_file", "working_dir"} <= set(state):
            _fail(what, f"the state command printed {state}; it needs open_file and working_dir")
        result = backend.step("ls")
        if not (isinstance(result, tuple) and len(result) == 4):
            _fail(what, f"step() returned {result!r:.80}; it must return (observation, reward, done, info)")
        observation, _reward, done, info = result
        if not set(INFO_KEYS) <= set(info) <= set(INFO_KEYS) | {EVALUATION_STATUS_KEY}:
            _fail(what, f"step() info has keys {sorted(info)}; MLGym's info has exactly {list(INFO_KEYS)} (and "
                        f"optionally {EVALUATION_STATUS_KEY!r})")
        if info.get(EVALUATION_STATUS_KEY, "") not in ("", *EVALUATION_STATUSES):
            _fail(what, f"step() info[{EVALUATION_STATUS_KEY!r}] is {info[EVALUATION_STATUS_KEY]!r}; use one of "
                        f"{list(EVALUATION_STATUSES)} or ''")
        if done or backend.current_step != 1:
            _fail(what, f"after one step done={done} and current_step={backend.current_step}; expected False and 1")
        starter = {Path(path).name for path in spec.starter_code}
        if starter and not starter & set((observation or "").split()):
            _fail(what, f"'ls' in the workspace showed {observation!r}; starter files {sorted(starter)} are missing")
        _observation, _reward, done, info = backend.step("validate")
        validated = list(info.get("score") or [])
        if done:
            _fail(what, f"validate ended the episode (exit_status={info.get('exit_status')!r})")
        observation, _reward, done, info = backend.step("submit")
        if not done or info.get("exit_status") != "submitted" or not info.get("score"):
            _fail(what, f"submit gave done={done}, exit_status={info.get('exit_status')!r}, score={info.get('score')}; "
                        f"expected done, 'submitted' and a score")
        if list(info["score"][:len(validated)]) != validated or len(info["score"]) != len(validated) + 1:
            _fail(what, f"after validate info['score'] was {validated} and after submit {info['score']}; it must "
                        f"accumulate: every metric dict of the episode so far, the submission's last")
    finally:
        backend.close()
    backend.close()  # closing twice must be harmless
    if workspace is not None and workspace.exists():
        _fail(what, f"close() left the workspace {workspace} on disk")
