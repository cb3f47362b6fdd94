"""MLGym's trajectory files: ``<task>.traj`` and ``results.json``, read and written.

A ``.traj`` is a JSON object ``{environment, trajectory, history, info}``; each ``trajectory`` entry has the keys
``state`` (the state JSON before the action), ``response`` (the model's raw text), ``thought``, ``action`` (the parsed
action, before heredoc guarding), ``execution_time`` and ``observation``. ``history`` is the system message, then the
user and assistant turns (assistant turns also carry ``thought`` and ``action``); there is no user message after the
last step. ``results.json`` is ``{"agent": info["score"], "baseline": baseline_scores[0]}``, plus (ours) the status of
every evaluation of the episode (``"evaluations"``) and the count of ``infra_error`` ones (``"infra_errors"``).

A step a model produced may carry its tokens too (``TOKEN_KEYS``, ours, absent otherwise): ``response_tokens`` (the
ids sampled), ``log_probs`` (one per sampled id, when the policy gave them), ``policy_version``, and the prompt's ids
stored against the previous step's: ``prompt_tokens_kept`` leading ids of the previous step's prompt then response (0
when it starts otherwise), then ``prompt_tokens``. ``Trajectory.turn_tokens()`` gives each step's whole prompt back.
``outcome`` (``"length"``, ``"overflow"``) and ``masked`` record the env's context policy on that step.
A step answered by a model server also records the call (``CALL_KEYS``, ours, absent in older files and for other
policies): ``finish_reason`` (the server's, e.g. ``stop`` or ``length``; null when it gave none), ``model_seconds``
(the call's time, retries included) and ``usage`` (``prompt_tokens``, ``completion_tokens``; null when the answer had
no usage).

``TrajectoryWriter`` rewrites both files after every step, each through a temporary file and an atomic rename, so an
interrupted run leaves the steps done so far in a complete, loadable file.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.protocol import EVALUATIONS_KEY, infra_errors
from ..bounded_json import loads as load_json
from ..errors import MLGymRegistryError
from .regular_files import IrregularFile, read_regular_text

STEP_KEYS = ("action", "observation", "response", "state", "thought", "execution_time")
"""The keys of every entry of a ``.traj`` file's ``trajectory`` list."""

TOKEN_KEYS = ("prompt_tokens_kept", "prompt_tokens", "response_tokens", "log_probs", "policy_version", "outcome",
              "masked")
"""Optional keys of a ``trajectory`` entry (ours): the step's tokens and its context outcome, when known."""

CALL_KEYS = ("finish_reason", "model_seconds", "usage")
"""Optional keys of a ``trajectory`` entry (ours): the model call behind the step, when the policy made one."""

TRAJ_KEYS = ("environment", "trajectory", "history", "info")
"""The top-level keys of a ``.traj`` file."""

AGENT_NAME = "primary"
"""The ``agent`` tag put on history items (MLGym tags them with its agent's name)."""


class TrajectoryError(MLGymRegistryError, ValueError):
    """A file that is not a valid MLGym ``.traj`` (or ``results.json``)."""


@dataclass(kw_only=True)
class TurnTokens:
    """What a turn's model gave beside its text (a policy that runs a model gives it), and the env's context outcome:
    the fields a ``Step`` and an episode's ``Turn`` share."""

    prompt_tokens: list[int] | None = None
    """The whole prompt's token ids (in memory; the file stores them against the previous step's sequence)."""
    response_tokens: list[int] | None = None
    log_probs: list[float] | None = None
    policy_version: int | None = None
    outcome: str = ""
    """The env's context outcome (``"length"``, ``"overflow"``, ``"length+overflow"``), ``""`` for none."""
    masked: bool = False
    call: dict[str, Any] | None = None
    """The model call behind the response (``CALL_KEYS``), for a policy that calls a model server; else None."""


