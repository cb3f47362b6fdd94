"""Our own additions to the task files of an MLGym checkout, per MLGym task id, applied when ``mlgym_source`` loads one.

MLGym's task files declare no evaluator-only files: its container copies each local dataset folder whole into the
agent's workspace, answers included. The facts below come from reading each task's dataset config (where its data
folder lands: ``data/`` of the workspace) and its ``evaluate.py`` (which file of that folder it reads the answers
from). The local backend takes these files out of the agent's view and shows them to the evaluator only.

Tasks whose answers live outside the workspace (the Hugging Face datasets of the image and language tasks, whose
test labels the evaluator loads by name: ``HUB_ANSWERS`` says which splits and columns hold them) or whose evaluator
reads no answers (3-SAT solves its instances; the games play an opponent) have no entry in ``SECRET_FILES``.
"""

from __future__ import annotations

from pathlib import Path

SECRET_FILES: dict[str, tuple[str, ...]] = {
    # evaluate.py reads /home/agent/workspace/data/ground_truth.csv (datasets/titanic.yaml puts data/titanic/data
    # at data/)
    "titanicSurvival": ("data/ground_truth.csv",),
    # evaluate.py reads /home/agent/workspace/data/answer.csv, which _helpers/_generate_split.py writes beside
    # train/validation/test.csv (datasets/kaggleHousePrice.yaml puts that folder at data/)
    "regressionKaggleHousePrice": ("data/answer.csv",),
    "regressionKaggleHousePriceL1": ("data/answer.csv",),
}
"""Workspace-relative files each task's evaluator reads that hold the answers: the agent must never see them."""

_CIFAR_ANSWERS = {
    # its dataset config loads uoft-cs/cifar10 (columns img, label); evaluate.py scores the test split's label column
    "uoft-cs/cifar10": {"test": ["label"]},
}
_FMNIST_ANSWERS = {
    # its dataset config loads zalando-datasets/fashion_mnist (image, label); evaluate.py scores test's label
    "zalando-datasets/fashion_mnist": {"test": ["label"]},
}
_MNLI_ANSWERS = {
    # its dataset config loads nyu-mll/multi_nli; evaluate.py scores validation_matched's label. pairID is the
    # premise's promptID and a letter naming the label the hypothesis was written for (e, n or c): hidden as well
    "nyu-mll/multi_nli": {"validation_matched": ["label", "pairID"]},
}
HUB_ANSWERS: dict[str, dict[str, dict[str, list[str]]]] = {
    "imageClassificationCifar10": _CIFAR_ANSWERS,
    "imageClassificationCifar10L1": _CIFAR_ANSWERS,
    "imageClassificationFMnist": _FMNIST_ANSWERS,
    "naturalLanguageInferenceMNLI": _MNLI_ANSWERS,
}
"""Per task, the Hugging Face hub datasets it loads by name and, per scored split, the columns that hold its answers
(or give them away): the local backend serves each from a local copy with these columns masked in the agent's view
(``mlgym_registry.preparation.hub_datasets``; the ``hub_answers`` extra)."""

_KAGGLE_SUBMISSION = {
    # evaluate.py reads the SalePrice columns of data/answer.csv and of the submission and pairs them by position
    # (it never reads Id); _generate_split.py writes answer.csv in the order of test.csv, as baseline.py writes its
    # submission (columns Id and SalePrice, no index)
    "id_column": "Id",
    "rows_from": "data/answer.csv",
    "ordered": True,
    "columns": {"Id": "integer", "SalePrice": {"type": "number", "min": -1.0e9, "max": 1.0e9}},
}
SUBMISSIONS: dict[str, dict[str, object]] = {
    # evaluate.py checks only that the columns PassengerId and Survived exist and that the row count is that of
    # data/ground_truth.csv, then joins the two on PassengerId: 418 rows naming one passenger would all match
    "titanicSurvival": {
        "id_column": "PassengerId",
        "rows_from": "data/ground_truth.csv",
        "columns": {"PassengerId": "integer", "Survived": {"values": [0, 1]}},
    },
    "regressionKaggleHousePrice": _KAGGLE_SUBMISSION,
    "regressionKaggleHousePriceL1": _KAGGLE_SUBMISSION,
}
"""The schema of each CSV-submission task's ``submission.csv`` (``mlgym_registry.submissions``), read from what
its ``evaluate.py`` reads: checked before the evaluator runs, since MLGym's evaluators trust the file."""

