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

import contextlib
import copy
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import EnvMisuseError
from . import layers, procs
from . import spares as spares_mod
from .evaluation import force_rmtree

if TYPE_CHECKING:
    from .session import ShellSession

LocalBackend = Any
"""``backend.LocalBackend``, which this module works on: named, not imported, since backend.py imports this
module (a circle otherwise)."""

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
        """Read ``session``'s state with builtins only (no process started), as raw bytes: NUL, which no value can
        hold, ends the working directory and the variables; nothing the agent's variables hold can change how it is
        read."""
        result = session.run("builtin printf '%s\\0' \"$PWD\"; builtin export -p; builtin printf '\\0%s' end",
                             timeout=timeout, raw=True)
        cwd, first, rest = result.output.partition("\0")
        exports, last, end = rest.rpartition("\0")
        if result.timed_out or result.shell_died or not (first and last) or end != "end" or "\0" in exports:
            raise ForkRefused(f"the agent's shell state could not be read for the fork ({result.output[:200]!r}); "
                              "step the env once more (a plain command), then fork")
        return cls(cwd, exports.removesuffix("\n"))

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


@dataclass
class ForkPoint:
    """A backend's state at a fork, from which children are made (``make``, ``make_many``), in this process or in
    another one it is pickled to: the frozen layers' folders, the counts and seeds, the task's pristine copies and
    commands (linked into the point's own folder, beside the layers), the shell's state. The layers live while the
    point is open in the process that made it (``close``) or any env stands on them."""

    spec: Any
    options: dict[str, Any]
    layer_folders: list[str]
    copy_only: bool
    """True where no overlay can be mounted: each child copies the frozen copy of the workspace."""
    state: dict[str, Any]
    files: dict[str, Any]
    task_bytes: dict[str, int]
    shell: ShellState
    sandboxed: bool
    task_workspace: str
    folder: str
    """The point's own folder (its pristine copies and commands), inside its topmost layer's."""
    backend_class: type
    """The parent's class (``LocalBackend`` or a subclass), which each child is made of."""
    held: list[layers.Layer] = field(default_factory=list, repr=False, compare=False)
    sources: dict[str, str] | None = None
    """A point used in place (``fork``), while its parent stands: the parent's own folders of pristine copies and
    commands, which the children link from (nothing is linked into the point's folder); None for a point that may
    outlive its parent (``fork_point``)."""

    @classmethod
    def of(cls, parent: LocalBackend, held: list[layers.Layer], shell: ShellState, *, copy_only: bool,
           in_place: bool = False) -> ForkPoint:
        """The point of ``parent`` over the layers ``held`` (held for the point); ``in_place``: used at once, while
        ``parent`` stands (``sources``)."""
        source = parent._files
        if in_place:
            folder = Path()
            pristine = source.pristine_dir
        else:
            folder = Path(held[0].folder) / "points" / uuid.uuid4().hex if held else parent._res.root / "point"
            folder.mkdir(parents=True, exist_ok=not held)
            pristine, commands = folder / "pristine", folder / "commands"
            for target, origin in ((pristine, source.pristine_dir), (commands, parent._commands)):
                target.mkdir(exist_ok=True)
                if held:
                    _link_tree(origin, target)
        return cls(
            spec=parent.spec, options=dict(parent.options), layer_folders=[str(layer.folder) for layer in held],
            copy_only=copy_only,
            state={"seed": parent.seed, "episode": parent.episode, "_episode_seeds": parent._episode_seeds,
                   "current_step": parent.current_step, "returncode": parent.returncode, "task": parent.task,
                   "tools": parent.tools, "max_steps": parent.max_steps, "notes": list(parent.notes),
                   "trace_evaluations": parent.trace_evaluations, "_scores": parent._scores,
                   "_added": parent._added, "_preload": list(parent._preload)},
            files={"pristine": {key: str(_moved(path, source.pristine_dir, pristine))
                                for key, path in source.pristine.items()},
                   "secrets": set(source.secrets), "task_files": dict(source.task_files),
                   "dataset_sources": list(source.dataset_sources), "checked": set(source.checked),
                   "mode": source.mode},
            task_bytes=dict(parent._disk.task_bytes), shell=shell, sandboxed=parent.sandboxed,
            task_workspace=str(parent.task_workspace), folder=str(folder), backend_class=type(parent), held=held,
            sources={"pristine": str(source.pristine_dir), "commands": str(parent._commands)} if in_place else None,
        )

    def make(self) -> LocalBackend:
        """One child in the point's state."""
        return self.make_many(1)[0]

    def make_many(self, n: int, also_start: Sequence[LocalBackend] = (),
                  spares: spares_mod.Spares | None = None) -> list[LocalBackend]:
        """``n`` children, their views mounted and shells started side by side (with ``also_start``'s shells: the
        parent's, when it must start again); those ``spares`` holds ready are taken first (made ahead: their holder
        waits and their shell runs already), the others made now."""
        children: list[LocalBackend] = []
        try:
            held = self._hold()
            ready = spares.take(n) if spares is not None and not self.copy_only else []
            children.extend(ready)
            for spare in ready:
                _adopt(spare, self, held)
            for _ in range(n - len(ready)):
                child = self.backend_class(self.spec, **self.options)
                children.append(child)
                _adopt(child, self, held)
            _start_shells([*also_start, *children[len(ready):]], self)  # each waits for its view, mounted meanwhile
            for spare in ready:
                session = spare._res.session
                assert session is not None and spare._res.view is not None
                spare._res.view.wait_ready()
                spare._set_up(session, then=ShellState(self.shell.cwd, self.shell.exports).restore_script())
        except BaseException:
            for child in children:
                child.close()
            for env in also_start:
                if env._res.session is None:
                    _start_shells([env], self)
            raise
        return children

    def _hold(self) -> list[layers.Layer]:
        """The layers, held for as long as a child is made (in a process that did not make the point: taken now)."""
        if self.held:
            return self.held
        try:
            taken = [layers.Layer.take(Path(folder)) for folder in self.layer_folders]
        except FileNotFoundError:
            raise ForkRefused("this fork point's frozen layers are gone: keep the ForkPoint open (point.close() "
                              "only once every env it makes is made) and make children before it closes") from None
        self.held = taken
        return taken

    def close(self) -> None:
        """Let go of the point's hold on its layers (the envs made from it keep their own). Idempotent."""
        held, self.held = self.held, []
        for layer in held:
            layer.release()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["held"] = []  # holds are per process: another one takes its own
        return state


