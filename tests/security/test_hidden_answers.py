"""Hidden answers (houseRegression's ``data/answer.csv``, a ``secret_files`` entry): the agent must never score with
them. An r2 of 1.0 means the submission was the answers themselves."""

from __future__ import annotations

import os
import platform
import textwrap
from pathlib import Path

import pytest

from mlgym_registry import registry

from .helpers import (
    HONEST,
    PACKAGE_DIR,
    SEED,
    attacking_strategy,
    mini_prisoners_spec,
    open_backend,
    run,
    status,
    upload,
    validate,
    write_file,
)

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def spec():
    return registry.spec("houseRegression")


@pytest.fixture(scope="module")
def answers(spec) -> Path:
    """The host's copy of the hidden answers (the task's generated data folder)."""
    path = Path(spec.datasets[0]["data_path"]) / "answer.csv"
    assert path.is_file()
    return path


@pytest.fixture(scope="module")
def backend(spec):
    env = open_backend(spec)
    yield env
    env.close()


@pytest.fixture(scope="module")
def honest(backend) -> dict:
    backend.reset(seed=SEED)
    output, code = status(backend, "python baseline.py")
    assert code == 0, output
    obs, score = validate(backend)
    assert score is not None and 0.5 < score["r2"] < 0.99, obs
    return score


@pytest.fixture
def env(backend, honest):
    backend.reset(seed=SEED)  # the honest score's episode (same evaluation seed)
    assert not (backend.host_workspace / "data" / "answer.csv").exists()
    return backend


def assert_no_answers(obs: str, score: dict | None) -> None:
    """The evaluation failed, or scored a submission that is not the answers."""
    if score is None:
        assert "Evaluation Score" not in obs, obs
        return
    assert score["r2"] < 0.999 and score["rmse"] > 1.0, f"the submission was the hidden answers: {score}\n{obs}"


def test_relative_link_to_the_answers(env):
    assert "answer.csv" not in run(env, "ls data")
    run(env, "ln -s data/answer.csv submission.csv")
    assert_no_answers(*validate(env))


@pytest.mark.parametrize(
    "target",
    [
        "/home/agent/workspace/data/answer.csv",
        "{answers}",
        "/proc/self/root{answers}",
        "/proc/1/root{answers}",
        "/proc/self/cwd/data/answer.csv",
        "{host_workspace}/data/answer.csv",
        "../../../../../../../..{answers}",
    ],
)
def test_absolute_and_proc_links_to_the_answers(env, answers, target):
    target = target.format(answers=answers, host_workspace=env.host_workspace)
    run(env, f"ln -s '{target}' submission.csv")
    assert_no_answers(*validate(env))


def test_links_through_a_linked_folder(env, answers):
    run(env, f"ln -s '{answers.parent}' hostdata && ln -s hostdata/answer.csv submission.csv")
    assert_no_answers(*validate(env))


def test_hard_link_and_copy_of_the_answers_fail(env, answers):
    output, code = status(env, f"ln '{answers}' submission.csv")
    assert code != 0, output
    output, code = status(env, f"cat '{answers}'")
    assert code != 0 and "Price" not in output, output
    output, code = status(env, f"ls -la '{answers.parent}'")
    assert code != 0 or "answer.csv" not in output, output


def test_searching_the_file_system_finds_no_answers(env, answers):
    # the read-only binds of the host (Python installations, our tools) are checked from the host instead: walking
    # them from inside takes long, and they hold no task data
    view = env._confinement.sandbox_spec(env.host_workspace, writable=True)
    binds = [bind for bind in view.binds if bind.writable is False]
    for bind in binds:
        assert not answers.resolve().is_relative_to(Path(bind.source).resolve()), bind
    prune = " ".join(f"-path '{bind.target}' -prune -o" for bind in binds)
    output, _ = status(
        env, f"find / -path /proc -prune -o {prune} \\( -name answer.csv -o -path '*houseRegression*' \\) -print "
             "2>/dev/null", 120,
    )
    assert output.strip() == "", output
    first_answer = answers.read_text().splitlines()[1]  # "Id,Price" of a house of the test set
    output, _ = status(env, f"grep -rlF '{first_answer}' /home /tmp /var /opt /etc /root 2>/dev/null", 120)
    assert output.strip() == "", output


def test_the_package_and_its_task_files_are_out_of_reach(env):
    output, code = status(env, "python -c 'import mlgym_registry'")
    assert code != 0 and "ModuleNotFoundError" in output, output
    output, code = status(env, "python -c 'from mlgym_registry.tasks import housing; print(housing.generate())'")
    assert code != 0 and "ModuleNotFoundError" in output, output
    tasks = PACKAGE_DIR / "tasks"
    output, code = status(env, f"ls -A '{PACKAGE_DIR}' '{tasks}' 2>&1; cat '{tasks}/housing.py'")
    assert "def generate" not in output and "houseRegression.yaml" not in output, output


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the agent script injects x86-64 machine code")
def test_swapping_in_a_link_while_the_workspace_is_copied(env, answers, monkeypatch):
    hijack = upload(env, "hijack_init.py")
    swapper = upload(env, "swap_on_freeze.py")
    pad = upload(env, "pad_before.py")
    output, code = status(
        env,
        f"python baseline.py >/dev/null && python {pad} submission.csv 50 && chmod u+w data && "
        f"ln -s '{answers}' data/swap",
    )
    assert code == 0, output
    # the attack proper: it may fail (then the answers stay out of reach, as they must). Taking over the sandbox's
    # first process takes over the agent's own shell, whose command then times out and is replaced with its sandbox
    monkeypatch.setattr(env, "long_timeout", 3)
    monkeypatch.setattr(env, "command_timeout", 3)
    run(env, f"python {hijack} \"$(command -v python)\" {swapper} $$ && "
             "for i in $(seq 100); do [ -e .swapper-ready ] && break; sleep 0.05; done")
    for _ in range(4):
        assert_no_answers(*validate(env))


