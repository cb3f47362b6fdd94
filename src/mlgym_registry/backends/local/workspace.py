"""The local backend's workspace at each reset: the task's starter files, its datasets (read-only), pristine copies of
the evaluation and protected files, and its secret files taken out of the agent's sight."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from ...errors import TaskFilesMissing
from ...preparation import datasets as datasets_mod
from ...specs import TaskSpec
from ...trust_rules import check_links
from . import trees
from .evaluation import force_rmtree


class WorkspaceFiles:
    """Fills ``workspace`` for a new episode of ``spec``, and remembers what evaluations must put back or see.

    ``pristine`` maps a workspace path (relative) to the copy an evaluation puts back over whatever the agent left
    there; ``secrets`` are the workspace paths taken out of the agent's sight (evaluations still see them);
    ``dataset_sources`` are the folders the local datasets were copied from (hidden from the sandbox);
    ``task_files`` maps the workspace name of every starter file to the task's own copy of it, from which an
    evaluation's view takes whatever the agent does not submit.
    """

    def __init__(self, spec: TaskSpec, workspace: Path, pristine_dir: Path, data_dir: str | None):
        self.spec = spec
        self.workspace = workspace
        self.pristine_dir = pristine_dir
        self.data_dir = data_dir
        self.mode = stat.S_IMODE(workspace.stat().st_mode)
        """The workspace folder's own permissions, given back when it is emptied for a new episode."""
        self.pristine: dict[str, Path] = {}
        self.secrets: set[str] = set()
        self.dataset_sources: list[Path] = []
        self.task_files: dict[str, Path] = {}
        self.checked: set[Path] = set()
        """The sources ``_check_links`` found free of links out of the task's folder."""

    def prepare(self) -> None:
        """Empty the workspace and fill it for a new episode: starter files, protected copies, datasets, secrets."""
        workspace = self.workspace
        # emptied in place: removing the folder the last sandbox mounted waits for the kernel to detach that mount
        if not trees.empty_folder(workspace, self.mode):
            force_rmtree(workspace)
            workspace.mkdir()
        self.task_files = {}
        for item in self.spec.starter_code:
            source = self.spec.resolve_path(item)
            if not source.exists():
                raise TaskFilesMissing(
                    f"task {self.spec.id!r}: starter_code path {str(source)!r} does not exist; check the task file's "
                    f"starter_code entries and its root ({self.spec.root!r})"
                )
            self._check_links("starter_code", source)
            target = workspace / source.name
            self.task_files[source.name] = source
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target)
        self._protect()
        self._copy_datasets()
        self._hide_secrets()

    def _copy_datasets(self) -> None:
        """Local datasets into ``workspace/data``, read-only; evaluations see the task's own copy, not the agent's."""
        data = self.workspace / "data"
        self.dataset_sources = []
        for dataset in datasets_mod.local_datasets(self.spec):
            source = datasets_mod.find_local_dataset(self.spec, dataset, self.data_dir)
            self._check_links("data_path", source)
            self.dataset_sources.append(source)
            target = data if not data.exists() else data / source.name
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                target.mkdir(parents=True, exist_ok=True)
                target = target / source.name
                shutil.copy2(source, target)
            self.pristine[str(target.relative_to(self.workspace))] = source
        if data.exists():
            _chmod_tree(data, 0o555)

    def _check_links(self, key: str, source: Path) -> None:
        """Refuse a starter file or dataset of the task's own folder that is, or holds, a link out of it (the copy
        would follow it and hand a host file to the agent); each source is walked once per backend."""
        if source not in self.checked:
            check_links(self.spec.source or self.spec.id, key, source, self.spec.root)
            self.checked.add(source)

    def _hide_secrets(self) -> None:
        """Take ``spec.secret_files`` (e.g. a test set's answers) out of the workspace; evaluations still see them."""
        for relative in self.spec.secret_files:
            path = self.workspace / relative
            if not path.exists():
                continue
            covered = any(relative == key or relative.startswith(key.rstrip("/") + "/") for key in self.pristine)
            if not covered:
                self._keep_pristine(relative)
            self.secrets.add(relative)
            if path.is_dir():
                force_rmtree(path)
            else:
                path.unlink()

    def _protect(self) -> None:
        """Keep pristine copies of the evaluation and protected files; show them read-only in the workspace."""
        # the evaluation files are always put back before an evaluation; evaluation_read_only only decides whether
        # the agent's copy is shown read-only, as in MLGym
        guarded = {p: 0o555 if self.spec.evaluation_read_only else None for p in self.spec.evaluation_paths}
        guarded.update({p: 0o444 for p in self.spec.protected_files})
        if not trees.empty_folder(self.pristine_dir, 0o700):
            force_rmtree(self.pristine_dir)
            self.pristine_dir.mkdir()
        self.pristine = {}
        for relative, mode in guarded.items():
            source = self.workspace / relative
            if not source.exists():
                continue
            self._keep_pristine(relative)
            if mode is not None:
                _chmod_tree(source, mode)

    def _keep_pristine(self, relative: str) -> None:
        """Copy ``workspace/relative`` aside; evaluations put this copy back over whatever the agent left there."""
        source, copy = self.workspace / relative, self.pristine_dir / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, copy)
        else:
            shutil.copy2(source, copy)
        self.pristine[relative] = copy


def _chmod_tree(path: Path, mode: int) -> None:
    if path.is_dir():
        for folder, _dirs, files in os.walk(path):
            for name in files:
                os.chmod(os.path.join(folder, name), mode)
        for folder, _dirs, _files in sorted(os.walk(path), reverse=True):
            os.chmod(folder, mode if mode & 0o111 else mode | 0o111)
    else:
        os.chmod(path, mode)
