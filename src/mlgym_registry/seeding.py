"""How a user's seed becomes an episode's randomness, without the agent being able to rebuild it.

A run's seed is chosen by the user (``env.set_seed(0)``, ``run --seed 42``) and is small, guessable and often in the
agent's own prompt or logs. So it never reaches anything of the agent's. Every random value an episode needs is
derived from it with a secret of this installation:

    HMAC-SHA256(installation key, purpose | user seed | episode index), first 8 bytes

- ``evaluation``: the seed the evaluator (only its own process) gets, e.g. for the partner's moves of a game;
- ``agent``: the seed of the process that runs the agent's code for the evaluator (its ``random`` and numpy), so a
  stochastic strategy is reproducible too. It reveals nothing about the evaluation seed: both are outputs of a keyed
  function, and the key never enters a sandbox.

The key is 32 random bytes, created on first use (only a seeded run needs it) in ``seed.key`` (mode 0600) under
``$XDG_CONFIG_HOME/mlgym-registry/`` (``~/.config/mlgym-registry/`` by default). ``MLGYM_REGISTRY_SEED_KEY`` (64 hex
digits) overrides it: give two machines the same key and a seed reproduces a score on both. Unseeded episodes draw
fresh randomness from ``secrets`` and need no key.

Episodes of one seed form a stream, as in Gymnasium: ``reset(seed=s)`` starts it at episode 0, and every later reset
without a seed takes the next episode of the same stream.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

KEY_VARIABLE = "MLGYM_REGISTRY_SEED_KEY"
"""Environment variable holding the installation key as hex (overrides the key file)."""
EVALUATION_SEED_VARIABLE = "MLGYM_REGISTRY_EVAL_SEED"
"""The variable through which an evaluator process (and only it) gets its seed, an integer."""
KEY_FILE = "seed.key"
KEY_BYTES = 32

_lock = threading.Lock()
_cached: tuple[str, bytes] | None = None  # (where the key came from, the key)


class SeedKeyError(RuntimeError):
    """The installation key cannot be read or created, or ``MLGYM_REGISTRY_SEED_KEY`` is malformed."""


def key_folder() -> Path:
    """The folder of the installation key: ``$XDG_CONFIG_HOME/mlgym-registry`` or ``~/.config/mlgym-registry``."""
    base = os.environ.get("XDG_CONFIG_HOME", "").strip()
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "mlgym-registry"


def key_path() -> Path:
    """The installation key's file (it may not exist yet)."""
    return key_folder() / KEY_FILE


def installation_key() -> bytes:
    """The installation key: ``MLGYM_REGISTRY_SEED_KEY`` when set, else the key file's (created on first use)."""
    global _cached
    override = os.environ.get(KEY_VARIABLE, "").strip()
    source = f"env:{override}" if override else f"file:{key_path()}"
    with _lock:
        if _cached is not None and _cached[0] == source:
            return _cached[1]
        key = _parse_key(override) if override else _read_or_create(key_path())
        _cached = (source, key)
        return key


def _parse_key(text: str) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise SeedKeyError(f"{KEY_VARIABLE} must be at least 32 hex digits (64 recommended: "
                           "python -c 'import secrets; print(secrets.token_hex(32))')")
    return key


def _read_or_create(path: Path) -> bytes:
    """Read the key file, creating it atomically (mode 0600) when missing; concurrent creators agree on one key."""
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        pending = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(KEY_BYTES).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(pending, path)  # fails when another process created the key first: theirs wins
        except FileExistsError:
            pass
        finally:
            os.unlink(pending)
        return _read(path)
    except OSError as exc:
        raise SeedKeyError(
            f"seeded runs need this installation's seed key, and {str(path)!r} cannot be read or created ({exc}). "
            f"Set {KEY_VARIABLE} to 64 hex digits instead (python -c 'import secrets; print(secrets.token_hex(32))')"
        ) from exc


def _read(path: Path) -> bytes:
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        return _parse_key(text)
    except SeedKeyError:
        raise SeedKeyError(f"the seed key file {str(path)!r} is malformed: delete it to create a new key, or set "
                           f"{KEY_VARIABLE}") from None


def derive(purpose: str, seed: int, episode: int = 0) -> int:
    """A 64-bit value for ``purpose`` from the user's ``seed`` and the ``episode`` index, keyed by this installation.

    Without the key, neither the user seed nor any other derived value says anything about it."""
    message = f"mlgym-registry/{purpose}/{int(seed)}/{int(episode)}".encode()
    digest = hmac.new(installation_key(), message, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True)
class EpisodeSeeds:
    """The seeds of one episode: ``evaluation`` for the evaluator's process only, ``agent`` for the process that runs
    the agent's code. Every validate and the submit of the episode use the same ones."""

    evaluation: int
    agent: int

    @classmethod
    def draw(cls, seed: int | None, episode: int) -> EpisodeSeeds:
        """Episode ``episode`` of the stream of ``seed`` (derived as the module says), or fresh randomness when
        ``seed`` is None."""
        if seed is None:
            return cls(secrets.randbits(64), secrets.randbits(64))
        return cls(derive("evaluation", seed, episode), derive("agent", seed, episode))

    def __repr__(self) -> str:  # never print the evaluation seed by accident (logs, tracebacks)
        return "EpisodeSeeds(...)"


def stream_seed(seed: int, episode: int) -> int:
    """The seed a backend made mid-stream starts its own stream from at episode ``episode`` of ``seed`` (a multi-task
    env swapping to another task's backend): reproducible, and its own for every episode. A 63-bit integer >= 0."""
    return derive("stream", seed, episode) >> 1
