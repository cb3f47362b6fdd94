"""What the scripted agent knows about each task of our suite: the file it edits and the strategies it tries.

Each candidate is a complete replacement for the editable file. The scripted agent writes them one after another,
validates each, and submits the best, so it adapts to whatever opponent pool a task's evaluator actually uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    """A strategy to try: a short label, why it might work, and the full text of the file."""

    label: str
    reason: str
    code: str


@dataclass(frozen=True)
class Playbook:
    """How to play a task: the file to edit and the candidates to try, most promising first."""

    editable: str
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    setup: tuple[str, ...] = ()
    """Commands to run (one per step) after writing a candidate and before validating it (e.g. a training script)."""


_PD_DEFECT = '''\
def row_strategy(history):
    """Defect every round: against a pool of mostly reactive or random partners this earns the most per round."""
    return 1
'''

_PD_PUNISH = '''\
def row_strategy(history):
    """Defect by default; cooperate only after the partner cooperated twice in a row, to harvest reciprocators."""
    if len(history) >= 2 and history[-1][1] == 0 and history[-2][1] == 0:
        return 0
    return 1
'''

_BOS_INSIST = '''\
def row_strategy(history):
    """Always choose our preferred option 0, so that partners who adapt learn to meet us there."""
    return 0
'''

_BOS_FOLLOW = '''\
def row_strategy(history):
    """Open with 0, keep 0 while we coordinate on it, otherwise meet the partner where they last went."""
    if not history:
        return 0
    mine, theirs = history[-1]
    if mine == theirs:
        return mine
    return theirs
'''

_BLOTTO_FIVE = '''\
import random


def row_strategy(history):
    """Give up one random battlefield and split the 120 soldiers evenly over the other five."""
    allocation = [24] * 6
    allocation[random.randrange(6)] = 0
    return allocation
'''

_BLOTTO_EVEN = '''\
def row_strategy(history):
    """Spread the 120 soldiers evenly: 20 on each of the six battlefields."""
    return [20] * 6
'''

PLAYBOOKS: dict[str, Playbook] = {
    "prisonersDilemma": Playbook(
        "strategy.py",
        (
            Candidate("always defect", "Defection pays 5 or 1 against any move, cooperation only 3 or 0.", _PD_DEFECT),
            Candidate(
                "defect, reward steady cooperators",
                "Cooperating after two cooperative rounds may keep reciprocating partners cooperative.",
                _PD_PUNISH,
            ),
        ),
    ),
    "battleOfSexes": Playbook(
        "strategy.py",
        (
            Candidate("insist on 0", "Sticking to our preferred option lets adaptive partners coordinate on it.",
                      _BOS_INSIST),
            Candidate("coordinate", "Following the partner after a miss recovers coordination quickly.", _BOS_FOLLOW),
        ),
    ),
    "blotto": Playbook(
        "strategy.py",
        (
            Candidate("five strong fronts", "Concentrating on five fields beats spread-out random allocations.",
                      _BLOTTO_FIVE),
            Candidate("even split", "An even split never leaves a field empty.", _BLOTTO_EVEN),
        ),
    ),
}
"""Playbooks by task id. A task without one gets the generic plan: look around, validate the starter code, submit."""


def playbook_for(task_id: str | None) -> Playbook | None:
    """The playbook of ``task_id`` (``mlgym/<id>`` names map to ``<id>``), or None."""
    if not task_id:
        return None
    return PLAYBOOKS.get(task_id.split("/")[-1])
