"""Playing one canary: its commands through the task's real env (``registry.make``) and backend, as an agent's.

The canary's commands become responses in the env's parser's format, one per turn, then ``submit``; the env runs
them in the sandbox and scores with the task's pristine evaluator, exactly as for an agent. The episode's turns are
kept with their observations and ``info``, so its reward can be read under every reward the audit covers (each a
fresh assigner fed the same steps, as the env feeds its own).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..policies.base import Policy, PolicyExhausted
from ..policies.scripted import in_format
from ..specs import TaskSpec
from .canaries import Canary

SUBMIT = "submit"


class CanaryPolicy(Policy):
    """Answers with the canary's commands, one per turn, in the env's parser's format; then ``submit``."""

    name = "canary"

    def __init__(self, canary: Canary, parser: Any = None):
        self.canary = canary
        self.parser = parser
        self._queue: list[str] = []
        self.reset()

    def reset(self, spec: Any = None) -> None:
        self._queue = [*self.canary.commands, *([SUBMIT] if self.canary.submits else [])]

    def respond(self, messages: Any) -> str:
        if not self._queue:
            raise PolicyExhausted(f"canary {self.canary.name!r} has no command left")
        return in_format(self.parser, f"canary {self.canary.name}", self._queue.pop(0))


@dataclass
class Played:
    """One canary's episode: its steps (observation, info, the env's reward) and how it ended."""

    canary: Canary
    observations: list[str] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    env_rewards: list[float] = field(default_factory=list)
    spec: TaskSpec | None = None
    """The spec the env played (the task's, with the audit's overrides)."""
    seconds: float = 0.0
    error: str = ""
    """Why the episode could not be played (the env raised); '' when it was."""
    traces: list[dict[str, list[str]]] = field(default_factory=list)
    """Played with ``trace``: what the evaluator trusted at each evaluation (``LocalBackend.last_evaluation_trace``),
    with ``foreign``, the inputs it read that are neither the task's nor the declared submission."""
    submitted: list[str] = field(default_factory=list)
    """Played with ``trace``: the declared submission's paths, and the cells and lines of its files as the last
    evaluation found them, to tell what the evaluator ran of them."""
    provenance: dict[str, Any] | None = None
    """How the episode was made (``records.provenance``): its task, seed and components, for ``replay``."""
    validate_rows: Any = None
    """Played with ``trace``: the episode's ``held_out.RowSplit`` (which rows validate scores), None when validate
    scores every row."""
    calls: tuple = ()
    """The episode as its recorder's calls (``records.recorder.CallRecorder``): what an exploit's ``.traj`` is
    written from (``save_episode``), so that ``mlgym-registry replay`` plays it again."""
    files: dict[str, str] = field(default_factory=dict)
    """Played with ``trace``, for a CSV task: the text of its submission (``submission``), of its answers
    (``answers``: the schema's ``rows_from``, else a secret CSV file, from the task's own copy) and of the other CSV
    files of the workspace (``other:<path>``), as the last evaluation found them: what metamorphic canaries start
    from."""

    @property
    def scores(self) -> list[dict[str, float]]:
        """Every score the evaluator gave in the episode, in order."""
        from ..scores import score_entry_metrics

        found = []
        for entry in (self.infos[-1].get("score") or []) if self.infos else []:
            try:
                found.append(score_entry_metrics(entry))
            except (TypeError, ValueError):
                continue
        return found

    @property
    def statuses(self) -> list[str]:
        """The status of each evaluation of the episode (``ok``, ``invalid_submission``, ``infra_error``...)."""
        from ..backends.protocol import EVALUATIONS_KEY

        return list((self.infos[-1].get(EVALUATIONS_KEY) or []) if self.infos else [])

    @property
    def exit_status(self) -> str:
        return str(self.infos[-1].get("exit_status") or "") if self.infos else ""

    def rewards(self, reward: Any, spec: TaskSpec | None = None) -> list[float]:
        """Each step's reward under ``reward`` (a fresh assigner), fed the steps the env fed its own (a step the
        backend never saw pays 0, as in the env)."""
        spec = spec or self.spec
        return [float(reward(observation, info, spec)) if info else 0.0
                for observation, info in zip(self.observations, self.infos, strict=True)]


