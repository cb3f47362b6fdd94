"""Forking a local backend: ``n`` independent backends in exactly the parent's state after its last step.

What carries over: the workspace's files (content, modes, links), the shell's working directory and exported
variables (the tools' state, the open file and its window, is exported variables), the commands ``add_commands``
installed, the step count, the scores so far and the episode's seeds. What does not: running processes (a fork while
the agent's background processes run is refused, ``ForkRefused``, naming them), the shell's unexported variables,
functions and history, and what the agent wrote outside the workspace (its private ``/tmp`` and home).

The files are shared copy-on-write (``layers.py``): the parent's writable files are frozen as a layer, and the parent
and each child go on over it, each in a writable layer of its own. Where no overlay can be mounted (no user
namespaces for it, ``sandbox="none"``) each child gets a copy of the workspace instead, which costs its size.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import EnvMisuseError
from . import layers, procs
from .evaluation import force_rmtree

if TYPE_CHECKING:
    from .backend import LocalBackend
    from .session import ShellSession

NOT_CARRIED = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
"""Exported variables the shell sets itself: never restored in a fork's shell."""
DECLARE_LINE = re.compile(r"^declare -[-a-zA-Z]* ([A-Za-z_][A-Za-z0-9_]*)(=|$)")


MAX_LAYERS = 32
"""The most frozen layers a view stands on: past it, a fork first copies the view into one (``_flatten``)."""


class ForkRefused(EnvMisuseError):
    """The env cannot be forked now (its agent's processes are running, or it has no episode yet)."""


@dataclass(frozen=True)
class ShellState:
    """What a fork's shell is given of the parent's: its working directory (as the agent sees it) and its exported
    variables, as ``declare -x`` lines bash itself quoted."""

    cwd: str
    exports: str

    @classmethod
    def capture(cls, session: ShellSession, timeout: float) -> ShellState:
        """Read ``session``'s state (in base64: nothing the agent's variables hold can change how it is read)."""
        result = session.run(
            "builtin printf '%s' \"$PWD\" | base64 -w0; builtin printf '\\n'; builtin export -p | base64 -w0",
            timeout=timeout)
        lines = result.output.strip().splitlines()
        try:
            if result.timed_out or result.shell_died or len(lines) != 2:
                raise ValueError(result.output[:200])
            cwd, exports = (base64.b64decode(line, validate=True).decode("utf-8", "surrogateescape")
                            for line in lines)
        except (ValueError, binascii.Error) as exc:
            raise ForkRefused(f"the agent's shell state could not be read for the fork ({exc}); step the env once "
                              "more (a plain command), then fork") from None
        return cls(cwd, exports)

    def restore_script(self) -> str:
        """The commands that give a new shell this state (the variables, then the working directory, falling back
        to the workspace when the folder is not in the fork: the private ``/tmp`` is not carried)."""
        kept = [line for line in _declarations(self.exports)
                if (match := DECLARE_LINE.match(line)) and match.group(1) not in NOT_CARRIED]
        quoted = "'" + self.cwd.replace("'", "'\\''") + "'"
        return "\n".join([*kept, f"builtin cd -- {quoted} 2>/dev/null || true"])


def _declarations(exports: str) -> list[str]:
    """``export -p``'s output as one item per ``declare`` (a value may hold newlines)."""
    items: list[str] = []
    for line in exports.split("\n"):
        if line.startswith("declare -") or not items:
            items.append(line)
        else:
            items[-1] += "\n" + line
    return items


