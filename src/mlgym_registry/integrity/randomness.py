"""Whether an evaluator's randomness follows the evaluation's seed, read from its references' traces.

A traced evaluation (the local backend's harness, ``randomness_trace``) says where its randomness came from: each
seed its code gave a generator, with the value and the line; each draw of fresh entropy from the system; each global
generator the harness seeded from the evaluation's seed that it used. The audit plays the honest reference twice
with the same seed and once with another, and reads them here:

- the same seed gave two scores: ``unfollowed`` names what did not follow the seed (the entropy draws, the seeds
  whose values differed), so that NONDETERMINISTIC says where to look;
- another seed gave the same seed value at the same line: ``fixed_seeds``, randomness written in the evaluator,
  which an agent that reads it can predict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SEED, ENTROPY, SEEDED = "seed", "entropy", "seeded"
IMPORT_PREFIX = "the import of "
NOT_THE_TASKS = ("library code", "unknown", IMPORT_PREFIX)
"""How an entry's ``where`` starts when no line of the task's own files led to it."""


@dataclass(frozen=True)
class Draw:
    """One entry of a trace's ``randomness``: ``kind`` (``seed``, ``entropy``, ``seeded``), the call, where, value."""

    kind: str
    source: str
    where: str
    value: str = ""

    @property
    def at(self) -> str:
        return f"{self.source} at {self.where}"

    @property
    def by_the_task(self) -> bool:
        """Whether a line of the task's own files made the call (not a library as it was imported, say)."""
        return not self.where.startswith(NOT_THE_TASKS)


def draws(traces: Iterable[dict]) -> list[Draw]:
    """The randomness entries of ``traces`` (each a traced evaluation's report), in order, once each."""
    found: dict[Draw, None] = {}
    for trace in traces:
        for line in trace.get("randomness") or []:
            parts = str(line).split("|", 3)
            if len(parts) == 4:
                found.setdefault(Draw(*parts), None)
    return list(found)


def unfollowed(first: list[Draw], second: list[Draw]) -> list[str]:
    """What did not follow the seed between two runs with the same seed: every draw of fresh entropy (the task's
    own first), and every seed given at the same line with different values."""
    entropy = [d for d in dict.fromkeys([*first, *second]) if d.kind == ENTROPY]
    entropy.sort(key=lambda d: not d.by_the_task)
    named = [f"{d.at} (fresh entropy from the system)" for d in entropy]
    values: dict[tuple[str, str], list[str]] = {}
    for draw in (*first, *second):
        if draw.kind == SEED:
            values.setdefault((draw.source, draw.where), []).append(draw.value)
    for (source, where), seen in values.items():
        if len(set(seen)) > 1:
            named.append(f"{source} at {where} was given {seen[0]}, then {seen[-1]}")
    return named


def fixed_seeds(reference: list[Draw], other_seed: list[Draw]) -> list[Draw]:
    """The seeds the task's own code gave with the same value under two evaluation seeds."""
    again = {(d.source, d.where, d.value) for d in other_seed if d.kind == SEED}
    return [d for d in reference
            if d.kind == SEED and d.by_the_task and (d.source, d.where, d.value) in again]


def followed(found: list[Draw]) -> list[str]:
    """The global generators the harness seeded from the evaluation seed that the evaluation used (for the card)."""
    return [d.source for d in found if d.kind == SEEDED]


NO_DRAW_SEEN = ("no draw the trace sees differed (the seeds given to random, numpy and torch, the system's entropy): "
                "look for the time, string hashing (PYTHONHASHSEED), threads or processes racing, or files the "
                "evaluation writes and reads back")
