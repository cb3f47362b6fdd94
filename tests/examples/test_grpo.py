"""examples/grpo.py trains: two GRPO updates of the tiny offline model on prisonersDilemma, on CPU.

The random model writes garbage, so every turn is a format error; ``--max-turns 2`` keeps the episodes (and the
test) short. Every episode of a group then has the same return, so the advantages are zero and the parameters move
by the entropy bonus alone: enough to show that gradients reach the model through the whole pipeline.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from mlgym_registry.testing.tiny_model import save_tiny_checkpoint

# TorchRL's collectors warn about an InitTracker for every LLM env, its own ChatEnv included; nothing here needs one
pytestmark = pytest.mark.filterwarnings("ignore:The env passed to LLMCollector is missing:FutureWarning")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo.py"
GROUP = 2


def load_example():
    spec = importlib.util.spec_from_file_location("grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_two_updates_from_a_local_checkpoint(tmp_path):
    before, after = save_tiny_checkpoint(tmp_path / "before"), tmp_path / "after"
    argv = ["--model", str(before), "--save", str(after), "--updates", "2", "--grpo-size", str(GROUP),
            "--max-new-tokens", "8", "--max-turns", "2", "--device", "cpu"]
    history = load_example().main(argv)

    assert len(history) == 2
    for stats in history:
        assert math.isfinite(stats["loss"])
        assert stats["task"] == "prisonersDilemma"
        assert stats["episodes"] == GROUP  # every episode of the group ended, none was cut or lost
        assert stats["turns"] == GROUP * 2
    old = AutoModelForCausalLM.from_pretrained(before, local_files_only=True).state_dict()
    new = AutoModelForCausalLM.from_pretrained(after, local_files_only=True).state_dict()
    changed = [name for name, value in old.items() if not torch.equal(value, new[name])]
    assert changed, "no parameter moved"


def test_vllm_without_a_gpu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        load_example().main(["--engine", "vllm", "--model", "somewhere"])
    assert exit_info.value.code == 2
    assert "--engine vllm needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(("device", "message"), [
    ("cuda", "--device cuda: "),
    ("cuda:7", "--device cuda:7: "),
    ("gpu", "--device gpu: not a device torch knows"),
])
def test_a_device_torch_cannot_use_is_one_clear_line(device, message, monkeypatch, capsys):
    if device.startswith("cuda"):  # what a CPU-only torch says, also on a machine with a GPU
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        load_example().main(["--device", device])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.split(": error: ", 1)[1].startswith(message.removesuffix(" "))
    if device.startswith("cuda"):
        assert "use --device cpu" in error and "Traceback" not in error


def test_cpu_defaults_keep_an_update_small_and_explicit_values_win():
    example = load_example()
    args = example.parse_args(["--device", "cpu"])
    assert (args.max_new_tokens, args.max_turns) == (32, 2) == tuple(example.CPU_DEFAULTS.values())
    args = example.parse_args(["--device", "cpu", "--max-new-tokens", "100", "--max-turns", "5"])
    assert (args.max_new_tokens, args.max_turns) == (100, 5)


@pytest.mark.slow
def test_one_update_with_the_cpu_defaults_from_the_docs_checkpoint(tmp_path, monkeypatch):
    """The checkpoint docs/training.md tells a user to make, trained with nothing but the defaults, on CPU."""
    monkeypatch.chdir(tmp_path)
    save_tiny_checkpoint("checkpoint")
    (stats,) = load_example().main(["--model", "checkpoint", "--device", "cpu", "--updates", "1"])
    assert stats["task"] == "prisonersDilemma" and stats["episodes"] == 4 and stats["turns"] <= 4 * 2
    assert math.isfinite(stats["loss"])