def background_processes(session: ShellSession, settle: float = 0.5) -> list[str]:
    """The agent's processes running beside its shell, each as ``pid (command line)``. A subshell that has not yet
    run its program (``sleep 600 &`` forks bash, then execs sleep) is read again for up to ``settle`` seconds, so
    that the program is what is named."""
    deadline = time.monotonic() + settle
    shell_line = _command_line(session.shell_pid)
    while True:
        found = {pid: _command_line(pid) for pid in sorted(session.processes()) if procs.alive(pid)}
        if shell_line not in found.values() or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return [f"{pid} ({line or procs.command_name(pid) or '?'})" for pid, line in found.items()]


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read(200).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def fork(parent: LocalBackend, n: int) -> list[LocalBackend]:
    """``n`` backends in ``parent``'s state (module docstring); the parent goes on in its own, unchanged to it."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"fork(n): n must be a positive integer, got {n!r}")
    if parent._finalizer.alive is False:
        raise ForkRefused("this LocalBackend was closed; fork an open one")
    if parent.task is None:
        raise ForkRefused("fork() forks an episode: call reset() first")
    res = parent._res
    session = res.session
    shell = ShellState(str(parent.task_workspace), "")
    if session is not None and session.alive:
        busy = background_processes(session)
        if busy:
            raise ForkRefused(
                "fork() carries files and the shell's state, not running processes, and the agent's shell has "
                f"processes running in the background: {', '.join(busy)}. Step the env until they end (or kill them: "
                "`kill %1`, `pkill -f ...`), then fork")
        shell = ShellState.capture(session, parent.command_timeout)
    why_not = layers.overlay_supported(str(res.root.parent)) if parent.sandboxed else "sandbox='none'"
    if why_not is None and _unchanged_since_last_fork(parent):
        return _fork_over(parent, n, list(res.layers), shell, restart=[])  # the parent's layers are its state
    res.stop_evaluation()
    res.stop_warm()
    res.stop_session()
    held = _freeze(parent) if why_not is None else None
    return _fork_over(parent, n, held, shell, restart=[parent])


def _unchanged_since_last_fork(parent: LocalBackend) -> bool:
    """Whether ``parent`` stands on a view whose writable layer is still empty (nothing written since it forked):
    its frozen layers alone hold its files, and its shell goes on as it is."""
    view, session = parent._res.view, parent._res.session
    if view is None or not view.alive or session is None or not session.alive or not parent._res.layers:
        return False
    try:
        with os.scandir(view.upper) as entries:
            if next(entries, None) is not None:
                return False
        return os.stat(view.upper).st_mode == os.stat(parent._res.layers[0].tree).st_mode
    except OSError:
        return False


def _fork_over(parent: LocalBackend, n: int, held: list[layers.Layer] | None, shell: ShellState,
               restart: list[LocalBackend]) -> list[LocalBackend]:
    """``n`` children of ``parent`` over the frozen layers ``held`` (None: each gets a copy), with ``shell``'s state;
    ``restart``: the parent when its shell must start again too (its files moved into a layer)."""
    res = parent._res
    children: list[LocalBackend] = []
    try:
        for _ in range(n):
            child = type(parent)(parent.spec, **parent.options)
            children.append(child)
            _adopt(child, parent, held)
        for env in (parent, *children):  # the holders mounted their views meanwhile, side by side
            if env._res.view is not None:
                env._res.view.wait_ready()
        _start_shells([*restart, *children], parent, shell)
    except BaseException:
        for child in children:
            child.close()
        if res.session is None:
            _start_shells([parent], parent, shell)
        raise
    return children


def _freeze(parent: LocalBackend) -> list[layers.Layer]:
    """Freeze the parent's writable files as a layer and put the parent on a new view over it; the layers."""
    res = parent._res
    with parent._disk.lock:
        if res.view is not None and len(res.layers) >= MAX_LAYERS:
            _flatten(parent)
        elif res.view is not None:
            res.view.stop()
            res.view = None
            res.layers.insert(0, layers.Layer.freeze(res.root / "upper", res.root.parent))
            force_rmtree(res.root / "work")
        else:
            mode = os.stat(res.root / "workspace").st_mode
            res.layers.insert(0, layers.Layer.freeze(res.root / "workspace", res.root.parent))
            (res.root / "workspace").mkdir(mode=mode & 0o7777)
        _mount(parent, res.layers)
    return list(res.layers)


def _flatten(parent: LocalBackend) -> None:
    """Copy ``parent``'s view into one new layer (reflinked where the filesystem can) and stand it on that alone:
    overlayfs takes a bounded stack of layers, and a parent forked at every turn would reach it."""
    res = parent._res
    assert res.view is not None
    flat = res.root / "flat"
    flat.mkdir()
    _copy_tree(res.view.path, flat)
    res.stop_view()
    for name in ("upper", "work"):
        force_rmtree(res.root / name)
    res.layers = [layers.Layer.freeze(flat, res.root.parent)]


def _mount(backend: LocalBackend, held: list[layers.Layer]) -> None:
    """Put ``backend`` on a copy-on-write view over ``held`` (topmost first), with a fresh writable layer."""
    res = backend._res
    upper, work = res.root / "upper", res.root / "work"
    upper.mkdir()
    work.mkdir()
    os.chmod(upper, os.stat(held[0].tree).st_mode & 0o7777)  # the workspace folder's own mode, as it was
    res.view = layers.OverlayView([layer.tree for layer in held], upper, work, res.root / "workspace")
    backend._confinement.enter = res.view.enter()
    backend._confinement.shown_workspace = res.root / "workspace"
    backend._confinement.layer_folders = [str(layer.folder) for layer in held]
    backend.use_workspace(res.view.path)