def background_processes(session: ShellSession, settle: float = 2.0) -> list[str]:
    """The agent's processes running beside its shell, each as ``pid (command line)``. A subshell that has not yet
    run its program (``sleep 600 &`` forks bash, then execs sleep) is read again for up to ``settle`` seconds, so
    that the program is what is named; so is a process whose command line reads empty, as it does while the kernel
    executes a program (the new one's arguments are not in place yet) and for good once it has ended (a zombie, named
    by its command's name)."""
    deadline = time.monotonic() + settle
    shell_line = _command_line(session.shell_pid)
    while True:
        found = {pid: _command_line(pid) for pid in sorted(session.processes()) if procs.alive(pid)}
        unsettled = any(line in (shell_line, "") for line in found.values())
        if not unsettled or time.monotonic() > deadline:
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
    point, restart = _make_point(parent, in_place=True)
    try:
        return point.make_many(n, also_start=restart, spares=parent._res.spares)
    finally:
        point.close()
        if not point.copy_only:
            keep_spares(parent, n)


def keep_spares(parent: LocalBackend, n: int) -> None:
    """Have ``n`` children of ``parent`` made ahead, in the background, for its next fork (``spares.py``)."""
    if parent._finalizer.alive is False or not parent.sandboxed:
        return
    if parent._res.spares is None:
        parent._res.spares = spares_mod.Spares(type(parent), parent.spec, parent.options)
    parent._res.spares.keep(n)


def fork_point(parent: LocalBackend) -> ForkPoint:
    """``parent``'s state as a ``ForkPoint``: picklable, it makes children in this process or another one (a worker
    of a multiprocessing pool) for as long as it is open; the parent goes on at once."""
    point, restart = _make_point(parent)
    try:
        if restart:
            _start_shells(restart, point)
    except BaseException:
        point.close()
        raise
    return point


