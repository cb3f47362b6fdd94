"""A tiny tokenizer and causal language model built in code, with nothing downloaded.

For tests, examples and smoke runs of the training stack on a CPU: the tokenizer is a byte-level BPE (so it encodes
any text), with ChatML's special tokens and TorchRL's ``chatml_format`` chat template (whose ``{% generation %}``
blocks give assistant masks), trained on the default prompt templates and tool docs so that an env's prompts take few
tokens; the model is a one-layer Llama with random weights. It writes garbage, quickly.

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    save_tiny_checkpoint("ckpt")      # both, with save_pretrained: what ``--model DIR`` options load

``tiny_tool_tokenizer()`` is the same tokenizer with a chat template that renders tools, assistant tool calls and
tool results (ChatML turns; a call is ``<tool_call>``, a JSON object with ``name`` and ``arguments``, and
``</tool_call>``, the text form of ``components.tool_calling``), and a ``response_template`` with which
``tokenizer.parse_response`` (and so TRL's tool-calling loop) reads the calls back out of a reply.
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
    return _bpe_tokenizer(vocab_size)


def _bpe_tokenizer(vocab_size: int, extra_lines: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """The byte-level BPE of ``tiny_tokenizer``, trained on the corpus plus ``extra_lines``."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((_corpus() + list(extra_lines)) * 20, trainer=trainer)
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


TOOL_CHAT_TEMPLATE = """\
{%- set ns = namespace(system=none) -%}
{%- if messages and messages[0]['role'] == 'system' -%}{%- set ns.system = messages[0]['content'] -%}{%- endif -%}
{%- if tools or ns.system is not none -%}
{{- '<|im_start|>system\n' -}}
{%- if ns.system is not none -%}{{- ns.system -}}{%- endif -%}
{%- if tools -%}
{%- if ns.system is not none -%}{{- '\n\n' -}}{%- endif -%}
{{- 'Tools you can call. To call one, write <tool_call>, then a JSON object with its "name" and its "arguments", '
    'then </tool_call>. The tools:\n' -}}
{%- for tool in tools -%}{{- tool | tojson -}}{{- '\n' -}}{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and message['role'] == 'system' -%}
{%- elif message['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- generation -%}
{{- message['content'] or '' -}}
{%- for call in message.get('tool_calls') or [] -%}
{%- set fn = call['function'] if call['function'] is defined else call -%}
{%- if loop.first and message['content'] -%}{{- '\n' -}}{%- elif not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": ' -}}{{- fn['name'] | tojson -}}{{- ', "arguments": ' -}}
{%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}{%- else -%}{{- fn['arguments'] | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>' -}}
{%- endgeneration -%}
{{- '\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
"""Our ChatML template with tools: the tools' JSON schemas in the system turn, each assistant call as a
``<tool_call>`` block after the reply's text, and each result as a ``tool`` turn. It preserves prefixes (an earlier
turn renders the same whatever follows) and marks assistant turns with ``{% generation %}`` for assistant masks."""

TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""How ``parse_response`` reads a reply rendered by ``TOOL_CHAT_TEMPLATE``: text up to ``<|im_end|>``, and each
``<tool_call>`` block's JSON as a call (transformers' ``response_template`` format)."""

_TOOL_LINES = (
    '<tool_call>\n{"name": "act", "arguments": {"response": "DISCUSSION\\nLook.\\n```\\nls\\n```"}}\n</tool_call>',
    'Tools you can call. To call one, write <tool_call>, then a JSON object with its "name" and its "arguments"',
    '{"type": "function", "function": {"name": "act", "description": "", "parameters": {"type": "object", '
    '"properties": {"response": {"type": "string", "description": ""}}, "required": ["response"]}}}',
)


def tiny_tool_tokenizer(vocab_size: int = 1000) -> PreTrainedTokenizerFast:
    """``tiny_tokenizer``'s kind of tokenizer (also trained on tool-call text) whose chat template renders tools,
    tool calls and tool results (``TOOL_CHAT_TEMPLATE``), with ``response_template`` set so that
    ``parse_response`` returns the calls of a reply: what TRL's ``GRPOTrainer(environment_factory=...)`` needs."""
    fast = _bpe_tokenizer(vocab_size, _TOOL_LINES)
    fast.chat_template = TOOL_CHAT_TEMPLATE
    fast.response_template = TOOL_RESPONSE_TEMPLATE
    return fast
