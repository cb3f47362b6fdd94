"""Plain, JSON-serialisable descriptions of tasks and components.

A ``TaskSpec`` carries everything needed to rebuild an env in another process: the MLGym task-config fields
(``id``, ``description``, ``starter_code``, ``baseline_scores``, ...), the names of the components to build it from,
and, once resolved by the registry, lazy references to those components so that a worker can import them without
any registration having happened in it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidTaskError
from .kinds import COMPONENT_KINDS, KINDS  # noqa: F401 - part of this module's surface
from .submissions import declared_submission, submission_schema
from .trust_rules import check_host_path, check_task_paths, held_back

TASK_ENTRYPOINTS = ("PythonSubmissionTasks", "CSVSubmissionTasks", "ModelSubmissionTasks", "LMSubmissionTasks")
"""MLGym's task classes, the values ``task_entrypoint`` may take."""


class TaskFieldWarning(UserWarning):
    """A task file key that is no field of a task but close to one (``starter_cod``): probably misspelt. It is kept
    in ``extra`` like any other unknown key, so the field it was meant for keeps its default."""


@dataclass(frozen=True)
class ComponentSpec:
    """A registered component: its kind, name, where it comes from and how to import it."""

    kind: str
    name: str
    ref: str | None = None
    distribution: str | None = None
    plugin: str | None = None
    description: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclass
class TaskSpec:
    """A task: MLGym's task-config fields plus the components that run it.

    Relative paths (``starter_code``, ``sample_submission``, ``requirements_path``, dataset ``data_path``) are resolved
    against ``root``. ``baseline_paths``, ``evaluation_paths`` and ``protected_files`` are relative to the agent's
    workspace, as in MLGym. Evaluators read an optional seed from the ``MLGYM_REGISTRY_EVAL_SEED`` environment
    variable: the backend derives it from the run's seed with a key the agent never sees (``seeding.py``) and sets it
    in the evaluator's process only.
    """

    id: str
    name: str = ""
    description: str = ""
    # MLGym task-config fields
    task_entrypoint: str = "PythonSubmissionTasks"
    training_timeout: int | None = 1800
    use_generic_conda: bool = True
    requirements_path: str | None = None
    benchmark_name: str | None = None
    dataset_configs: list[str] = field(default_factory=list)
    datasets: list[dict[str, Any]] = field(default_factory=list)
    starter_code: list[str] = field(default_factory=list)
    baseline_paths: list[str] = field(default_factory=list)
    baseline_scores: list[dict[str, float]] = field(default_factory=list)
    sample_submission: str | None = None
    evaluation_paths: list[str] = field(default_factory=list)
    evaluation_read_only: bool = False
    secret_files: list[str] = field(default_factory=list)
    memory_path: str | None = None
    # ours: workspace files the agent must not be able to change its score through (e.g. the opponent)
    protected_files: list[str] = field(default_factory=list)
    # ours: pip requirement strings of the packages the task's code and evaluator import, besides the lines of
    # requirements_path (None: not declared; see environments.py, which runs the task with an interpreter having them)
    requirements: list[str] | None = None
    # ours, for rewards: the worst honest value of each metric (a failed evaluation is paid as this score, and honest
    # scores beyond it are clipped to it); a reward that replaces it (None: from worst_score, else -1.0); whether the
    # autosubmission after repeated format errors is paid its evaluator score (by default it is paid as a failure)
    worst_score: dict[str, float] = field(default_factory=dict)
    failure_reward: float | None = None
    score_format_exit: bool = False
    # ours: the schema of the submission file (a mapping, see ``submissions.SubmissionSchema`` and docs/tasks.md),
    # checked before the evaluator runs; a malformed one is refused when the spec is made (None: no check)
    submission: dict[str, Any] | None = None
    # ours: the workspace paths (files, folders, modules) the evaluator takes from the agent: its declared
    # submission. Every other input of the evaluator is the task's own pristine file (None: the default of the task's
    # entrypoint, ``submissions.declared_submission``)
    submission_files: list[str] | None = None
    # ours: the best value each metric can take (rmse 0, accuracy 1): a score past it is an invalid submission,
    # never paid (``best_scores.past_best``)
    best_score: dict[str, float] = field(default_factory=dict)
    # ours
    root: str | None = None
    source: str | None = None
    max_steps: int = 50
    backend: str = "local"
    parser: str = "thought_action"
    template: str = "mlgym_default"
    reward: str = "mlgym_best_improvement"  # pays no farming; the reference chain's is "mlgym_score_delta"
    isolator: str = "code_block"
    history: str = "full"
    backend_options: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    aliases_file: str | None = None
    components: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    registered_as: str | None = field(default=None, compare=False)
    """The name the registry was asked for (``mlgym/<id>`` for a namespaced task), for messages to name the task as
    the user does (``mlgym-registry prepare NAME``); None for a spec that did not come from the registry."""

    def __post_init__(self) -> None:
        if self.submission is not None:
            submission_schema(self)  # raises SubmissionSchemaError (an InvalidTaskError) naming the task and the fix
        if self.submission_files is not None:
            declared_submission(self)  # the same, for an entry outside the workspace

    # -- serialisation -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``TaskSpec.from_dict(spec.to_dict()) == spec``."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSpec:
        """Rebuild a spec from ``to_dict()`` output (or any dict of known fields); unknown keys go to ``extra``."""
        known = {f.name for f in dataclasses.fields(cls)}
        data = copy.deepcopy(dict(data))
        if "id" not in data:
            raise InvalidTaskError(f"a task spec needs an 'id'; got keys {sorted(data)}")
        extra = dict(data.pop("extra", {}) or {})
        extra.update({k: data.pop(k) for k in list(data) if k not in known})
        return cls(**data, extra=extra)

    def to_json(self) -> str:
        """The spec as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TaskSpec:
        """Rebuild a spec from ``to_json()``."""
        return cls.from_dict(json.loads(text))

    # -- helpers -------------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> TaskSpec:
        """A deep copy with ``changes`` applied (the spec itself is never modified)."""
        return dataclasses.replace(copy.deepcopy(self), **changes)

    def resolve_path(self, path: str | Path) -> Path:
        """``path`` made absolute against ``root`` (or returned as is when already absolute)."""
        path = Path(path)
        if path.is_absolute() or self.root is None:
            return path
        return Path(self.root) / path

    @property
    def baseline(self) -> dict[str, float] | None:
        """The first baseline score dict (MLGym uses ``baseline_scores[0]``), or None."""
        return self.baseline_scores[0] if self.baseline_scores else None

    @property
    def gym_id(self) -> str:
        """MLGym's gym id for this task: ``mlgym/<id>``."""
        return f"mlgym/{self.id}"