@dataclass
class Step(TurnTokens):
    """One entry of a trajectory: what the model said, what ran and what came back."""

    action: str
    observation: str | None
    response: str
    state: str
    thought: str
    execution_time: float = 0.0

    def to_dict(self, previous: Step | None = None) -> dict[str, Any]:
        """The entry in MLGym's key order, then the token keys that are known; ``previous`` is the step before,
        whose prompt and response this step's prompt may continue."""
        entry = {key: getattr(self, key) for key in STEP_KEYS}
        if self.prompt_tokens is not None:
            kept = 0
            if previous is not None and previous.prompt_tokens is not None and previous.response_tokens is not None:
                # the whole previous sequence (tokens mode), else its prompt (a policy that re-tokenizes the turn)
                for before in (previous.prompt_tokens + previous.response_tokens, previous.prompt_tokens):
                    if self.prompt_tokens[: len(before)] == before:
                        kept = len(before)
                        break
            entry["prompt_tokens_kept"] = kept
            entry["prompt_tokens"] = self.prompt_tokens[kept:]
        for key in ("response_tokens", "log_probs", "policy_version"):
            if getattr(self, key) is not None:
                entry[key] = getattr(self, key)
        if self.outcome:
            entry["outcome"] = self.outcome
        if self.masked:
            entry["masked"] = True
        if self.call is not None:
            entry.update({key: self.call.get(key) for key in CALL_KEYS})
        return entry


@dataclass
class Trajectory:
    """A loaded ``.traj``: the steps, the chat history and the final ``info``."""

    environment: str
    steps: list[Step]
    history: list[dict[str, Any]]
    info: dict[str, Any]
    path: Path | None = None

    @property
    def responses(self) -> list[str]:
        """The model's raw response of every step, in order."""
        return [step.response for step in self.steps]

    def turn_tokens(self) -> list[tuple[list[int], list[int], list[float] | None] | None]:
        """Each step's ``(prompt ids, response ids, log-probs)``, as the model read and sampled them (None for a step
        recorded without tokens)."""
        return [None if step.prompt_tokens is None or step.response_tokens is None
                else (step.prompt_tokens, step.response_tokens, step.log_probs) for step in self.steps]

    @property
    def scores(self) -> list[dict[str, float]]:
        """``info["score"]``: one metric dict per successful validate, then the final one."""
        return list(self.info.get("score") or [])

    @property
    def task_id(self) -> str | None:
        """The task id taken from the file name (MLGym names the file ``<task.id>.traj``), if loaded from a file."""
        return self.path.stem if self.path is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the ``.traj`` file."""
        return {
            "environment": self.environment,
            "trajectory": [step.to_dict(self.steps[i - 1] if i else None) for i, step in enumerate(self.steps)],
            "history": self.history,
            "info": self.info,
        }


def load_traj(path: str | Path) -> Trajectory:
    """Read and check an MLGym ``.traj`` file; ``TrajectoryError`` says what is wrong with it (also when it is not a
    regular file, or larger than ``regular_files.MAX_FILE_BYTES``: then it is never opened, or not read whole)."""
    path = Path(path)
    return trajectory_from_dict(_read_json(path, "trajectory file"), path)


TEXT_STEP_FIELDS = ("action", "observation", "state", "thought")
"""Step fields of a ``.traj`` that hold text or null (``response`` must be text: it is what gets replayed)."""


def load_recorded(path: Path) -> Trajectory:
    """Read a recorded ``.traj`` to replay; ``TrajectoryError`` says in one line what is wrong with the file."""
    where = f"trajectory file {str(path)!r}"
    if path.is_dir():
        raise TrajectoryError(f"{where} is a folder; pass the .traj file in it")
    try:
        recorded = load_traj(path)
    except UnicodeDecodeError:
        raise TrajectoryError(f"{where} is not text (a binary file?); an MLGym .traj is a JSON object") from None
    for index, step in enumerate(recorded.steps):
        if not isinstance(step.response, str):
            raise TrajectoryError(f"{where}: step {index}: 'response' must be text, got {type(step.response).__name__}")
        for name in TEXT_STEP_FIELDS:
            value = getattr(step, name)
            if value is not None and not isinstance(value, str):
                raise TrajectoryError(f"{where}: step {index}: {name!r} must be text, got {type(value).__name__}")
    return recorded


def _read_json(path: Path, what: str) -> Any:
    """The JSON in ``path``; ``TrajectoryError`` naming ``what`` when it is missing or not JSON."""
    try:
        return load_json(read_regular_text(path))
    except FileNotFoundError:
        raise TrajectoryError(f"{what} {str(path)!r} does not exist") from None
    except IrregularFile as exc:  # a FIFO, socket, device or folder (never opened), or a file over the cap
        raise TrajectoryError(f"{what} {exc}") from None
    except UnicodeDecodeError:
        raise
    except json.JSONDecodeError as exc:
        raise TrajectoryError(f"{what} {str(path)!r} is not valid JSON: {exc}") from exc
    except ValueError as exc:  # nested too deep (``bounded_json.JSONTooDeep``), an integer with too many digits
        raise TrajectoryError(f"{what} {str(path)!r} is not usable JSON: {exc}") from None
    except MemoryError:
        raise TrajectoryError(f"{what} {str(path)!r} is too large to read into memory") from None


def trajectory_from_dict(data: Any, path: Path | None = None) -> Trajectory:
    """A ``Trajectory`` from the JSON object of a ``.traj`` file, checked for MLGym's keys."""
    where = f"trajectory file {str(path)!r}" if path else "trajectory"
    if not isinstance(data, dict):
        raise TrajectoryError(f"{where} must hold a JSON object, got {type(data).__name__}")
    missing = [key for key in TRAJ_KEYS if key not in data]
    if missing:
        raise TrajectoryError(f"{where} lacks the key(s) {missing}; an MLGym .traj has {list(TRAJ_KEYS)}")
    if not isinstance(data["trajectory"], list) or not isinstance(data["history"], list):
        raise TrajectoryError(f"{where}: 'trajectory' and 'history' must be lists")
    steps = []
    for index, entry in enumerate(data["trajectory"]):
        absent = [key for key in STEP_KEYS if key not in entry] if isinstance(entry, dict) else list(STEP_KEYS)
        if absent:
            raise TrajectoryError(f"{where}: step {index} lacks the key(s) {absent}")
        steps.append(_step_from_entry(entry, steps[-1] if steps else None))
    info = data["info"] if isinstance(data["info"], dict) else {}
    return Trajectory(str(data["environment"]), steps, list(data["history"]), dict(info), path)