_GAME_STRATEGY = ("strategy.py",)
SUBMISSION_FILES: dict[str, tuple[str, ...]] = {
    # the games' evaluate.py imports row_strategy from strategy.py (the file each description asks to edit) and the
    # opponent from target.py, which is the task's
    "prisonersDilemma": _GAME_STRATEGY,
    "battleOfSexes": _GAME_STRATEGY,
    "blotto": _GAME_STRATEGY,
    # evaluate.py imports the agent's heuristic.py; solver.py and the instances are the task's
    "3SATTime": ("heuristic.py",),
    # the CSV tasks' evaluate.py reads submission.csv beside data/ (answers, test set) of the task's own
    "titanicSurvival": ("submission.csv",),
    "regressionKaggleHousePrice": ("submission.csv",),
    "regressionKaggleHousePriceL1": ("submission.csv",),
    "imageClassificationCifar10": ("submission.csv",),
    "imageClassificationCifar10L1": ("submission.csv",),
    "imageClassificationFMnist": ("submission.csv",),
    # our RL evaluator lists checkpoints/ and hands the configuration to the agent's process, which loads src/
    **{task: ("checkpoints", "config.yaml", "src") for task in (
        "rlBreakoutMinAtar", "rlMetaMazeMisc", "rlMountainCarContinuous", "rlMountainCarContinuousReinforce")},
}
"""What each MLGym task's evaluator takes from the agent (``TaskSpec.submission_files``), read from its
``evaluate.py``: the evaluation's view holds these and the task's own files, nothing else of the workspace."""


def overlay_submission_files(task_id: str) -> list[str] | None:
    """The submission files we declare for MLGym's task ``task_id`` (``mlgym/`` prefix allowed); None when none (the
    entrypoint's default applies)."""
    files = SUBMISSION_FILES.get(task_id.removeprefix("mlgym/"))
    return list(files) if files is not None else None


_HOUSE_PRICE_BEST = {"rmse": 0.0, "r2": 1.0}
_ACCURACY_BEST = {"accuracy": 1.0}
BEST_SCORES: dict[str, dict[str, float]] = {
    # what each evaluate.py prints, at its best: an error of 0, an accuracy or r2 of 1, the games' highest payoff
    # per round (prisonersDilemma 5, battleOfSexes 2, blotto a win, 1)
    "regressionKaggleHousePrice": _HOUSE_PRICE_BEST,
    "regressionKaggleHousePriceL1": _HOUSE_PRICE_BEST,
    "titanicSurvival": _ACCURACY_BEST,
    "imageClassificationCifar10": _ACCURACY_BEST,
    "imageClassificationCifar10L1": _ACCURACY_BEST,
    "imageClassificationFMnist": _ACCURACY_BEST,
    "prisonersDilemma": {"Score": 5.0},
    "battleOfSexes": {"Score": 2.0},
    "blotto": {"Score": 1.0},
}
"""The best value of each metric MLGym's tasks print (``TaskSpec.best_score``, ``mlgym_registry.best_scores``): a
score past it is an invalid submission, never paid."""


def overlay_best_score(task_id: str) -> dict[str, float]:
    """The best metric values we declare for MLGym's task ``task_id`` (``mlgym/`` prefix allowed); {} when none."""
    return dict(BEST_SCORES.get(task_id.removeprefix("mlgym/"), {}))


BASELINE_METRICS: dict[str, dict[str, float]] = {
    # the task file records only rmse; its L1 variant, which runs the same baseline.py and evaluate.py on the same
    # split, records this rmse (30340.111853413255) together with r2, the metric MLGym ranks the task by
    "regressionKaggleHousePrice": {"r2": 0.8799891474739243},
}
"""Baseline values MLGym publishes for a task's ranking metric where the task file's ``baseline_scores`` omit it."""


