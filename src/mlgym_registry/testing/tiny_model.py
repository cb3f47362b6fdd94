"""A tiny tokenizer and causal language model built in code, with nothing downloaded.

For tests, examples and smoke runs of the training stack on a CPU: the tokenizer is a byte-level BPE (so it encodes
any text), with ChatML's special tokens and TorchRL's ``chatml_format`` chat template (whose ``{% generation %}``
blocks give assistant masks), trained on the default prompt templates and tool docs so that an env's prompts take few
tokens; the model is a one-layer Llama with random weights. It writes garbage, quickly.

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    save_tiny_checkpoint("ckpt")      # both, with save_pretrained: what ``--model DIR`` options load
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torchrl.data.llm.history import _CHAT_TEMPLATES
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<unk>", "<|im_start|>", "<|im_end|>")
"""Padding, unknown, and ChatML's turn markers (``<|im_end|>`` doubles as end of sequence)."""

_LINES = (
    "You are an agent in a shell. Run one command per reply.",
    "DISCUSSION\nFirst, look around.\n```\nls -a\n```",
    "open strategy.py\nedit 1:1\nreturn 0\nend_of_edit\nvalidate\nsubmit",
)


def _corpus() -> list[str]:
    """A few lines, the default templates and the local backend's tool docs: most of what a prompt holds."""
    from ..components.templates import mlgym_default
    from ..tool_language import render_docs

    templates = mlgym_default()
    texts = [templates.system_template, templates.task_template, templates.next_step, templates.next_step_no_output]
    return [*_LINES, *texts, templates.format_error_template or "", render_docs()]


def tiny_tokenizer(vocab_size: int = 1000) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens, with ChatML's special tokens and TorchRL's
    ``chatml_format`` chat template."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    fast.chat_template = _CHAT_TEMPLATES["chatml_format"]
    return fast


def tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    """A one-layer Llama for ``tokenizer``, with random weights drawn from ``seed``, in eval mode."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def save_tiny_checkpoint(path: str | Path, seed: int = 0) -> Path:
    """Save the tiny tokenizer and model to ``path`` with ``save_pretrained``; returns ``path``."""
    path = Path(path)
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer, seed=seed).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
