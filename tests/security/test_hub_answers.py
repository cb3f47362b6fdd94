"""A hub dataset's hidden test labels (issue 34, item 2): the agent, in its sandbox, tries to read them (through
``load_dataset``, the cache folder's files, the local copy's and the views' host paths) or to make the evaluator read
labels of its own; judged from the host by the score a submission of what it found gets (the true labels score 1.0)
and by the views' files on the host."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("datasets")

from backends.test_hub_datasets import REPO, TEST_LABELS, task_file, tiny_cifar  # noqa: E402

from mlgym_registry import load_task_yaml  # noqa: E402
from mlgym_registry.preparation import hub_datasets  # noqa: E402

from .helpers import open_backend, status, validate, write_file  # noqa: E402

pytestmark = pytest.mark.security
CONSTANT = 8
"""What a submission of one label for every test image predicts: it scores the share of 8s among the labels."""
CONSTANT_SCORE = TEST_LABELS.count(CONSTANT) / len(TEST_LABELS)


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub-answers")
    patch = pytest.MonkeyPatch()
    patch.setenv("MLGYM_REGISTRY_DATA", str(root / "data-folder"))
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setenv("HF_HOME", str(root / "hf-home"))
    copy = tiny_cifar(root / "data-folder" / "hub" / REPO)
    spec = load_task_yaml(task_file(root / "task"))
    view = hub_datasets.hub_view(spec, REPO, sys.executable)
    env = open_backend(spec)
    yield env, copy, view
    env.close()
    patch.undo()


def submit_labels(env, script: str) -> tuple[str, dict | None]:
    """Run the agent's ``script`` (it writes submission.csv from what it found), then validate."""
    write_file(env, "attack.py", script)
    output, _ = status(env, "python attack.py 2>&1 | tail -5", timeout=120)
    obs, score = validate(env)
    return output + "\n" + obs, score


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


WRITE = '''
import csv
def write(labels):
    with open("submission.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([["label"], *[[label] for label in labels]])
'''


def test_load_dataset_gives_the_agent_masked_labels(setting):
    env, _, _ = setting
    env.reset()
    text, score = submit_labels(env, WRITE + '''
from datasets import load_dataset
labels = load_dataset("uoft-cs/cifar10", split="test")["label"]
print("found", sorted(set(labels)))
write([label if label >= 0 else 8 for label in labels])
''')
    assert "found [-1]" in text
    assert score == {"accuracy": CONSTANT_SCORE}, text


def test_the_cache_files_hold_no_labels(setting):
    env, _, _ = setting
    env.reset()
    text, score = submit_labels(env, WRITE + '''
import glob, os, pyarrow as pa
found = []
for path in glob.glob(os.path.expanduser("~/.cache/huggingface/**/*test*.arrow"), recursive=True):
    with pa.memory_map(path) as source:
        found += pa.ipc.open_stream(source).read_all().column("label").to_pylist()
print("read", len(found), sorted(set(found)))
write([label if label >= 0 else 8 for label in found])
''')
    assert f"read {len(TEST_LABELS)} [-1]" in text
    assert score == {"accuracy": CONSTANT_SCORE}, text


def test_the_copy_and_the_views_are_out_of_reach(setting):
    env, copy, view = setting
    env.reset()
    for path in (copy, copy / "test", view.evaluator, view.evaluator / "cifar10-test.arrow", view.agent.parents[4]):
        output, code = status(env, f"ls -d '{path}' && cat '{path}'/* '{path}' 2>/dev/null | head -c 100")
        assert code != 0 and "No such file or directory" in output, (path, output)
    output, _ = status(env, "grep -rl cifar10 / --include=*.arrow 2>/dev/null | grep -v '^/home/agent/.cache' | head")
    assert output.strip() == "", output


def test_the_agent_cannot_swap_in_labels_of_its_own(setting):
    env, _, view = setting
    before = digests(view.agent), digests(view.evaluator)
    env.reset()
    text, score = submit_labels(env, WRITE + '''
import glob, os, shutil
from datasets import load_dataset
test = load_dataset("uoft-cs/cifar10", split="test")
forged = test.map(lambda row: {"label": 8}).flatten_indices()
forged.save_to_disk("/tmp/forged")
done = []
for path in glob.glob(os.path.expanduser("~/.cache/huggingface/datasets/**/*test.arrow"), recursive=True):
    data = glob.glob("/tmp/forged/*.arrow")[0]
    for how in (lambda: shutil.copyfile(data, path), lambda: os.replace(data, path), lambda: os.unlink(path)):
        try:
            how()
            done.append(path)
        except OSError as exc:
            print("refused:", type(exc).__name__)
# a newer cached version of the dataset beside the view's (the library takes the newest)
place = glob.glob(os.path.expanduser("~/.cache/huggingface/datasets/uoft-cs___cifar10/default/0.0.0/*"))[0]
newer = os.path.join(os.path.dirname(place), "ffffffff")
try:
    shutil.copytree(place, newer, symlinks=False)
    shutil.copyfile(glob.glob("/tmp/forged/*.arrow")[0], os.path.join(newer, "cifar10-test.arrow"))
except OSError as exc:
    print("refused:", type(exc).__name__)
print("replaced", done)
write([8] * len(test))
''')
    assert "replaced []" in text
    assert score == {"accuracy": CONSTANT_SCORE}, text  # the evaluator read the true labels, not the forged 8s
    assert (digests(view.agent), digests(view.evaluator)) == before