_KAGGLE_SPLIT = {
    # _helpers/_generate_split.py reads _helpers/train.csv (Kaggle's labelled houses) and writes train, validation,
    # test and answer CSVs to ../data, the data_path of datasets/kaggleHousePrice.yaml; MLGym's repository ships the
    # input, not the split
    "script": "data/regressionKaggleHousePrice/_helpers/_generate_split.py",
    "output": "data/regressionKaggleHousePrice/data",
}
_GENDER_RULE = (
    # our own baseline program: every woman survives, no man does (Kaggle's example submission for the competition)
    "python -c \"import csv; rows = list(csv.DictReader(open('data/test.csv'))); "
    "out = open('submission.csv', 'w', newline=''); w = csv.writer(out); w.writerow(['PassengerId', 'Survived']); "
    "w.writerows([r['PassengerId'], int(r['Sex'] == 'female')] for r in rows); out.close()\""
)
_RL_EVALUATION = {
    # MLGym's evaluate.py imports the agent's src.networks and src.helpers, unpickles its checkpoints and traces the
    # agent's network with jax.jit inside its own rollouts (jax.lax.scan), so the agent's code would run in the
    # evaluator's process. Ours (data/rl, see overlay_files) steps the gymnax environment there and asks rl_policy.py,
    # which runs where the agent's code runs, for each step's batch of actions
    "agent_side_files": ["rl_policy.py"],
    # the baseline is MLGym's src/train.py (baseline_paths), which trains the 5 checkpoints with src/config.yaml
    "baseline_command": "python src/train.py",
}
_SAT_DATA = {
    # evaluate.py reads data/dataset.pkl (datasets/3SAT.yaml puts data/3SATTime/data at data/), which MLGym's repository
    # does not ship and MLGym publishes no script for; sat_instances writes a file of the same format
    "data_files": ["dataset.pkl"],
    "data_hint": (
        "3SATTime's evaluate.py reads data/dataset.pkl: a pickled list of (index, num_vars, num_clauses, clauses, "
        "is_sat, solution) tuples, each clause a list of integer literals (-v negates variable v), times its solver "
        "with the agent's heuristic on all but the first three and fails on a verdict that differs from is_sat. Put "
        "MLGym's dataset.pkl in {folder}, or make one of random instances there (not MLGym's, so scores are not "
        "comparable with its published ones): "
        "`python -m mlgym_registry.tasks.sat_instances --out {folder} --count 1000 --vars 12 --seed 0`"
    ),
}
_COCO_DATA = {
    # baseline.py reads ./data/train_images.parquet and ./data/val_images.parquet (a row per image: file_name and anns,
    # its annotations with their captions) and opens each image at ./data/<split>/<file_name>
    "data_files": ["train_images.parquet", "val_images.parquet", "train", "val"],
    "data_hint": (
        "imageCaptioningCOCO's baseline.py reads data/train_images.parquet and data/val_images.parquet (a row per "
        "image: its file_name and anns, the list of its MS COCO annotations, each with a caption) and the images at "
        "data/train/<file_name> and data/val/<file_name>; MLGym's repository ships none of them. Make them from MS "
        "COCO's images and caption annotations (cocodataset.org) and put them in {folder}"
    ),
}
_FINEWEB_DATA = {
    # evaluate.py scores on ./data/fineweb10B/fineweb_val_*.bin (10,485,760 tokens), baseline.py trains on
    # ./data/fineweb10B/fineweb_train_*.bin; both check llm.c's shard header (magic 20240520, version 1)
    "data_files": ["fineweb10B/fineweb_train_*.bin", "fineweb10B/fineweb_val_*.bin"],
    "data_hint": (
        "languageModelingFineWeb's evaluate.py scores on data/fineweb10B/fineweb_val_*.bin (its first 10,485,760 "
        "tokens) and baseline.py trains on data/fineweb10B/fineweb_train_*.bin: FineWeb's text as GPT-2 token shards "
        "in llm.c's format (a header of 256 int32, magic 20240520, version 1, the token count, then uint16 tokens), "
        "as llm.c's dev/data/fineweb.py writes them; MLGym's repository ships none of them. Put the fineweb10B "
        "folder in {folder}"
    ),
}
EXTRAS: dict[str, dict[str, object]] = {
    "3SATTime": _SAT_DATA,
    "imageCaptioningCOCO": _COCO_DATA,
    "rlBreakoutMinAtar": _RL_EVALUATION,
    "rlMetaMazeMisc": _RL_EVALUATION,
    "rlMountainCarContinuous": _RL_EVALUATION,
    "rlMountainCarContinuousReinforce": _RL_EVALUATION,
    "regressionKaggleHousePrice": {"prepare_data": _KAGGLE_SPLIT},
    "regressionKaggleHousePriceL1": {"prepare_data": _KAGGLE_SPLIT},
    # evaluate.py and baseline.py assert torch.cuda.is_available() and move every batch to a CUDA device
    "languageModelingFineWeb": {"needs": {"devices": ["cuda"]}, **_FINEWEB_DATA},
    # evaluate.py builds its tokenizer with BertTokenizer.from_pretrained('bert-base-uncased'), from the hub
    "naturalLanguageInferenceMNLI": {"needs": {"models": ["bert-base-uncased"]}},
    "titanicSurvival": {
        "baseline_command": _GENDER_RULE,
        "baseline_note": (
            "the published 0.76555 is the score of Kaggle's example submission (every woman survives, no man does) "
            "on the competition's hidden labels. The checkout's data/ground_truth.csv is that example submission "
            "itself (all 418 rows agree with the rule), so the rule scores 1.0 here: put the competition's real "
            "labels, as ground_truth.csv beside train.csv and test.csv, in a data folder (data_dir= or "
            "MLGYM_REGISTRY_DATA, at data/titanic/data) to reproduce 0.76555"
        ),
    },
}
"""Task extras we add (see ``mlgym_registry.preparation.datasets.prepare_data`` and
``mlgym_registry.evaluation.evaluator_runs``): how to make a task's data from what its repository ships, the baseline
program of a task whose file names none, why a published baseline cannot be reproduced from a checkout's data, what
a task needs beyond packages and data (``needs``: a CUDA device, Hugging Face models; see
``mlgym_registry.backends.local.task_checks``), and for data MLGym's repository does not ship, the files its folder
must hold (``data_files``) and what they are and how to make them (``data_hint``, shown when they are missing)."""


