"""``report`` follows the rules by which MLGym computed its published tables (its ``scripts/evaluation/get_ranks.py``).

Small run folders in MLGym's formats, written here from the formats' fields, check each rule: which runs belong to a
task (by folder name, whatever the ``.traj`` is called), runs without agent scores, where the baseline comes from, how
best and last scores are picked, how runs that failed count, and the AUP. When MLGym's git history is at hand
(``MLGYM_ROOT`` a git checkout of facebookresearch/MLGym, or ``MLGYM_GIT`` a clone or mirror of it), the report over
its published runs is compared with every cell of its published tables (``results/tables``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlgym_registry.cli import main as cli_main
from mlgym_registry.evaluation import metrics
from mlgym_registry.evaluation.published import SHOWN, compare, find_published, read_published
from mlgym_registry.evaluation.report import build_report
from mlgym_registry.evaluation.runs import find_runs, folder_task

CONFIG = "default__t-0.00__p-0.95__c-4.00__install-0__parallel_agents"


def traj_json(agent: list[dict], exit_status: str, api_calls: int) -> dict:
    """A ``.traj`` as MLGym writes it: the steps, the chat history, and ``info`` last."""
    step = {"action": "validate", "observation": "", "response": "", "state": "{}", "thought": "",
            "execution_time": 1.0}
    return {
        "environment": "mlgym_main",
        "trajectory": [step] * max(api_calls, 1),
        "history": [{"role": "system", "content": "..."}],
        "info": {
            "model_stats": {"total_cost": 0.1 * api_calls, "task_cost": 0.1 * api_calls, "tokens_sent": 100 * api_calls,
                            "tokens_received": 10 * api_calls, "api_calls": api_calls},
            "exit_status": exit_status,
            "submission": "/home/agent/workspace/submission.csv",
            "score": agent,
            "summarizer": {},
        },
    }


def mlgym_run(root: Path, model: str, task: str, run: int, agent: list[dict] | None, baseline: dict | None = None,
              traj: str | None = None, exit_status: str = "submitted", api_calls: int = 5,
              folder: str | None = None) -> Path:
    """One run in MLGym's layout, ``metagen-<model>__<task>__<config>_run_<k>/{results.json, <traj>.traj}``.

    ``agent`` None writes a results.json without ``"agent"``; ``traj`` names the ``.traj`` (default ``<task>``).
    """
    here = root / (folder or f"metagen-{model}__{task}__{CONFIG}_run_{run}")
    here.mkdir(parents=True)
    results: dict = {} if agent is None else {"agent": agent}
    if baseline is not None:
        results["baseline"] = baseline
    (here / "results.json").write_text(json.dumps(results, indent=2))
    (here / f"{traj or task}.traj").write_text(json.dumps(traj_json(agent or [], exit_status, api_calls), indent=2))
    return here


def sat(*times: float) -> list[dict]:
    return [{"Time": t, "Correct": 24000, "Incorrect": 0} for t in times]


def reward(*values: float) -> list[dict]:
    return [{"Reward Mean": v, "Reward Std": 1.0} for v in values]


# -- which runs are a task's -------------------------------------------------------------------------------------------


def test_task_comes_from_the_folder_name_whatever_the_traj_is_called():
    assert folder_task(f"metagen-gpt4o2__3SATTime__{CONFIG}_run_0", ["3SATHeuristic.traj"]) == "3SATTime"
    # the other run-folder names MLGym uses: another config, a run number without "parallel_agents"
    assert folder_task("metagen-llama3-405b-tools__imageCaptioningCOCO__default__t-1.00__p-0.95__c-4.00__install-0"
                       "_run_0", ["imageCaptioningCOCO.traj"]) == "imageCaptioningCOCO"
    assert folder_task("metagen-gpt4o2__blotto__better_thought_action_parser_with_insert__t-0.00_run_2",
                       ["x.traj"]) == "blotto"
    assert folder_task("model__task__default__run_0", ["default.traj"]) == "task"  # a later field is no task
    assert folder_task("scripted__my__task__run_0", ["my__task.traj"]) == "my__task"  # a task id holding "__"
    assert folder_task("loose", ["blotto.traj"]) == "blotto"
    assert folder_task("loose", []) == "loose"


def test_runs_whose_traj_is_named_otherwise_stay_in_their_task(tmp_path):
    root = tmp_path / "mlgym_bench_v0"
    base = {"Time": 16.158, "Correct": 24000, "Incorrect": 0}
    mlgym_run(root, "gpt4o2", "3SATTime", 0, sat(15.0, 13.676), base, traj="3SATHeuristic")
    mlgym_run(root, "gpt4o2", "3SATTime", 1, sat(14.0), base)
    mlgym_run(root, "claude-35-sonnet-new", "3SATTime", 0, sat(15.728), base, traj="3SATHeuristic",
              exit_status="autosubmission (max_steps)")
    runs = find_runs([root]).runs
    assert {run.task for run in runs} == {"3SATTime"}
    heuristic = [run for run in runs if run.traj_path is not None and run.traj_path.name == "3SATHeuristic.traj"]
    assert len(heuristic) == 2 and {run.exit_status for run in heuristic} == {"submitted", "autosubmission (max_steps)"}
    report = build_report([root])
    assert report.unranked == {} and [task.task for task in report.board.tasks] == ["3SATTime"]
    assert report.board.best["3SATTime"] == {"baseline": 16.158, "claude-35-sonnet-new": 15.728, "gpt4o2": 13.676}


# -- runs without agent scores, and the baseline -----------------------------------------------------------------------


def test_runs_without_agent_scores_leave_the_cell_empty_but_give_the_baseline(tmp_path):
    """A model whose runs hold no agent score (``"agent": []``, or no ``"agent"`` at all) has no cell and ranks after
    every scored column; its runs still give the baseline. MLGym takes the baseline from the first run recording one
    for the metric, model by model in column order, then folder by folder: here zeta's, although alpha's folders come
    first by name. A baseline under another metric name (``Reward``) is none."""
    root = tmp_path / "runs"
    mlgym_run(root, "alpha", "rlMountainCarContinuous", 0, reward(40.0, 36.0), {"Reward Mean": 30.0})
    mlgym_run(root, "zeta", "rlMountainCarContinuous", 0, [], {"Reward": -0.003},
              exit_status="evaluation_format_error (max_steps)")
    mlgym_run(root, "zeta", "rlMountainCarContinuous", 1, None, {"Reward Mean": 33.794})
    mlgym_run(root, "beta", "rlMountainCarContinuous", 0, reward(12.0), {"Reward Mean": 31.0})
    report = build_report([root], models=["zeta", "beta", "alpha"])
    best = report.board.best["rlMountainCarContinuous"]
    assert best == {"baseline": 33.794, "zeta": None, "beta": 12.0, "alpha": 40.0}
    assert report.board.best_ranks["rlMountainCarContinuous"] == ["alpha", "baseline", "beta", "zeta"]
    assert {s.problem for s in report.incomplete} == {"no agent score"}
    assert any("different baselines" in note for note in report.notes)


# -- best and last -----------------------------------------------------------------------------------------------------


def test_best_is_the_best_attempt_and_last_the_best_final_attempt_over_runs(tmp_path):
    """Per run: best = the best attempt holding the metric, last = its last attempt. Per model: the best of the runs'
    bests and, separately, the best of the runs' lasts (they may come from different runs). Runs with no attempt
    holding the metric do not count."""
    root = tmp_path / "runs"
    base = {"Time": 16.158, "Correct": 24000, "Incorrect": 0}
    mlgym_run(root, "m", "3SATTime", 0, [*sat(12.383), {"Correct": 1}, *sat(12.604)], base)  # best 12.383, last 12.604
    mlgym_run(root, "m", "3SATTime", 1, sat(14.0, 12.9, 13.1), base)  # best 12.9, last 13.1
    mlgym_run(root, "m", "3SATTime", 2, [{"Correct": 5}], base)  # no Time: no score
    mlgym_run(root, "m", "blotto", 0, [{"Score": 0.1}, {"Score": 0.576}, {"Score": 0.2}], {"Score": -0.248})
    mlgym_run(root, "m", "blotto", 1, [{"Score": 0.3}, {"Score": 0.228}], {"Score": -0.248})
    board = build_report([root]).board
    assert board.best["3SATTime"]["m"] == 12.383 and board.last["3SATTime"]["m"] == 12.604
    assert board.best["blotto"]["m"] == 0.576 and board.last["blotto"]["m"] == 0.228


# -- failed runs -------------------------------------------------------------------------------------------------------


def test_mlgym_counts_every_scored_run_whatever_its_exit(tmp_path):
    """MLGym's tables count a run's score whatever its exit status or usage: the API failed (exit_api), or the model
    never answered (api_calls 0: the context overflowed at once and the env scored the autosubmitted starter code).
    The report leaves such runs out by default and says that MLGym counts them; --include-failed counts them."""
    root = tmp_path / "runs"
    mlgym_run(root, "gpt4o2", "rlMountainCarContinuous", 0, reward(-1107.645, -215.776, -216.621),
              {"Reward Mean": 33.794}, exit_status="autosubmission (exit_api)")
    mlgym_run(root, "gpt4o2", "rlMountainCarContinuous", 1, reward(-900.0), {"Reward Mean": 33.794})
    mlgym_run(root, "gpt-o3-mini", "prisonersDilemma", 0, [{"Score": 2.386}], {"Score": 2.372},
              exit_status="autosubmission (exit_context)", api_calls=0)
    strict = build_report([root])
    assert strict.board.best["rlMountainCarContinuous"]["gpt4o2"] == -900.0
    assert strict.board.best["prisonersDilemma"]["gpt-o3-mini"] is None
    note = next(note for note in strict.notes if "left out for their problems" in note)
    assert "MLGym's own tables count every run's score" in note and "--include-failed" in note
    counted = build_report([root], include_failed=True)
    assert counted.board.best["rlMountainCarContinuous"]["gpt4o2"] == -215.776
    assert counted.board.last["rlMountainCarContinuous"]["gpt4o2"] == -216.621
    assert counted.board.best["prisonersDilemma"]["gpt-o3-mini"] == 2.386
    assert not any("left out for their problems" in note for note in counted.notes)


# -- AUP ---------------------------------------------------------------------------------------------------------------


def mlgym_aup(tables: list[tuple[dict[str, float | None], bool]], solvers: list[str]) -> dict[str, float]:
    """AUP by MLGym's rules, written out plainly: per task, scores that are negative or worse than the baseline (and
    missing ones) are infeasible and get the worst feasible ratio times 1.05; tau runs over 500 even points from 0 to
    log10 of the largest ceil(penalty), rounded up to a tenth; the area is the left Riemann sum."""
    ratios, ceilings = [], []
    for scores, higher in tables:
        base = scores["baseline"]
        ok = {n: v for n, v in scores.items() if v is not None and v >= 0 and (v >= base if higher else v <= base)}
        best = max(ok.values()) if higher else min(ok.values())
        worst = (best / min(ok.values())) if higher else (max(ok.values()) / best)
        task = {n: (best / ok[n] if higher else ok[n] / best) if n in ok else worst * 1.05 for n in solvers}
        ratios.append(task)
        ceilings.append(math.ceil(worst * 1.05))
    top = math.ceil(math.log10(max(ceilings)) * 10) / 10
    taus = [top * i / 499 for i in range(500)]
    areas = {}
    for n in solvers:
        shares = [sum(math.log10(task[n]) <= tau for task in ratios) / len(ratios) for tau in taus]
        areas[n] = sum((taus[i + 1] - taus[i]) * shares[i] for i in range(499))
    return areas


def test_aup_follows_mlgyms_rules_on_random_tables():
    rng = random.Random(7)
    models = ["a", "b", "c", "d"]
    for _ in range(20):
        tasks, tables = [], []
        for index in range(4):
            higher = index % 2 == 0
            scores: dict[str, float | None] = {"baseline": rng.uniform(1, 10)}
            for model in models:
                roll = rng.random()
                scores[model] = None if roll < 0.15 else -rng.uniform(0, 5) if roll < 0.25 else rng.uniform(0.5, 20)
            tables.append((scores, higher))
            runs = {m: [(v, v)] for m, v in scores.items() if m != "baseline" and v is not None}
            tasks.append(metrics.TaskResult(f"t{index}", f"t{index}", higher, scores["baseline"], runs))
        board = metrics.leaderboard(tasks, models)
        expected = mlgym_aup(tables, [*models, "baseline"])
        for name, value in expected.items():
            assert board.aup[name][0] == pytest.approx(value, abs=1e-9), name


# -- the report compares itself with published tables found beside the runs --------------------------------------------


def write_table(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def test_report_names_the_published_cells_it_does_not_reproduce(tmp_path):
    root = tmp_path / "MLGym"
    runs = root / "trajectories" / "mlgym_bench_v0"
    mlgym_run(runs, "alpha", "blotto", 0, [{"Score": 0.5}, {"Score": 0.25}], {"Score": -0.248})
    mlgym_run(runs, "beta", "blotto", 0, [{"Score": 0.0885}], {"Score": -0.248})
    mlgym_run(runs, "alpha", "prisonersDilemma", 0, [{"Score": 2.6}], {"Score": 2.372})
    mlgym_run(runs, "beta", "prisonersDilemma", 0, [{"Score": 2.5}], {"Score": 2.372})
    board = build_report([runs]).board
    aup = [["Model", "Best AUP", "Last AUP"]] + [[n, *(f"{v:.3f}" for v in board.aup[n])] for n in board.solvers]
    tables = root / "results" / "tables"
    header = ["Task", "baseline", "alpha", "beta"]
    # "now": what these runs give (0.0885 written as 0.089, as numpy rounds); "old": made from other runs
    for name, alpha_blotto in (("now", "0.5"), ("old", "0.7")):
        write_table(tables / f"best_scores_{name}.csv", [header, ["Prisoners Dilemma", "2.372", "2.6", "2.5"],
                                                        ["Blotto", "-0.248", alpha_blotto, "0.089"]])
        write_table(tables / f"last_scores_{name}.csv", [header, ["Prisoners Dilemma", "2.372", "2.6", "2.5"],
                                                        ["Blotto", "-0.248", "0.25", "0.089"]])
        write_table(tables / f"aup_scores_{name}.csv", aup)
    assert {p.name for p in find_published([runs])} == {"now", "old"}
    out = tmp_path / "report"
    assert cli_main(["report", str(runs), "--out", str(out), "--no-plot"]) == 0
    summary = (out / "summary.md").read_text()
    assert "*_now.csv, cells that match: best_scores 6/6, last_scores 6/6, aup_scores 6/6." in summary
    assert "*_old.csv, cells that match: best_scores 5/6" in summary
    assert "best Blotto / alpha: published 0.7, here 0.5" in summary
    assert "These runs reproduce" in summary and "Reproducing MLGym's tables" in summary
    # another choice of models: the score cells are still compared, the AUP table is not
    comparison = compare(build_report([runs], models=["alpha"]).board, find_published([runs])[0])
    assert comparison.compared == {"best_scores": 4, "last_scores": 4} and comparison.aup_skipped


# -- acceptance: MLGym's published runs against MLGym's published tables -----------------------------------------------

RUNS = "trajectories/mlgym_bench_v0"
TABLES = "results/tables"
KINDS = ("best_scores", "last_scores", "best_ranks", "last_ranks", "aup_scores")
DEFAULT_GIT = Path("/work/.mirror/facebookresearch+MLGym/repo")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True, text=True).stdout


def mlgym_git() -> Path:
    """A git repository of MLGym: ``$MLGYM_ROOT`` when it is a git checkout, else ``$MLGYM_GIT``, else the mirror."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    candidates = [os.environ.get("MLGYM_ROOT"), os.environ.get("MLGYM_GIT"), str(DEFAULT_GIT)]
    for candidate in filter(None, candidates):
        probe = subprocess.run(["git", "-C", candidate, "rev-parse", f"HEAD:{TABLES}"], capture_output=True)
        if probe.returncode == 0:
            return Path(candidate)
    pytest.skip(f"set MLGYM_ROOT (a git checkout) or MLGYM_GIT (a clone) of facebookresearch/MLGym, with {TABLES}")