def play(env: Any, spec: TaskSpec, canary: Canary, *, seed: int, parser: Any = None, trace: bool = False) -> Played:
    """Play ``canary`` once on ``env`` (reset with ``seed``); what the env raised is kept in ``error``. With
    ``trace``, on a backend that can say (the local one), what the evaluator trusted at each evaluation is kept."""
    from ..episodes.episode import EpisodePlayer
    from ..records.recorder import CallRecorder

    played = Played(canary)
    policy = CanaryPolicy(canary, parser)
    started = time.monotonic()
    backend = None
    recorder = CallRecorder()
    try:
        player = EpisodePlayer(env, policy, spec=spec, seed=seed, max_turns=len(canary.commands) + 2,
                               writer=recorder)
        player.start()
        played.spec = player.base.task.spec
        backend = player.base.backend if trace and hasattr(player.base.backend, "trace_evaluations") else None
        if backend is not None:
            backend.trace_evaluations = True
        while (turn := player.play_turn()) is not None:
            info = player.base.last_info  # None on a step the backend never saw (a reply it could not parse)
            played.observations.append(player.base.last_observation if info is not None else "")
            played.infos.append(dict(info or {}))
            played.env_rewards.append(turn.reward)
            if backend is not None and (info or {}).get("evaluation_status"):
                _keep_trace(played, backend)
    except Exception as exc:  # noqa: BLE001 - a canary the env cannot play is reported, and the audit goes on
        played.error = f"{type(exc).__name__}: {exc}"
    finally:
        if backend is not None:
            backend.trace_evaluations = False
    played.calls = recorder.take()
    played.provenance = recorder.provenance
    played.seconds = time.monotonic() - started
    return played


def save_episode(played: Played, folder: Any) -> Any:
    """Write ``played``'s episode as our ``.traj`` and ``results.json`` in ``folder`` (made if needed); the
    ``.traj``'s path, which ``mlgym-registry replay`` plays on the task, its seed and components recorded."""
    from pathlib import Path

    from ..records.recorder import replay
    from ..records.trajectories import TrajectoryWriter

    spec = played.spec
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    task_id = spec.id.replace("/", "_") if spec is not None else played.canary.name
    writer = TrajectoryWriter(folder, task_id, baseline=spec.baseline if spec is not None else None,
                              environment=f"mlgym_registry:{spec.backend}" if spec is not None else "mlgym_registry")
    writer.provenance = played.provenance
    replay(played.calls, writer)
    return folder / f"{task_id}.traj"


MAX_SUBMITTED_BYTES = 1 << 20
"""The most of each declared submission file read for its cells."""


def _keep_trace(played: Played, backend: Any) -> None:
    """The backend's trace of the evaluation just run, and the cells and lines of the declared submission."""
    from ..submissions import declared_submission

    trace = dict(backend.last_evaluation_trace)
    trace["foreign"] = backend.foreign_inputs(trace.get("opened", []))
    played.traces.append(trace)
    pieces: set[str] = set()
    for relative in declared_submission(backend.spec):
        pieces.add(relative)
        path = backend.host_workspace / relative
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                text = handle.read(MAX_SUBMITTED_BYTES).decode("utf-8", "replace")
            for line in text.splitlines():
                pieces.update(piece.strip() for piece in (line, *line.split(",")) if piece.strip())
    played.submitted = sorted(pieces)
    played.files = _csv_files(backend)
    split = backend.row_split()
    played.validate_rows = None if split is None else split


def _csv_files(backend: Any) -> dict[str, str]:
    """The submission, the answers and the workspace's other CSV files of a CSV task, as text (see ``files``)."""
    from ..submissions import submission_schema

    spec = backend.spec
    if spec.task_entrypoint != "CSVSubmissionTasks":
        return {}
    schema = submission_schema(spec)
    submission = schema.file if schema is not None else "submission.csv"
    answers = schema.rows_from if schema is not None and schema.rows_from else next(
        (s for s in spec.secret_files if s.endswith(".csv")), None)
    found: dict[str, str] = {}
    for key, path in (("submission", backend.host_workspace / submission),
                      ("answers", backend.task_file(answers) if answers else None)):
        text = _read(path)
        if text is not None:
            found[key] = text
    others = sorted(p for p in backend.host_workspace.rglob("*.csv")
                    if p.is_file() and not p.is_symlink() and p != backend.host_workspace / submission)
    for path in others[:MAX_OTHER_FILES]:
        text = _read(path)
        if text is not None:
            found[f"other:{path.relative_to(backend.host_workspace)}"] = text
    return found


MAX_OTHER_FILES = 16


def _read(path: Any) -> str | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SUBMITTED_BYTES + 1)
    except (OSError, TypeError):
        return None
    return data.decode("utf-8", "replace") if len(data) <= MAX_SUBMITTED_BYTES else None
