"""The local backend's checks at ``make``: tasks and options it refuses before anything starts, and the interpreter it
runs the agent's shell and the evaluator with.

``blockers`` lists everything that stops a task from running here, each with the error ``make`` would raise for it:
``make`` raises the first (``check_task``), ``mlgym-registry prepare`` reports them all once it has made what it can,
so the two never disagree.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

from ...errors import BackendUnavailable, MissingTaskPackages, MLGymRegistryError, TaskFilesMissing
from ...preparation import datasets as datasets_mod
from ...preparation import hub_datasets as hub_datasets_mod
from ...preparation.virtualenvs import task_python
from ...specs import TaskSpec
from . import sandbox as sandbox_mod

AGENT_CODE_IN_EVALUATOR = "agent_code_in_evaluator"
"""A task extra: its evaluator must import the agent's code into its own process (to trace it with a JIT compiler,
say), so the agent's code could print or change the score."""
AGENT_SIDE_FILES = "agent_side_files"
"""A task extra: pristine workspace files (``protected_files``) that its evaluator imports as the agent's code, so
they run in the agent's sandboxed process, never the evaluator's: the RL tasks' policy, which loads the agent's
network, and answers each step's observations with actions (``tasks/data/rl``)."""
NEEDS = "needs"
"""A task extra: what its evaluator or baseline needs beyond packages and data, ``{"devices": ["cuda"], "models":
["bert-base-uncased"]}``: a CUDA device it asserts, Hugging Face models it loads by name."""


@dataclass(frozen=True)
class Blocker:
    """One thing that stops a task from running on this machine: its kind (``packages``, ``data``, ``models``,
    ``devices`` or ``trust``) and the error ``make`` raises for it, whose message names the fix."""

    kind: str
    error: MLGymRegistryError

    def __str__(self) -> str:
        return f"{self.kind}: {self.error}"


def blockers(spec: TaskSpec, *, data_dir: str | None = None, python: str | None = None,
             trust_agent_code: bool = False, **_options: Any) -> list[Blocker]:
    """Everything that stops ``spec`` from running on this backend here, in the order ``make`` checks them."""
    found = []
    checks = [("trust", lambda: refuse_untrusted_evaluator(spec, trust_agent_code)),
              ("packages", lambda: interpreter(python, spec)), *host_checks(spec, data_dir)]
    for kind, check in checks:
        try:
            check()
        except (BackendUnavailable, MissingTaskPackages, TaskFilesMissing) as exc:
            found.append(Blocker(kind, exc))
    return found


def host_checks(spec: TaskSpec, data_dir: str | None) -> list[tuple[str, Any]]:
    """``(kind, check)`` for what this host must have for the task beyond its packages: a device it needs, its
    data, the models it loads."""
    return [("devices", lambda: refuse_missing_devices(spec)),
            *(("data", check) for check in dataset_checks(spec, data_dir)),
            *(("models", check) for check in model_checks(spec))]


def refuse_unservable(spec: TaskSpec, data_dir: str | None) -> None:
    """Raise the first of ``host_checks``' errors: a device, the data or a model the task needs is not here."""
    for _kind, check in host_checks(spec, data_dir):
        check()


def needs(spec: TaskSpec, what: str) -> list[str]:
    """The task's declared ``needs`` of one kind (``devices`` or ``models``), as strings."""
    declared = spec.extra.get(NEEDS) or {}
    if not isinstance(declared, dict):
        raise TaskFilesMissing(f"task {spec.id!r}: {NEEDS} must be a mapping such as {{devices: [cuda], models: "
                               f"[bert-base-uncased]}}, not {declared!r}")
    values = declared.get(what) or []
    return [str(value) for value in ([values] if isinstance(values, str) else values)]


def refuse_missing_devices(spec: TaskSpec) -> None:
    """A task that needs a CUDA device (``needs: {devices: [cuda]}``) on a host without NVIDIA device nodes."""
    if "cuda" in needs(spec, "devices") and not sandbox_mod.gpu_devices():
        raise BackendUnavailable(
            f"task {spec.id!r} needs a CUDA device (its evaluator or baseline asserts one), and this host has no "
            "NVIDIA device nodes (/dev/nvidia*): run it on a machine with an NVIDIA GPU and its driver, with gpus=True"
        )