def blobs(repo: Path, commit: str, paths: list[str]) -> Iterator[tuple[str, bytes | None]]:
    """(path, content) of each file under ``paths`` at ``commit``, streamed from one ``git cat-file --batch``;
    content None for an object the repository lacks (a partial mirror)."""
    listing = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-z", commit, "--", *paths],
                             capture_output=True, check=True).stdout
    entries = [(meta.split()[2], path.decode()) for meta, path in
               (item.split(b"\t", 1) for item in listing.split(b"\0") if item)]
    with subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for sha, path in entries:
            proc.stdin.write(sha + b"\n")
            proc.stdin.flush()
            head = proc.stdout.readline().split()
            if head[-1] == b"missing":
                yield path, None
                continue
            data = proc.stdout.read(int(head[2]))
            proc.stdout.read(1)
            yield path, data
        proc.stdin.close()


def extract(repo: Path, commit: str, dest: Path, paths: list[str]) -> Path:
    """The files under ``paths`` at ``commit``, written under ``dest`` (``git archive`` stops at a missing object)."""
    for path, data in blobs(repo, commit, paths):
        if data is not None:
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return dest


@pytest.fixture(scope="module")
def mlgym(tmp_path_factory):
    """MLGym's repository, its HEAD's runs and tables extracted, and a function giving the runs of any commit."""
    repo = mlgym_git()
    head = git(repo, "rev-parse", "HEAD").strip()
    trees: dict[str, Path] = {}

    def runs_at(commit: str) -> Path:
        tree = git(repo, "rev-parse", f"{commit}:{RUNS}").strip()
        if tree not in trees:
            trees[tree] = extract(repo, commit, tmp_path_factory.mktemp("mlgym"), [RUNS]) / RUNS
        return trees[tree]

    checkout = runs_at(head).parents[1]
    extract(repo, head, checkout, [TABLES])
    yield repo, head, checkout, runs_at
    for runs in trees.values():  # a few hundred MB each
        shutil.rmtree(runs.parents[1], ignore_errors=True)


