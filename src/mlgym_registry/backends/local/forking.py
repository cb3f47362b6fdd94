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


def background_processes(session: ShellSession) -> list[str]:
    """The agent's processes running beside its shell, each as ``pid (command line)``."""
    found = []
    for pid in sorted(session.processes()):
        if not procs.alive(pid):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                line = handle.read(200).replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            line = ""
        found.append(f"{pid} ({line or procs.command_name(pid) or '?'})")
    return found


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
    res.stop_evaluation()
    res.stop_warm()
    res.stop_session()
    why_not = layers.overlay_supported(str(res.root.parent)) if parent.sandboxed else "sandbox='none'"
    children: list[LocalBackend] = []
    try:
        held = _freeze(parent) if why_not is None else None
        for _ in range(n):
            child = type(parent)(parent.spec, **parent.options)
            children.append(child)
            _adopt(child, parent, held, shell)
    except BaseException:
        for child in children:
            child.close()
        raise
    finally:
        _start_shell(parent, shell)
    return children


def _freeze(parent: LocalBackend) -> list[layers.Layer]:
    """Freeze the parent's writable files as a layer and put the parent on a new view over it; the layers."""
    res = parent._res
    with parent._disk.lock:
        if res.view is not None:
            res.view.stop()
            res.view = None
            layer = layers.Layer.freeze(res.root / "upper", res.root.parent)
            force_rmtree(res.root / "work")
        else:
            mode = os.stat(res.root / "workspace").st_mode
            layer = layers.Layer.freeze(res.root / "workspace", res.root.parent)
            (res.root / "workspace").mkdir(mode=mode & 0o7777)
        res.layers.insert(0, layer)
        _mount(parent, res.layers)
    return res.layers


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


def _adopt(child: LocalBackend, parent: LocalBackend, held: list[layers.Layer] | None, shell: ShellState) -> None:
    """Give ``child`` (new, never reset) ``parent``'s state: counts, seeds, files, commands and shell."""
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
    cwd = shell.cwd
    if not parent.sandboxed and Path(cwd).is_relative_to(parent.task_workspace):  # unsandboxed: host paths differ
        cwd = str(child.task_workspace / Path(cwd).relative_to(parent.task_workspace))
    _start_shell(child, ShellState(cwd, shell.exports))


def _start_shell(backend: LocalBackend, shell: ShellState) -> None:
    """Start ``backend``'s shell (set up as after a reset) and give it ``shell``'s state."""
    backend._start_session()
    backend._run_setup(shell.restore_script())


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