BASELINE_COMMAND_KEY = "baseline_command"
"""A task extra: the shell command that makes the baseline's submission, when it is not ``python <baseline>``."""


def baseline_command(spec: TaskSpec) -> str | None:
    """The shell command that produces the baseline's submission in the agent's workspace (what ``check`` scores and
    the scripted policy runs): the task's ``baseline_command`` extra, else ``python <script>`` for a CSV task's first
    ``baseline_paths`` script that is not its evaluator; None when the starter code is the baseline as it is."""
    declared = spec.extra.get(BASELINE_COMMAND_KEY)
    if declared:
        return str(declared)
    evaluator = spec.evaluation_paths[0] if spec.evaluation_paths else None
    scripts = [path for path in spec.baseline_paths if path != evaluator]
    if scripts and spec.task_entrypoint == "CSVSubmissionTasks":
        return f"python {scripts[0]}"
    return None


def read_yaml_mapping(path: Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The mapping in the YAML file ``path``; ``error`` naming ``what`` when it is missing, not YAML or no mapping."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} {str(path)!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise error(f"{what} {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data


def load_task_yaml(path: str | Path, *, root: str | Path | None = None, **defaults: Any) -> TaskSpec:
    """Load a task file in MLGym's task-config shape (plus our optional fields) into a ``TaskSpec``.

    ``root`` is the folder relative paths in the file are resolved against; it defaults to the file's ``root:`` key
    (relative to the file) or else the file's own folder. ``defaults`` fill fields the file leaves out.
    """
    path = Path(path)
    data = read_yaml_mapping(path, "task file", InvalidTaskError)
    if "id" not in data:
        raise InvalidTaskError(f"task file {str(path)!r} has no 'id' field; MLGym task configs need one")
    merged = {**defaults, **held_back(data, str(path))}  # a task file never decides its confinement: trust_rules
    own_folder = Path(root) if root is not None else path.parent
    if root is None:
        root = (path.parent / merged["root"]).resolve() if merged.get("root") else path.parent.resolve()
        check_host_path(str(path), "root", merged.get("root"), own_folder)
    merged["root"] = str(root)
    merged["source"] = str(path.resolve())
    merged.setdefault("name", merged["id"])
    list_fields = ("baseline_paths", "evaluation_paths", "starter_code", "dataset_configs", "secret_files", "tags")
    for key in (*list_fields, "protected_files"):
        if merged.get(key) is None:
            merged[key] = []
        merged[key] = [str(item) for item in merged[key]]
    if merged.get("requirements") is not None:
        if not isinstance(merged["requirements"], list):
            raise InvalidTaskError(f"task file {str(path)!r}: requirements must be a list of pip requirement strings")
        merged["requirements"] = [str(item) for item in merged["requirements"]]
    if merged.get("submission_files") is not None:
        if not isinstance(merged["submission_files"], list):
            raise InvalidTaskError(f"task file {str(path)!r}: submission_files must be a list of workspace paths "
                                   "(files, folders or modules the evaluator reads from the agent)")
        merged["submission_files"] = [str(item) for item in merged["submission_files"]]
    spec = TaskSpec.from_dict(merged)
    _check_types(spec, path)
    check_task_paths(spec, str(path), own_folder)
    for key, field_name in misspelt_fields(spec).items():
        warnings.warn(misspelt_field_message(str(path), key, field_name), TaskFieldWarning, stacklevel=2)
    return spec


def misspelt_fields(spec: TaskSpec) -> dict[str, str]:
    """The keys of ``spec.extra`` that are close to a field of ``TaskSpec`` (a misspelling, not a free-form extra),
    each with the field it is close to. Other unknown keys are free-form extras and are not listed."""
    known = [f.name for f in dataclasses.fields(TaskSpec) if f.name not in ("extra", "registered_as")]
    close = {key: difflib.get_close_matches(key, known, n=1, cutoff=0.8) for key in spec.extra}
    return {key: match[0] for key, match in close.items() if match}


def misspelt_field_message(where: str, key: str, field_name: str) -> str:
    """The warning for a task file key ``key`` that looks like the field ``field_name`` misspelt."""
    return (f"task file {where!r}: unknown key {key!r}, kept as a free-form extra; did you mean {field_name!r}? "
            f"Rename it to {field_name!r} (until then {field_name!r} keeps its default)")


def _check_types(spec: TaskSpec, path: Path) -> None:
    if not isinstance(spec.baseline_scores, list) or not all(isinstance(s, dict) for s in spec.baseline_scores):
        raise InvalidTaskError(f"task file {str(path)!r}: baseline_scores must be a list of metric dicts")
    if not isinstance(spec.max_steps, int) or spec.max_steps < 1:
        raise InvalidTaskError(f"task file {str(path)!r}: max_steps must be a positive integer")


@dataclass
class ResolvedTask:
    """A task spec with its components imported and built: what ``chain.build_env`` consumes.

    Not serialisable (it holds objects); send ``spec.to_dict()`` across processes instead.
    """

    spec: TaskSpec
    backend_factory: Any
    parser: Any
    template: Any
    reward: Any
    isolator: Any
    history: Any = None
    backend_options: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    """Where each component came from (``{"reward": "from my-dist"}``), for error messages about it."""

    def make_backend(self) -> Any:
        """A new backend for this task (``backend_factory(spec, **backend_options)``)."""
        return self.backend_factory(self.spec, **self.backend_options)