def _make_point(parent: LocalBackend, *, in_place: bool = False) -> tuple[ForkPoint, list[LocalBackend]]:
    """Freeze ``parent``'s state into a ``ForkPoint``; the envs whose shells must start again (the parent's, unless
    it wrote nothing since its last fork), left stopped for the caller to start beside the children's; ``in_place``: a
    point used at once, while the parent stands (``ForkPoint.sources``)."""
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
        return ForkPoint.of(parent, [layer.share() for layer in res.layers], shell, copy_only=False,
                            in_place=in_place), []
    if why_not is None and len(res.layers) < MAX_LAYERS:
        copied = _freeze_a_copy(parent)
        if copied is not None:  # the parent goes on as it is: its view, its shell and what the shell holds open
            return ForkPoint.of(parent, [copied, *(layer.share() for layer in res.layers)], shell,
                                copy_only=False, in_place=in_place), []
    res.stop_evaluation()
    res.stop_warm()
    res.stop_session()
    restart = [parent]
    try:
        if why_not is None:
            held = [layer.share() for layer in _freeze(parent)]
        else:  # no overlay: the children copy a copy of the workspace, made now (they may be made later)
            with parent._disk.lock:
                snapshot = res.root / "snapshot"
                snapshot.mkdir()
                _copy_tree(parent.host_workspace, snapshot)
                held = [layers.Layer.freeze(snapshot, res.root.parent)]
        return ForkPoint.of(parent, held, shell, copy_only=why_not is not None, in_place=in_place), restart
    except BaseException:
        _start_shells(restart, ForkPoint.of(parent, [], shell, copy_only=True))
        raise


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


COPY_LIMIT_BYTES = 8 << 20
"""The most data the parent's writable files (all its files, before its first fork) may hold for a fork to freeze a
copy of them (``_freeze_a_copy``) rather than the files themselves."""
COPY_LIMIT_ENTRIES = 2000
"""The most files and folders they may count for that."""


def _freeze_a_copy(parent: LocalBackend) -> layers.Layer | None:
    """A new layer holding a copy of what ``parent`` wrote since its last fork (its writable layer; its whole plain
    workspace before its first fork), held for the point; None when that holds more than ``COPY_LIMIT_BYTES`` or
    ``COPY_LIMIT_ENTRIES`` (or could not be copied): the caller freezes the files themselves instead.

    The parent's own view, shell and open files are left as they are: a copy of a few files (reflinked where the
    filesystem can) costs less than a new view and a new shell, and nothing the parent's processes hold open is in
    the layer its children stand on. What a frozen copy holds of overlayfs's own marks (a removed file's whiteout,
    an opaque folder's attribute) means the same one layer lower."""
    res = parent._res
    source = res.view.upper if res.view is not None else parent.host_workspace
    with parent._disk.lock:
        if not _small(source):
            return None
        staged = Path(tempfile.mkdtemp(prefix="copy-", dir=res.root))
        try:
            _copy_small_tree(source, staged)
            return layers.Layer.freeze(staged, res.root.parent)
        except OSError:
            force_rmtree(staged)
            return None


def _copy_small_tree(source: Path, target: Path) -> None:
    """``cp -a`` in this process, for the few files ``_small`` allows (a ``cp`` process costs more to start than
    they take to copy): ``target`` (an empty folder) gets ``source``'s files, folders, links, fifos and overlayfs
    whiteouts (0/0 character devices), with their modes, times and extended attributes (an opaque folder's mark),
    and hard links between them kept. Anything else (a socket, a device) raises ``OSError``."""
    seen: dict[tuple[int, int], str] = {}
    for folder, names, files in os.walk(source):
        into = os.path.join(target, os.path.relpath(folder, source))
        for name in names:
            if os.path.islink(os.path.join(folder, name)):
                files.append(name)  # os.walk lists a link to a folder among the folders
        names[:] = [name for name in names if not os.path.islink(os.path.join(folder, name))]
        for name in names:
            os.mkdir(os.path.join(into, name))
        for name in files:
            src, dst = os.path.join(folder, name), os.path.join(into, name)
            info = os.lstat(src)
            if info.st_nlink > 1 and (info.st_dev, info.st_ino) in seen:
                os.link(seen[info.st_dev, info.st_ino], dst)
                continue
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISREG(info.st_mode):
                shutil.copyfile(src, dst)
            elif stat.S_ISFIFO(info.st_mode):
                os.mkfifo(dst)
            elif stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                os.mknod(dst, stat.S_IFCHR, 0)
            else:
                raise OSError(f"{src}: not a file this copy makes")
            shutil.copystat(src, dst, follow_symlinks=False)
            if info.st_nlink > 1:
                seen[info.st_dev, info.st_ino] = dst
    for folder, names, _files in os.walk(source, topdown=False):  # folders last: filling them changed their times
        for name in [*names, ""]:
            src, dst = os.path.join(folder, name), os.path.join(target, os.path.relpath(folder, source), name)
            if not os.path.islink(src):
                shutil.copystat(src, dst.rstrip("/") or dst, follow_symlinks=False)