def _step_from_entry(entry: dict[str, Any], previous: Step | None) -> Step:
    """A ``Step`` from a ``trajectory`` entry, its prompt's token ids made whole again from ``previous``'s."""
    step = Step(**{key: entry[key] for key in STEP_KEYS})
    prompt = entry.get("prompt_tokens")
    if isinstance(prompt, list):
        kept = entry.get("prompt_tokens_kept") or 0
        before = ([] if previous is None or previous.prompt_tokens is None or previous.response_tokens is None
                  else previous.prompt_tokens + previous.response_tokens)
        if not isinstance(kept, int) or kept > len(before):
            raise TrajectoryError(f"a step keeps {kept!r} token ids of a previous step that has {len(before)}")
        step.prompt_tokens = before[:kept] + prompt
    for key in ("response_tokens", "log_probs", "policy_version"):
        if entry.get(key) is not None:
            setattr(step, key, entry[key])
    step.outcome = str(entry.get("outcome") or "")
    step.masked = bool(entry.get("masked", False))
    if any(key in entry for key in CALL_KEYS):
        step.call = {key: entry.get(key) for key in CALL_KEYS}
    return step


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a ``results.json``: ``{"agent": [metric dicts], "baseline": metric dict}``."""
    path = Path(path)
    data = _read_json(path, "results file")
    if not isinstance(data, dict) or not isinstance(data.get("agent"), list) or "baseline" not in data:
        raise TrajectoryError(f"results file {str(path)!r} must be {{'agent': [...], 'baseline': {{...}}}}")
    return data


@functools.cache
def current_umask() -> int:
    """This process's umask, read once (a writer saves after every step) without changing it where the system says
    it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: the only portable way to read it is to set it
    os.umask(mask)
    return mask


