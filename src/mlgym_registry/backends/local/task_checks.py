"""The local backend's checks at ``make``: tasks and options it refuses before anything starts, and the interpreter it
runs the agent's shell and the evaluator with."""

from __future__ import annotations

import os
import shutil

from ...errors import BackendUnavailable, TaskFilesMissing
from ...preparation import datasets as datasets_mod
from ...preparation.virtualenvs import task_python
from ...specs import TaskSpec
from . import sandbox as sandbox_mod

AGENT_CODE_IN_EVALUATOR = "agent_code_in_evaluator"
"""A task extra: its evaluator must import the agent's code into its own process (to trace it with a JIT compiler,
say), so the agent's code could print or change the score."""


def agent_code_in_evaluator(spec: TaskSpec) -> bool:
    """Whether ``spec``'s evaluator runs the agent's code in its own process (``AGENT_CODE_IN_EVALUATOR``)."""
    return bool(spec.extra.get(AGENT_CODE_IN_EVALUATOR))


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


def refuse_unservable_datasets(spec: TaskSpec, data_dir: str | None) -> None:
    """At construction, not at the first reset: a local dataset that is nowhere (``TaskFilesMissing`` names where
    it was looked for), or a Hugging Face hub dataset, which this backend cannot serve offline and whose test labels
    the agent could load with the network on."""
    for dataset in datasets_mod.local_datasets(spec):
        datasets_mod.find_local_dataset(spec, dataset, data_dir)
    hub = datasets_mod.hub_datasets(spec)
    if hub:
        raise TaskFilesMissing(
            f"task {spec.id!r} loads the Hugging Face dataset(s) {', '.join(map(repr, hub))} by name, which the local "
            "backend does not serve: it has no network by default, and with it the agent could load the test split's "
            "labels it is scored on. Run this task on the mlgym backend (MLGym's containers), or give it a local copy "
            "without the test labels (a dataset with is_local: true and the answers in secret_files)"
        )


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