def published_sets(checkout: Path) -> list[str]:
    return sorted(p.stem[len("best_scores_"):] for p in (checkout / TABLES).glob("best_scores_*.csv"))


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def check_ranks(ours: list[list[str]], theirs: list[list[str]], scores: dict[str, dict]) -> None:
    """Rank rows. A task's row: the columns with a score in MLGym's order, then the others in any order (MLGym lists
    them in a Python set's order, which changes from one run of its script to the next). The overall orders depend on
    that order, so they are checked from MLGym's own task rows: our ranking functions, given the positions the
    published rows hold, give the published Plackett-Luce and BORDA rows."""
    assert ours[0] == theirs[0]
    mine = {row[0]: row[1:] for row in ours[1:]}
    task_rows = [row for row in theirs[1:] if row[0] in scores]
    for row in task_rows:
        scored = sum(1 for value in scores[row[0]].values() if value is not None)
        assert mine[row[0]][:scored] == row[1 : 1 + scored], row[0]
        assert set(mine[row[0]][scored:]) == set(row[1 + scored :]), row[0]
    placed = [{name: float(index + 1) for index, name in enumerate(row[1:])} for row in task_rows]
    overall = {row[0]: row[1:] for row in theirs[1:] if row[0] not in scores}
    assert overall == {metrics.MEAN_RANK: metrics.mean_rank_order(placed), metrics.BORDA: metrics.borda_order(placed)}
    assert set(mine) - set(scores) == set(overall)