def model_checks(spec: TaskSpec) -> list[Any]:
    """One check per Hugging Face model the task loads by name (``needs: {models: [...]}``)."""
    return [lambda model=model: refuse_missing_model(spec, model) for model in needs(spec, "models")]


def hub_cache() -> str:
    """The Hugging Face cache folder as the environment names it now (``HF_HUB_CACHE``, else ``$HF_HOME/hub``):
    huggingface_hub reads these once, when it is first imported."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return explicit
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser(
        "~/.cache"), "huggingface")
    return os.path.join(home, "hub")


def refuse_missing_model(spec: TaskSpec, model: str) -> None:
    """A model the task loads by name that this machine's Hugging Face cache does not hold: the sandbox has no
    network, so the evaluator could not download it."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json", cache_dir=hub_cache()), str):
        return
    raise TaskFilesMissing(
        f"task {spec.id!r} loads the Hugging Face model {model!r} by name, which is not in this machine's Hugging "
        f"Face cache and cannot be downloaded from the sandbox (no network): on a machine with network access run "
        f"`huggingface-cli download {model}` with the same HF_HOME, then copy that cache here"
    )


def agent_code_in_evaluator(spec: TaskSpec) -> bool:
    """Whether ``spec``'s evaluator runs the agent's code in its own process (``AGENT_CODE_IN_EVALUATOR``)."""
    return bool(spec.extra.get(AGENT_CODE_IN_EVALUATOR))


def agent_side_files(spec: TaskSpec) -> list[str]:
    """The workspace paths of ``spec``'s pristine files that run on the agent's side (``AGENT_SIDE_FILES``)."""
    declared = spec.extra.get(AGENT_SIDE_FILES) or []
    if isinstance(declared, str) or not all(isinstance(path, str) for path in declared):
        raise TaskFilesMissing(f"task {spec.id!r}: {AGENT_SIDE_FILES} must be a list of workspace paths such as "
                               f"[rl_policy.py], not {declared!r}")
    return list(declared)


def refuse_untrusted_evaluator(spec: TaskSpec, trust_agent_code: bool) -> None:
    """A task whose evaluator runs the agent's code in-process is refused unless the user trusts that code: the
    agent could forge every score of it."""
    if agent_code_in_evaluator(spec) and not trust_agent_code:
        raise BackendUnavailable(
            f"local backend: task {spec.id!r} declares {AGENT_CODE_IN_EVALUATOR}: its evaluator runs the agent's code "
            "(its model) in the evaluator's own process, so the agent could print or change its score. Pass "
            "trust_agent_code=True to run it anyway (for trusted policies and debugging, never to train on), or run "
            "it on the mlgym backend"
        )


def refuse_missing_gpus() -> None:
    """``gpus=True`` on a host without NVIDIA device nodes is refused."""
    if not sandbox_mod.gpu_devices():
        raise BackendUnavailable(
            "local backend: gpus=True, but this host has no NVIDIA device nodes (/dev/nvidia*): install the NVIDIA "
            "driver, or leave gpus off"
        )


def dataset_checks(spec: TaskSpec, data_dir: str | None) -> list[Any]:
    """One check per local dataset (it must be found), and one per Hugging Face hub dataset the task loads by name
    (the task must declare its scored splits' answers, and the dataset's local copy must be here:
    ``preparation.hub_datasets``)."""
    checks: list[Any] = [lambda dataset=dataset: datasets_mod.find_local_dataset(spec, dataset, data_dir)
                         for dataset in datasets_mod.local_datasets(spec)]
    return [*checks, *(lambda repo_id=repo_id: hub_datasets_mod.find_copy(spec, repo_id, data_dir)
                       for repo_id in datasets_mod.hub_datasets(spec))]


def interpreter(python: str | None, spec: TaskSpec) -> str:
    """The absolute path of the ``python=`` option's interpreter (a path or a command name on ``PATH``); without one,
    the task's (``task_python``: this process's when it has the task's packages, else the environment
    ``mlgym-registry prepare`` made; ``MissingTaskPackages`` when there is none)."""
    if python is None:
        return task_python(spec)
    found = shutil.which(python)
    if found is None:
        raise ValueError(
            f"local backend: python={python!r} is not an executable found on this machine; pass the path of a Python "
            "interpreter, e.g. python='/path/to/venv/bin/python'"
        )
    return os.path.abspath(found)
