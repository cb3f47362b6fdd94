"""The task config MLGym reads, written from the spec as it is now (overrides, replays' starter files,
``spec.replace(...)``), never the checkout's own YAML: paths made absolute, the spec's datasets as dataset configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...specs import TaskSpec

_DATASET_FIELDS = ("name", "description", "data_path", "is_local", "train_split", "valid_split", "test_split")
_TASK_FIELDS = (
    "id", "name", "description", "task_entrypoint", "training_timeout", "use_generic_conda", "requirements_path",
    "benchmark_name", "dataset_configs", "starter_code", "baseline_paths", "baseline_scores", "sample_submission",
    "evaluation_paths", "evaluation_read_only", "secret_files", "memory_path",
)
_PATH_FIELDS = ("starter_code", "requirements_path", "sample_submission")


def write_task_config(spec: TaskSpec, folder: Path) -> str:
    """Write ``spec``'s task config (and its datasets' configs) into ``folder``; return the config's path, which MLGym
    joins onto its ``configs/`` folder (an absolute path stays as it is)."""
    import yaml

    data = {key: getattr(spec, key) for key in _TASK_FIELDS}
    for key in _PATH_FIELDS:
        value = data[key]
        if isinstance(value, list):
            data[key] = [str(spec.resolve_path(item).resolve()) for item in value]
        elif value:
            data[key] = str(spec.resolve_path(value).resolve())
    if spec.datasets:
        data["dataset_configs"] = [_write_dataset(spec, folder, i, d) for i, d in enumerate(spec.datasets)]
    data = {key: value for key, value in data.items() if value is not None}
    path = folder / f"{spec.id}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _write_dataset(spec: TaskSpec, folder: Path, index: int, dataset: dict[str, Any]) -> str:
    import yaml

    data = {key: dataset[key] for key in _DATASET_FIELDS if dataset.get(key) is not None}
    data.setdefault("name", f"dataset{index}")
    data.setdefault("description", "")
    if data.get("is_local"):
        data["data_path"] = str(spec.resolve_path(str(data["data_path"])).resolve())
    path = folder / "datasets" / f"{index}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)
