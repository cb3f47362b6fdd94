"""Old import paths kept for one release after the modules moved into folders of their own (docs/concepts.md).

``import mlgym_registry.parallel`` (or any name below) still works: it gives the module at its new path, the very
same object (so monkeypatching, ``isinstance`` and pickling behave as before), and warns once with
``DeprecationWarning`` where to import it from now. Nothing is left at the old paths but this table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

PACKAGE = "mlgym_registry"

MOVED: dict[str, str] = {
    "chain": "transforms.chain",
    "output_checks": "components.output_checks",
    "environments": "preparation.virtualenvs",
    "task_packages": "preparation.task_packages",
    "datasets": "preparation.datasets",
    "episode": "episodes.episode",
    "episode_rules": "transforms.episode_rules",
    "episodes.rules": "transforms.episode_rules",
    "episode_folders": "episodes.folders",
    "evaluator_runs": "evaluation.evaluator_runs",
    "tasks.evaluator_runs": "evaluation.evaluator_runs",
    "tasks.baselines": "evaluation.baselines",
    "parallel": "scale.parallel",
    "workers": "scale.workers",
    "process_episodes": "scale.process_episodes",
    "episode_frames": "scale.frames",
    "frame_receiver": "scale.frame_receiver",
    "episode_runs": "scale.runs",
    "ray_collectors": "scale.ray_collectors",
    "ray_episodes": "scale.ray_episodes",
    "ray_runtime": "scale.ray_runtime",
    "env_factory": "scale.env_factory",
    "_worker_preload": "scale._worker_preload",
    "trajectories": "records.trajectories",
    "provenance": "records.provenance",
    "recorded_files": "records.recorded_files",
    "conversation": "records.conversation",
    "observation_kinds": "records.observation_kinds",
    "clock": "records.clock",
    "record_trust": "records.trust",
    "regular_files": "records.regular_files",
    "gym_env": "faces.gymnasium",
    "gym_registration": "faces.gymnasium_registration",
    "serving": "faces.openenv",
    "tiny_model": "testing.tiny_model",
    "validation": "options",
    "tasks.mlgym_metrics": "scores",
}
"""Each old module name (under the package) and the name it has now."""


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new name."""

    def __init__(self, new: str):
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__  # the import system sets the old name's spec on it: put its own back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, so that ``python -m`` runs a script at its old name too."""
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        return loader.get_code(self.new) if isinstance(loader, importlib.abc.InspectLoader) else None


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of ``MOVED``."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if not fullname.startswith(PACKAGE + "."):
            return None
        new = MOVED.get(fullname[len(PACKAGE) + 1:])
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {PACKAGE}.{new}: import it from there ({fullname} goes in the next "
                      "release)", DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"{PACKAGE}.{new}"))


def install() -> None:
    """Let the old names be imported (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