def drop_view(backend: LocalBackend) -> None:
    """Put a forked ``backend`` back on its plain folder (its session stopped): a new episode needs no layer."""
    res = backend._res
    with backend._disk.lock:
        res.stop_view()
        for name in ("upper", "work"):
            force_rmtree(res.root / name)
        backend._confinement.enter = []
        backend._confinement.shown_workspace = None
        backend._confinement.layer_folders = []
        backend.use_workspace(res.root / "workspace")


def _adopt(child: LocalBackend, parent: LocalBackend, held: list[layers.Layer] | None) -> None:
    """Give ``child`` (new, never reset) ``parent``'s state: counts, seeds, files and commands (its shell is started
    by ``_start_shells``); its view is being mounted when this returns."""
    child.seed, child.episode, child._episode_seeds = parent.seed, parent.episode, parent._episode_seeds
    child.current_step, child.returncode = parent.current_step, parent.returncode
    child.task, child.tools = copy.deepcopy(parent.task), copy.deepcopy(parent.tools)
    child.max_steps, child.trace_evaluations = parent.max_steps, parent.trace_evaluations
    child.notes = list(parent.notes)
    child._scores, child._added = copy.deepcopy(parent._scores), copy.deepcopy(parent._added)
    child._preload = list(parent._preload)
    source, files = parent._files, child._files
    _link_tree(source.pristine_dir, files.pristine_dir)
    files.pristine = {key: _moved(path, source.pristine_dir, files.pristine_dir) for key, path in
                      source.pristine.items()}
    files.secrets, files.task_files = set(source.secrets), dict(source.task_files)
    files.dataset_sources, files.checked, files.mode = list(source.dataset_sources), set(source.checked), source.mode
    _link_tree(parent._commands, child._commands)
    child._disk.task_bytes = dict(parent._disk.task_bytes)
    with child._disk.lock:
        if held is not None:
            child._res.layers = [layer.share() for layer in held]
            _mount(child, child._res.layers)
        else:
            _copy_tree(parent.host_workspace, child.host_workspace)
        child._confinement.reset_hub_caches()


def _start_shells(envs: list[LocalBackend], parent: LocalBackend, shell: ShellState) -> None:
    """Start the shells of ``envs`` (all at once: each sandbox starts while the others do), set each up as after a
    reset, and give each ``shell``'s state (unsandboxed, the working directory moved into the env's own folder)."""
    started = []
    for env in envs:
        with contextlib.suppress(OSError):  # as a new session after a reset: a workspace the agent locked opens
            mode = os.stat(env.host_workspace).st_mode
            if mode & 0o700 != 0o700:
                os.chmod(env.host_workspace, (mode & 0o7777) | 0o700)
        started.append(env._new_session(env._res.cgroup, env._res.memory))
    for env, session in zip(envs, started, strict=True):
        cwd = shell.cwd
        if not parent.sandboxed and Path(cwd).is_relative_to(parent.task_workspace):
            cwd = str(env.task_workspace / Path(cwd).relative_to(parent.task_workspace))
        env._set_up(session)
        env._run_setup(ShellState(cwd, shell.exports).restore_script())


def _moved(path: Path, old: Path, new: Path) -> Path:
    try:
        return new / Path(path).relative_to(old)
    except ValueError:
        return Path(path)  # the task's own copy (a dataset), shared read-only


def _link_tree(source: Path, target: Path) -> None:
    """Give ``target`` (an empty folder) ``source``'s files as hard links (files only the driver writes)."""
    for item in source.iterdir():
        if item.is_dir() and not item.is_symlink():
            shutil.copytree(item, target / item.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(item), str(target / item.name))


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)


def _copy_tree(source: Path, target: Path) -> None:
    """The fallback without an overlay: ``target`` (an empty folder) gets a copy of ``source`` (reflinked where the
    filesystem can, e.g. btrfs or XFS), links and modes as they are."""
    with contextlib.suppress(OSError):
        os.chmod(target, os.stat(source).st_mode & 0o7777)
    done = subprocess.run(["cp", "-a", "--reflink=auto", "--", f"{source}/.", str(target)], capture_output=True,
                          timeout=3600, check=False)
    if done.returncode != 0:
        raise OSError(f"copying the workspace for a fork failed: {done.stderr.decode(errors='replace').strip()}")