def _small(folder: Path) -> bool:
    """Whether ``folder`` holds at most ``COPY_LIMIT_BYTES`` of data in at most ``COPY_LIMIT_ENTRIES`` entries
    (stops reading as soon as it does not)."""
    total, count, pending = 0, 0, [str(folder)]
    try:
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    count += 1
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if count > COPY_LIMIT_ENTRIES or total > COPY_LIMIT_BYTES:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    except OSError:
        return False
    return True


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
    """Put ``backend`` on a copy-on-write view over ``held`` (topmost first), with a fresh writable layer (a spare's
    holder, waiting, mounts it now: ``spares.py``)."""
    res = backend._res
    upper, work = res.root / "upper", res.root / "work"
    waiting = res.view is not None and res.view.waiting
    if not waiting:
        upper.mkdir()
        work.mkdir()
    os.chmod(upper, os.stat(held[0].tree).st_mode & 0o7777)  # the workspace folder's own mode, as it was
    if waiting:
        res.view.mount([layer.tree for layer in held])  # type: ignore[union-attr]
    else:
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


def _adopt(child: LocalBackend, point: ForkPoint, held: list[layers.Layer]) -> None:
    """Give ``child`` (new, never reset) the point's state: counts, seeds, files and commands (its shell is started
    by ``_start_shells``); its view is being mounted when this returns."""
    for name, value in point.state.items():
        setattr(child, name, copy.deepcopy(value))
    files, folder = child._files, Path(point.folder)
    pristine, commands = ((Path(point.sources["pristine"]), Path(point.sources["commands"])) if point.sources
                          else (folder / "pristine", folder / "commands"))
    _link_tree(pristine, files.pristine_dir)
    files.pristine = {key: _moved(Path(path), pristine, files.pristine_dir)
                      for key, path in point.files["pristine"].items()}
    files.secrets, files.task_files = set(point.files["secrets"]), dict(point.files["task_files"])
    files.dataset_sources, files.checked = list(point.files["dataset_sources"]), set(point.files["checked"])
    files.mode = point.files["mode"]
    _link_tree(commands, child._commands)
    child._disk.task_bytes = dict(point.task_bytes)
    with child._disk.lock:
        if point.copy_only:
            _copy_tree(held[0].tree, child.host_workspace)
        else:
            child._res.layers = [layer.share() for layer in held]
            _mount(child, child._res.layers)
        child._confinement.reset_hub_caches()


def _start_shells(envs: Sequence[LocalBackend], point: ForkPoint) -> None:
    """Start the shells of ``envs`` (all at once: each sandbox starts while the others do), set each up as after a
    reset, and give each the point's shell state (unsandboxed, the working directory moved into the env's own
    folder)."""
    started = []
    for env in envs:
        with contextlib.suppress(OSError):  # as a new session after a reset: a workspace the agent locked opens
            mode = os.stat(env.host_workspace).st_mode
            if mode & 0o700 != 0o700:
                os.chmod(env.host_workspace, (mode & 0o7777) | 0o700)
        started.append(env._new_session(env._res.cgroup, env._res.memory))
    for env, session in zip(envs, started, strict=True):
        cwd = point.shell.cwd
        if not point.sandboxed and Path(cwd).is_relative_to(point.task_workspace):
            cwd = str(env.task_workspace / Path(cwd).relative_to(point.task_workspace))
        env._set_up(session, then=ShellState(cwd, point.shell.exports).restore_script())


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
