"""Random 3-SAT instances in the file MLGym's ``3SATTime`` task reads, for a checkout that lacks MLGym's own.

MLGym's repository does not ship the instances its 3-SAT task times the agent's heuristic on. Its evaluator reads
``data/dataset.pkl`` of the workspace (the dataset config ``datasets/3SAT.yaml`` puts the folder
``data/3SATTime/data`` there): a pickled list of tuples ``(index, num_vars, num_clauses, clauses, is_sat,
solution)``, ``clauses`` a list of clauses, each a list of non-zero integer literals (``-v`` is the negation of
variable ``v``, numbered from 1), ``is_sat`` whether the formula has a satisfying assignment, ``solution`` None. It
solves every instance after the first three with its DPLL solver and the agent's heuristic, and fails the run when a
verdict differs from ``is_sat``.

This module writes such a file from uniform random 3-CNF formulas (three distinct variables a clause, each negated
with probability one half), whose ``is_sat`` it decides with a DPLL solver of its own. The same arguments give the
same file (on one Python version); the formulas are not MLGym's, so scores on them are not comparable with MLGym's
published ones::

    python -m mlgym_registry.tasks.sat_instances --out ~/.cache/mlgym-registry/data/data/3SATTime/data \\
        --count 1000 --vars 12 --seed 0

MLGym's own file holds numpy ``int64`` literals; these are Python ints, which its solver and heuristics treat alike.
"""

from __future__ import annotations

import argparse
import pickle
import random
from pathlib import Path

FILE_NAME = "dataset.pkl"
"""The file name MLGym's 3-SAT evaluator reads in the dataset's folder."""
DATASET_FOLDER = "data/3SATTime/data"
"""The dataset's folder relative to a data folder (``data_path`` of MLGym's ``datasets/3SAT.yaml``)."""
PHASE_TRANSITION = 4.26
"""Clauses per variable near which random 3-SAT formulas are satisfiable about half the time, and hardest."""

Clause = list[int]
Instance = tuple[int, int, int, list[Clause], bool, None]


def random_formula(rng: random.Random, num_vars: int, num_clauses: int) -> list[Clause]:
    """``num_clauses`` clauses over the variables 1..``num_vars``, three distinct variables each, random signs."""
    return [[var if rng.random() < 0.5 else -var for var in rng.sample(range(1, num_vars + 1), 3)]
            for _ in range(num_clauses)]


def satisfiable(clauses: list[Clause]) -> bool:
    """Whether the CNF formula ``clauses`` has a satisfying assignment (DPLL: unit propagation, then branching)."""
    return _solve([frozenset(clause) for clause in clauses])


def _assign(clauses: list[frozenset[int]], literal: int) -> list[frozenset[int]] | None:
    """The clauses left once ``literal`` is true: those it satisfies dropped, its negation struck from the others;
    None when that empties a clause."""
    left = []
    for clause in clauses:
        if literal in clause:
            continue
        if -literal in clause:
            clause = clause - {-literal}
            if not clause:
                return None
        left.append(clause)
    return left


def _solve(clauses: list[frozenset[int]] | None) -> bool:
    """DPLL on clauses as sets of literals."""
    while clauses:
        unit = next((clause for clause in clauses if len(clause) == 1), None)
        if unit is None:
            break
        clauses = _assign(clauses, next(iter(unit)))
    if clauses is None:
        return False
    if not clauses:
        return True
    literal = next(iter(clauses[0]))
    return _solve(_assign(clauses, literal)) or _solve(_assign(clauses, -literal))


def instances(count: int, num_vars: int, ratio: float = PHASE_TRANSITION, seed: int = 0) -> list[Instance]:
    """``count`` random instances with ``num_vars`` variables and ``round(ratio * num_vars)`` clauses each, as MLGym's
    file holds them: ``(index, num_vars, num_clauses, clauses, is_sat, None)``."""
    if num_vars < 3:
        raise ValueError(f"a 3-SAT clause needs three distinct variables: --vars must be at least 3, not {num_vars}")
    num_clauses = max(1, round(ratio * num_vars))
    rng = random.Random(seed)
    made = []
    for index in range(count):
        clauses = random_formula(rng, num_vars, num_clauses)
        made.append((index, num_vars, num_clauses, clauses, satisfiable(clauses), None))
    return made


def write_instances(out: str | Path, made: list[Instance]) -> Path:
    """Write the instances ``made`` to ``out/dataset.pkl`` (making ``out``); returns the file's path."""
    folder = Path(out).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    path.write_bytes(pickle.dumps(made, protocol=4))
    return path


def default_out() -> Path:
    """Where ``make`` looks first without ``data_dir``: the dataset's folder in the first data folder."""
    from ..preparation.datasets import data_folders

    return data_folders()[0] / DATASET_FOLDER


def main(argv: list[str] | None = None) -> int:
    """The command line: write the instances, print the file's path and how many are satisfiable."""
    parser = argparse.ArgumentParser(prog="python -m mlgym_registry.tasks.sat_instances", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the folder to write {FILE_NAME} to (default: {DATASET_FOLDER} in $MLGYM_REGISTRY_DATA, "
                             "else in ~/.cache/mlgym-registry/data)")
    parser.add_argument("--count", type=int, default=1000, help="how many instances (default 1000)")
    parser.add_argument("--vars", type=int, default=12, help="variables per instance (default 12)")
    parser.add_argument("--ratio", type=float, default=PHASE_TRANSITION,
                        help=f"clauses per variable (default {PHASE_TRANSITION})")
    parser.add_argument("--seed", type=int, default=0, help="the random seed (default 0)")
    args = parser.parse_args(argv)
    try:
        made = instances(args.count, args.vars, args.ratio, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    path = write_instances(args.out or default_out(), made)
    print(f"{path}: {len(made)} instances, {sum(item[4] for item in made)} satisfiable")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