def overlay_extras(task_id: str, extra: dict[str, object]) -> dict[str, object]:
    """``extra`` completed by the extras we add for MLGym's task ``task_id`` (the task file's own values win)."""
    task_id = task_id.removeprefix("mlgym/")
    ours = dict(EXTRAS.get(task_id, {}))
    if task_id in HUB_ANSWERS:
        ours["hub_answers"] = HUB_ANSWERS[task_id]
    return {**ours, **extra}


def overlay_secret_files(task_id: str) -> list[str]:
    """The evaluator-only files we add to MLGym's task ``task_id`` (``mlgym/`` prefix allowed); [] when none."""
    return list(SECRET_FILES.get(task_id.removeprefix("mlgym/"), ()))


def overlay_submission(task_id: str) -> dict[str, object] | None:
    """The submission schema we declare for MLGym's task ``task_id`` (``mlgym/`` prefix allowed); None when none."""
    import copy

    schema = SUBMISSIONS.get(task_id.removeprefix("mlgym/"))
    return copy.deepcopy(schema) if schema is not None else None


def overlay_baseline(task_id: str, baseline_scores: list[dict[str, float]]) -> list[dict[str, float]]:
    """``baseline_scores`` with the first dict completed by the metrics we know and it lacks (a copy)."""
    known = BASELINE_METRICS.get(task_id.removeprefix("mlgym/"))
    if not known or not baseline_scores:
        return [dict(scores) for scores in baseline_scores]
    first = {**known, **baseline_scores[0]}
    return [first] + [dict(scores) for scores in baseline_scores[1:]]


# pandas<3: the Kaggle task's _helpers/_generate_split.py calls df.drop(columns=..., axis=1), an error from pandas 3 on
# (MLGym's image predates it)
_TABULAR = ("numpy", "pandas<3", "scikit-learn")
_IMAGE_CLASSIFICATION = ("numpy", "pandas", "scikit-learn", "torch", "transformers", "accelerate", "datasets", "pillow")
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    # evaluate.py and baseline.py import pandas and sklearn (numpy through them)
    "titanicSurvival": _TABULAR,
    "regressionKaggleHousePrice": _TABULAR,
    "regressionKaggleHousePriceL1": _TABULAR,
    "regressionHousePrice": _TABULAR,
    "regressionHousingPrice": _TABULAR,
    # the games' evaluate.py and 3SATTime's evaluate.py import numpy; the rest is the standard library
    "prisonersDilemma": ("numpy",),
    "battleOfSexes": ("numpy",),
    "blotto": ("numpy",),
    "3SATTime": ("numpy",),
    # baseline.py: torch, transformers' Trainer (which needs accelerate; MLGym's image has transformers[torch]) and
    # datasets, whose image columns decode with Pillow; evaluate.py: datasets, pandas, sklearn
    "imageClassificationCifar10": _IMAGE_CLASSIFICATION,
    "imageClassificationFMnist": _IMAGE_CLASSIFICATION,
    # baseline.py and evaluate.py: torch, transformers, datasets, tqdm, numpy
    "naturalLanguageInferenceMNLI": ("numpy", "torch", "transformers", "datasets", "tqdm"),
    # baseline.py and evaluate.py: torch and numpy
    "languageModelingFineWeb": ("numpy", "torch"),
    # baseline.py imports numpy and tqdm besides what the task's requirements file lists
    "imageCaptioningCOCO": ("numpy", "tqdm"),
}
"""The packages each MLGym task's code imports (its evaluate.py and baseline), read from the task folders. MLGym's
container has them from its generic conda requirements, or from the task's own requirements file
(``requirements_path``), whose lines are added to these (``task_packages.task_requirements``)."""