@pytest.mark.slow
def test_every_published_table_from_the_runs_it_was_made_from(mlgym, tmp_path):
    """Each set of tables in ``results/tables`` was made by MLGym from the runs of the commit that last changed it:
    from those runs (``.traj`` files included, counted as MLGym counts them), the report gives every cell of its
    best, last and AUP tables to the tables' 3 decimals, and its rank rows."""
    repo, _, checkout, runs_at = mlgym
    names = published_sets(checkout)
    assert names, f"no published tables in {checkout / TABLES}"
    for name in names:
        made_at = git(repo, "log", "-1", "--format=%H", "HEAD", "--", f"{TABLES}/best_scores_{name}.csv").strip()
        runs = runs_at(made_at)
        theirs = {kind: read_csv(checkout / TABLES / f"{kind}_{name}.csv") for kind in KINDS}
        models = theirs["best_scores"][0][2:]
        out = tmp_path / name
        argv = ["report", str(runs), "--out", str(out), "--models", ",".join(models), "--include-failed", "--no-plot"]
        assert cli_main(argv) == 0
        report = build_report([runs], models=models, include_failed=True)
        assert report.unranked == {}, report.unranked
        published = read_published(checkout / TABLES, name)
        assert published is not None, name
        comparison = compare(report.board, published)
        assert comparison.differing == [], (name, comparison.differing)
        cells = (len(theirs["best_scores"]) - 1) * len(models + ["baseline"])
        assert comparison.compared == {"best_scores": cells, "last_scores": cells,
                                       "aup_scores": 2 * (len(theirs["aup_scores"]) - 1)}, name
        assert read_csv(out / "aup_scores.csv")[0] == theirs["aup_scores"][0]
        for which, table in (("best", report.board.best), ("last", report.board.last)):
            titled = {task.title: table[task.task] for task in report.board.tasks}
            check_ranks(read_csv(out / f"{which}_ranks.csv"), theirs[f"{which}_ranks"], titled)