SECRET_TOKEN = "mlgr-secret-answer-key-7d41"

SNOOP = textwrap.dedent(
    f"""\
    import glob
    FOUND = False
    for pattern in ("**", ".*", "/home/agent/**", "/tmp/**", "/var/tmp/**", "/opt/**", "/proc/*/cwd/**"):
        for path in glob.glob(pattern, recursive=True):
            try:
                with open(path, errors="replace") as handle:
                    if {SECRET_TOKEN[:12]!r} + {SECRET_TOKEN[12:]!r} in handle.read(1 << 20):  # not in this file
                        FOUND = True
            except OSError:
                pass
    """
)


@pytest.mark.parametrize("where", ["starter file", "inside a dataset folder"])
def test_agent_code_run_by_the_evaluation_cannot_read_secret_files(tmp_path, where):
    """The evaluation's copy of the workspace with the secrets is the pristine evaluator's only: the agent's code,
    run in its own process during the evaluation, searches for the secret and plays differently if it finds it.
    A secret inside a dataset folder (put back whole for evaluations) is left out of the agent's view too."""
    spec = mini_prisoners_spec(tmp_path / "task")
    if where == "starter file":
        (tmp_path / "task" / "answer_key.txt").write_text(SECRET_TOKEN + "\n")
        spec = spec.replace(starter_code=[*spec.starter_code, "answer_key.txt"], secret_files=["answer_key.txt"])
        secret = "answer_key.txt"
    else:
        (tmp_path / "task" / "keys").mkdir()
        (tmp_path / "task" / "keys" / "answer_key.txt").write_text(SECRET_TOKEN + "\n")
        (tmp_path / "task" / "keys" / "public.txt").write_text("nothing to see\n")
        dataset = {"name": "keys", "description": "keys", "is_local": True, "data_path": "keys"}
        spec = spec.replace(datasets=[dataset], secret_files=["data/answer_key.txt"])
        secret = "data/answer_key.txt"
    env = open_backend(spec)
    try:
        assert not (env.host_workspace / secret).exists()
        write_file(env, "strategy.py", HONEST)
        _, honest = validate(env)
        assert honest is not None
        snooping = attacking_strategy(at_import=SNOOP).replace(
            "    if not history:", "    if FOUND:\n        return 1\n    if not history:"
        )
        write_file(env, "strategy.py", snooping)
        write_file(env, "decoy.txt", SECRET_TOKEN)  # the search works: a copy the agent may see is found
        obs, score = validate(env)
        assert score is not None and score != honest, obs
        run(env, "rm decoy.txt")
        obs, score = validate(env)
        assert score == honest, obs
        output, _ = status(env, f"grep -rl {SECRET_TOKEN} /home /tmp /var /opt /etc /root 2>/dev/null | head -3", 120)
        assert output.strip() == "", output
    finally:
        env.close()


class _Listed:
    """The entries of a finished ``os.scandir``, usable as its iterator and context manager."""

    def __init__(self, entries):
        self._entries = entries
        self._left = iter(entries)

    def __iter__(self):
        return iter(self._entries)

    def __next__(self):
        return next(self._left)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        pass


def test_the_copy_never_reads_outside_the_workspace_even_if_the_agent_runs(env, answers, monkeypatch):
    """What an agent process that escaped the freeze can do at the worst moments, simulated deterministically from the
    host: whenever the driver lists the workspace, submission.csv is the honest file; right after, it is a link to
    the host's answers (``data/`` is the task's data: never copied from the workspace, so a safe place to keep both)."""
    run(env, f"python baseline.py >/dev/null && chmod u+w data && ln -s '{answers}' data/swap")
    workspace = env.host_workspace.resolve()
    submission, swap, spare = (workspace / "submission.csv", workspace / "data" / "swap", workspace / "data" / "spare")
    real_scandir, real_listdir = os.scandir, os.listdir
    listings = []

    def exchange():
        os.replace(submission, spare)
        os.replace(swap, submission)
        os.replace(spare, swap)

    folder = os.stat(workspace)

    def is_workspace(path) -> bool:
        if isinstance(path, int):  # the copy lists folders through their descriptors
            info = os.fstat(path)
            return (info.st_dev, info.st_ino) == (folder.st_dev, folder.st_ino)
        return Path(os.fspath(path)).resolve() == workspace

    def scandir(path="."):
        if not is_workspace(path):
            return real_scandir(path)
        if submission.is_symlink():
            exchange()  # listed: the honest file
        entries = list(real_scandir(path))
        listings.append(path)
        exchange()  # opened: the link
        return _Listed(entries)

    def listdir(path="."):
        if not is_workspace(path):
            return real_listdir(path)
        if submission.is_symlink():
            exchange()
        names = real_listdir(path)
        listings.append(path)
        exchange()
        return names

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    obs, score = validate(env)
    monkeypatch.undo()
    assert listings, "the driver never listed the workspace: adapt this simulation to the new way of copying it"
    assert_no_answers(obs, score)