RL_TASKS = ("rlBreakoutMinAtar", "rlMetaMazeMisc", "rlMountainCarContinuous", "rlMountainCarContinuousReinforce")
"""MLGym's gymnax tasks: their requirements file names an unpinned ``jax[cuda12]``, and their evaluation program is
ours (``overlay_files``)."""

RL_PINS = ("jax==0.4.35", "jaxlib==0.4.35", "flax==0.10.2", "optax==0.2.4", "chex==0.1.87", "gymnax==0.0.8",
           "tensorflow-probability==0.25.0")
"""Versions that work together for the RL tasks (checked on CPU: the tasks' ``src/train.py`` imports and trains, our
evaluator scores its checkpoints). Unpinned, pip takes the newest jax, whose ``jax.interpreters.xla`` no longer has
``pytype_aval_mappings``, which tensorflow-probability 0.25 (the newest release; its jax substrate is what the tasks'
networks import) reads at import. It imports with jax 0.4.35 (newer 0.4 and 0.5 releases were not tried); flax
0.10.2, optax 0.2.4 and chex 0.1.87 are releases of the same months that accept it, gymnax 0.0.8 the release MLGym's
code was written against."""

RL_DATA = Path(__file__).resolve().parent / "data" / "rl"
"""Our evaluation program of the RL tasks: a per-task ``evaluate.py``, the shared evaluator ``rl_gymnax.py`` and
driver ``rl_driver.py``, and the agent's side ``rl_policy.py``."""
RL_FILES = ("rl_driver.py", "rl_gymnax.py", "rl_policy.py")

GAME_TASKS = ("prisonersDilemma", "battleOfSexes", "blotto")
"""MLGym's iterated games: their evaluate.py calls the agent's strategy once per move (100,000 crossings to the
agent's process); ours (``GAMES_DATA``) plays the games in lockstep, one crossing a round, with the same scoring."""
GAMES_DATA = Path(__file__).resolve().parent / "data" / "mlgym_games"
"""Our evaluation program of the games: a per-task ``evaluate.py`` and the shared ``lockstep_games.py``."""
GAME_FILES = ("lockstep_games.py",)


def overlay_files(task_id: str, starter_code: list[str], protected: list[str]) -> tuple[list[str], list[str]]:
    """``(starter_code, protected_files)`` of MLGym's task ``task_id`` with our evaluation program where its own
    cannot run honestly (the RL tasks) or fast (the games) here: MLGym's ``evaluate.py`` replaced by ours and our
    files added, protected (put back pristine before each evaluation). Copies; unchanged for other tasks."""
    task_id = task_id.removeprefix("mlgym/")
    if task_id in RL_TASKS:
        folder, files = RL_DATA, RL_FILES
    elif task_id in GAME_TASKS:
        folder, files = GAMES_DATA, GAME_FILES
    else:
        return list(starter_code), list(protected)
    ours = str(folder / task_id / "evaluate.py")
    starter = [ours if Path(item).name == "evaluate.py" else item for item in starter_code]
    starter += [str(folder / name) for name in files]
    return starter, list(dict.fromkeys([*protected, *files]))


def overlay_requirements(task_id: str) -> list[str]:
    """The packages we declare for MLGym's task ``task_id`` (``mlgym/`` prefix allowed); [] when none. The RL tasks
    get ``RL_PINS``, which replace their requirements file's lines of the same packages; on a host without NVIDIA
    devices, plain ``jax`` replaces the file's ``jax[cuda12]`` (the CUDA build, which such a host cannot use)."""
    task_id = task_id.removeprefix("mlgym/")
    if task_id in RL_TASKS:
        gpu = any(Path("/dev").glob("nvidia[0-9]*"))
        return [f"jax[cuda12]{RL_PINS[0][3:]}" if gpu else RL_PINS[0], *RL_PINS[1:]]
    return list(REQUIREMENTS.get(task_id, ()))