@pytest.mark.slow
def test_the_checkouts_runs_against_tables_made_from_older_runs(mlgym, tmp_path):
    """Tables made before a later commit re-recorded some runs cannot be reproduced from the checkout's runs on the
    rows of those runs' tasks (and so on AUP, which depends on every row): the report matches every other cell and
    names exactly the differing ones, saying which tables these runs do reproduce."""
    repo, head, checkout, runs_at = mlgym
    older = []
    for name in published_sets(checkout):
        made_at = git(repo, "log", "-1", "--format=%H", "HEAD", "--", f"{TABLES}/best_scores_{name}.csv").strip()
        if git(repo, "rev-parse", f"{made_at}:{RUNS}") != git(repo, "rev-parse", f"HEAD:{RUNS}"):
            older.append((name, made_at))
    if not older:
        pytest.skip("every published table was made from the checkout's runs")
    runs = runs_at(head)
    for name, made_at in older:
        theirs = read_csv(checkout / TABLES / f"best_scores_{name}.csv")
        models = theirs[0][2:]
        changed = {Path(path).parent.name.split("__")[1] for path in
                   git(repo, "diff", "--name-only", made_at, head, "--", RUNS).split()
                   if path.endswith("/results.json") and Path(path).parent.name.split("__")[0].removeprefix("metagen-")
                   in models}
        report = build_report([runs], models=models, include_failed=True)
        changed_rows = {task.title for task in report.board.tasks if task.task in changed}
        published = read_published(checkout / TABLES, name)
        assert published is not None, name
        comparison = compare(report.board, published)
        differing_rows = {d.row for d in comparison.differing if d.table != "aup_scores"}
        assert differing_rows and differing_rows <= changed_rows, (name, differing_rows, changed_rows)
        note = next(note for note in report.notes if f"*_{name}.csv" in note)
        named = [d for d in comparison.differing if d.table != "aup_scores"][:SHOWN]
        for diff in named:
            cell = f"{diff.table.split('_')[0]} {diff.row} / {diff.column}: published {diff.published or 'none'}"
            assert cell in note
        assert "These runs reproduce" in note or len(published_sets(checkout)) == len(older)