def atomic_write_json(path: Path, data: Any, default: Callable[[Any], Any] | None = None) -> None:
    """Write ``data`` as JSON (indented) to ``path`` through a temporary file in the same folder, an ``fsync`` and an
    atomic rename (``atomic_write_text``). ``default``: what ``json.dumps`` calls for a value JSON cannot hold (else
    such a value raises ``TypeError``)."""
    atomic_write_text(path, json.dumps(data, indent=2, default=default))


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and an atomic rename: a reader (or a
    process killed meanwhile) sees the old file or the new one, never half of one. ``durable``: ``fsync`` before the
    rename, so that the new text also survives the machine losing power. The file gets the mode the user's umask
    gives new files (``mkstemp`` alone would leave it readable by its owner only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def lined_json(data: dict[str, Any], default: Callable[[Any], Any] | None = None,
               encoded: dict[str, list[str]] | None = None) -> str:
    """A JSON object as text with each of its keys on a line of its own, and each item of a list value on a line of
    its own (a trajectory's steps, its messages), each item written compactly. ``encoded``: for some list keys, their
    items already written (``item_json``), used instead of the values in ``data``.

    ``json.dumps(indent=2)`` reads alike, but any ``indent`` makes ``json`` use its pure-Python encoder, about ten
    times slower than its C one: a trajectory is written again at every step, and at 200 steps that cost a run's
    recording process more CPU than the envs it recorded."""
    encode = item_json(default)
    lines = []
    for key, value in data.items():
        items = (encoded or {}).get(key)
        if items is None and isinstance(value, list):
            items = [encode(item) for item in value]
        if items:
            lines.append(f"  {encode(key)}: [\n    " + ",\n    ".join(items) + "\n  ]")
        else:
            lines.append(f"  {encode(key)}: {encode(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def item_json(default: Callable[[Any], Any] | None = None) -> Callable[[Any], str]:
    """The compact encoder ``lined_json`` writes each item with (``json``'s C encoder)."""
    return json.JSONEncoder(default=default).encode


@dataclass
class _EncodedItems:
    """The items of one of a writer's lists already written as JSON (``item_json``), in order: a trajectory only
    grows, so a save encodes only what was added since the last one, and costs the same at any episode length."""

    items: list[Any] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def update(self, items: list[Any], encode: Callable[[int], str]) -> list[str]:
        """The lines of ``items``: those kept from the last call while ``items`` starts with the same objects, the
        others written by ``encode(index)``."""
        kept = 0
        for known, item in zip(self.items, items, strict=False):
            if known is not item:
                break
            kept += 1
        del self.items[kept:], self.lines[kept:]
        for index in range(kept, len(items)):
            self.lines.append(encode(index))
            self.items.append(items[index])
        return self.lines


@dataclass
class TrajectoryWriter:
    """Records an episode as MLGym's ``<out>/<task_id>.traj`` and ``<out>/results.json``, saved after every change.

    Call ``system`` once, then for each turn ``user`` (the prompt the model saw) and ``step`` (what it answered and
    what came of it), and ``finish`` with the last ``info``.
    """

    out_dir: Path
    task_id: str
    baseline: dict[str, float] | None = None
    environment: str = "mlgym_registry"
    steps: list[Step] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    failure: str = ""
    provenance: dict[str, Any] | None = None
    """How the run was made (``records.provenance.provenance_record``), saved as ``"run"`` in both files."""
    _batches: int = field(default=0, init=False, repr=False)
    _unsaved: bool | None = field(default=None, init=False, repr=False)
    """None: nothing waits to be saved; else a save is due at the end of the batch (True: an ``fsync``'d one)."""
    _results_written: str | None = field(default=None, init=False, repr=False)
    _steps_written: _EncodedItems = field(default_factory=_EncodedItems, init=False, repr=False)
    _history_written: _EncodedItems = field(default_factory=_EncodedItems, init=False, repr=False)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The calls made inside the block save both files once, when it ends (a turn's step and the prompt of the
        next turn: one write instead of two), also when the block raises."""
        self._batches += 1
        try:
            yield
        finally:
            self._batches -= 1
            if not self._batches and self._unsaved is not None:
                self.save(durable=self._unsaved)

    @property
    def traj_path(self) -> Path:
        """``<out>/<task_id>.traj``."""
        return self.out_dir / f"{self.task_id}.traj"

    @property
    def results_path(self) -> Path:
        """``<out>/results.json``."""
        return self.out_dir / "results.json"

    def system(self, content: str) -> None:
        """Record the system message."""
        self.history.append({"role": "system", "content": content, "agent": AGENT_NAME})
        self.save()

    def user(self, content: str) -> None:
        """Record the prompt of the next turn."""
        self.history.append({"role": "user", "content": content, "agent": AGENT_NAME})
        self.save()

    def tool(self, content: str, tool_call_id: str) -> None:
        """Record the answer to a tool call (native tool calling: it prompts the next turn, as ``user`` does)."""
        self.history.append({"role": "tool", "content": content, "tool_call_id": tool_call_id, "agent": AGENT_NAME})
        self.save()

    def step(self, step: Step, info: dict[str, Any] | None = None) -> None:
        """Record a finished step (and the ``info`` after it)."""
        self.steps.append(step)
        self.history.append({
            "role": "assistant",
            "content": step.response,
            "thought": step.thought,
            "action": step.action,
            "agent": AGENT_NAME,
        })
        if info is not None:
            self.info = copy.deepcopy(info)
        self.save()

    def finish(self, info: dict[str, Any] | None = None) -> None:
        """Record the final ``info`` (and, in the run's record, when it ended) and save."""
        if info is not None:
            self.info = copy.deepcopy(info)
        self._ended()
        self.save(durable=True)

    def _ended(self) -> None:
        if self.provenance is not None:
            from .clock import now

            self.provenance["ended"] = now(precise=True)

    def fail(self, reason: str, info: dict[str, Any] | None = None) -> None:
        """Record that the episode failed (its worker died, the run was interrupted, its policy gave up) and why:
        ``results.json`` gets a ``"failed"`` entry beside the scores recorded so far (and ``info``, when given,
        replaces the last one)."""
        self.failure = reason
        if info is not None:
            self.info = copy.deepcopy(info)
        self._ended()
        self.save(durable=True)

    def trajectory(self) -> Trajectory:
        """What has been recorded so far."""
        return Trajectory(self.environment, list(self.steps), list(self.history), dict(self.info), self.traj_path)

    def results(self) -> dict[str, Any]:
        """The ``results.json`` object: the scores so far and the baseline (and why, for an episode that failed)."""
        results: dict[str, Any] = {"agent": list(self.info.get("score") or []), "baseline": self.baseline or {}}
        evaluations = list(self.info.get(EVALUATIONS_KEY) or [])
        if evaluations:
            results["evaluations"] = evaluations
            infra = infra_errors(self.info)
            if infra:
                results["infra_errors"] = infra
        if self.failure:
            results["failed"] = self.failure
        if self.provenance is not None:
            results["run"] = self.provenance
        return results

    def save(self, *, durable: bool = False) -> None:
        """Write both files now, each atomically (or at the end of the ``batch`` block this is called in);
        ``results.json`` only when its text changed. ``durable``: ``fsync`` them too, as ``finish`` and ``fail`` do
        (the saves of every step need not: an atomic rename already leaves a killed run's files whole)."""
        if self._batches:
            self._unsaved = bool(self._unsaved) or durable
            return
        self._unsaved = None
        atomic_write_text(self.traj_path, self._traj_text(), durable=durable)
        results = json.dumps(self.results(), indent=2, default=_default)
        if results != self._results_written or durable:
            atomic_write_text(self.results_path, results, durable=durable)
            self._results_written = results

    def _traj_text(self) -> str:
        """The ``.traj`` text of what is recorded (``Trajectory.to_dict`` written by ``lined_json``), each step and
        message encoded once, when first saved: steps and messages are never changed once recorded."""
        encode, steps, history = item_json(_default), self.steps, self.history
        trajectory = {"environment": self.environment, "trajectory": steps, "history": history, "info": self.info}
        if self.provenance is not None:
            trajectory["run"] = self.provenance
        encoded = {
            "trajectory": self._steps_written.update(
                steps, lambda index: encode(steps[index].to_dict(steps[index - 1] if index else None))),
            "history": self._history_written.update(history, lambda index: encode(history[index])),
        }
        return lined_json(trajectory, default=_default, encoded=encoded)


def _default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
