"""What a recorded run says about how it was made: the ``"run"`` entry of its ``results.json`` and ``.traj``.

A run records the task (the name it was asked for, its id, a hash of its spec and files), the components it ran
with (name, distribution and version), the seed, ``max_steps`` and backend options, the policy (its kind, model,
endpoint without credentials, sampling settings, the file a replay replays), the versions of Python and the packages
its numbers depend on, and when it started and ended. No keys: an endpoint is recorded without user, password or
query. With the seed, ``run --policy replay:PATH`` (and ``replay``) rebuild the run as it was on the same
installation: the evaluator's seed is derived from the seed and the installation's key (see ``seeding.py``).

A record read back may come from anywhere: readers take settings from it only through ``records.trust.split_record``,
which lets it choose the task, components, seed and ``max_steps``, and never the backend or its options.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..specs import COMPONENT_KINDS, TaskSpec
from .regular_files import read_regular_text

KEY = "run"
"""The key of the record in ``results.json`` and in the ``.traj``."""
PACKAGES = ("mlgym-registry", "torch", "torchrl", "tensordict", "transformers", "openai")
"""The packages whose versions a run records (``package_versions``): its numbers depend on them."""
HASHED_FILE_LIMIT = 64 * 1024 * 1024
"""Files larger than this enter a task's hash by name and size only (datasets)."""
UNHASHED_FIELDS = ("root", "source", "registered_as")
"""Spec fields that say where a task was loaded from or how it was named, not what is played."""
LATER_FIELDS: dict[str, Any] = {"requirements": None}
"""Spec fields added after runs were first recorded, with their defaults: left out of the hash while at their
default, so that a folder recorded before them still resumes."""


def component_record(kind: str, name: str) -> dict[str, Any]:
    """``{"name", "distribution", "version"}`` of a registered component (distribution None when unknown)."""
    from ..registry import registry

    record: dict[str, Any] = {"name": name, "distribution": None, "version": None}
    try:
        info = registry.entry(kind, name).info()
    except Exception:  # noqa: BLE001 - a component given by path or ref: its name is all there is to record
        return record
    record["distribution"] = info.distribution
    if info.distribution:
        try:
            record["version"] = metadata.version(info.distribution)
        except metadata.PackageNotFoundError:
            pass
    return record


def policy_record(policy: Any) -> dict[str, Any]:
    """The policy's kind, model, endpoint (without credentials), sampling settings and replayed file, as known."""
    record: dict[str, Any] = {"name": getattr(policy, "name", type(policy).__name__)}
    for attribute in ("model", "source"):
        value = getattr(policy, attribute, None)
        if value is not None:
            record[attribute] = str(value)
    url = getattr(policy, "url", None)
    if url:
        record["endpoint"] = public_endpoint(str(url))
    sampling = getattr(policy, "sampling", None)
    if isinstance(sampling, dict) and sampling:
        record["sampling"] = dict(sampling)
    return record


def provenance_record(spec: TaskSpec, policy: Any, seed: int | None) -> dict[str, Any]:
    """The provenance record of a run of ``spec`` by ``policy`` with ``seed``, started now (``ended`` is set at its
    end)."""
    from .clock import now

    return {
        "task": {"name": spec.registered_as or spec.id, "id": spec.id, "hash": task_hash(spec),
                 "file": spec.source},
        "components": {kind: component_record(kind, getattr(spec, kind)) for kind in COMPONENT_KINDS},
        "seed": seed,
        "max_steps": spec.max_steps,
        "backend_options": dict(spec.backend_options),
        "policy": policy_record(policy),
        "versions": package_versions(),
        "started": now(precise=True),
        "ended": None,
    }


def recorded_run(path: str | Path) -> dict[str, Any] | None:
    """The ``"run"`` record of a recorded episode (its ``.traj``, or the ``results.json`` beside it or given),
    None when it has none (MLGym's own runs, or ours from before records). Untrusted: take settings from it through
    ``records.trust.split_record`` only."""
    path = Path(path)
    candidates = [path] if path.suffix == ".json" else [path, path.with_name("results.json")]
    for candidate in candidates:
        try:
            data = json.loads(read_regular_text(candidate))  # never a FIFO or device beside the run
        except (OSError, ValueError):
            continue
        record = data.get(KEY) if isinstance(data, dict) else None
        if isinstance(record, dict):
            return record
    return None


def public_endpoint(url: str | None) -> str | None:
    """``url`` without user, password, query or fragment: where a key could hide."""
    if not url:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def package_versions() -> dict[str, str | None]:
    """The versions of Python and of the packages a run's numbers depend on (None: not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def task_hash(spec: TaskSpec) -> str:
    """``sha256:...`` of the task as played: its spec (without where it was loaded from) and the contents of its
    starter code, sample submission, requirements and memory files."""
    digest = hashlib.sha256()
    data = {k: v for k, v in spec.to_dict().items()
            if k not in UNHASHED_FIELDS and not (k in LATER_FIELDS and v == LATER_FIELDS[k])}
    digest.update(json.dumps(data, sort_keys=True).encode())
    named = [*spec.starter_code, spec.sample_submission, spec.requirements_path, spec.memory_path]
    for name in (n for n in named if n):
        for path, label in _files(spec.resolve_path(name), name):
            digest.update(f"\0{label}\0".encode())
            _hash_file(digest, path)
    return "sha256:" + digest.hexdigest()


def _files(path: Path, label: str) -> Iterable[tuple[Path, str]]:
    if path.is_dir():
        for here, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = Path(here) / name
                yield full, f"{label}/{full.relative_to(path).as_posix()}"
    else:
        yield path, label


def _hash_file(digest: Any, path: Path) -> None:
    try:
        size = path.stat().st_size
        if size > HASHED_FILE_LIMIT:
            digest.update(f"size {size}".encode())
            return
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        digest.update(b"missing")
