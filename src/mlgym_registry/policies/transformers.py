"""A local Hugging Face model as the agent, through TorchRL's ``TransformersWrapper`` (no download: a directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Generation, Messages, Policy


class TransformersPolicy(Policy):
    """Generates each response with the causal LM saved in ``model_dir`` (``save_pretrained`` output).

    The conversation goes to the model as a TorchRL ``History`` with the tokenizer's chat template; generation is
    greedy unless ``generate_kwargs`` say otherwise. ``last_generation()`` gives the prompt's and the response's token
    ids and the response's log-probs, which the episode records in the ``.traj``; ``version`` (0 until a trainer
    sets it) is recorded with them.
    """

    name = "transformers"
    version: int | None = 0

    def __init__(self, model_dir: str | Path, *, max_new_tokens: int = 256, device: str | None = None,
                 generate_kwargs: dict[str, Any] | None = None):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"{str(self.model_dir)!r} is not a saved model directory (no config.json); pass a folder written by "
                f"save_pretrained, e.g. --policy transformers:/path/to/model"
            )
        self.generate_kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, **(generate_kwargs or {})}
        self.device = device
        self._wrapper = None
        self._generation: Generation | None = None

    def _load(self):
        from torchrl.modules.llm import TransformersWrapper
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, local_files_only=True)
        if self.device:
            model = model.to(self.device)
        model.eval()
        return TransformersWrapper(model, tokenizer=tokenizer, input_mode="history", generate=True,
                                   return_log_probs=True, generate_kwargs=self.generate_kwargs)

    def respond(self, messages: Messages) -> str:
        """Generate the next response for ``messages``."""
        from tensordict import TensorDict
        from torchrl.modules.llm.policies import ChatHistory

        from ..transforms.history import History

        if self._wrapper is None:
            self._wrapper = self._load()
        chat = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        history = History.from_chats([chat])
        output = self._wrapper(TensorDict(history=ChatHistory(prompt=history), batch_size=(1,)))
        log_probs = output.get(("log_probs", "response"), None)
        self._generation = Generation(
            prompt_tokens=output["tokens", "prompt"][0].tolist(),
            response_tokens=output["tokens", "response"][0].tolist(),
            log_probs=None if log_probs is None else log_probs[0].tolist(),
            policy_version=self.version,
        )
        return str(output["text", "response"][0])

    def last_generation(self) -> Generation | None:
        """The token ids and log-probs of the last response (None before the first)."""
        return self._generation

    def close(self) -> None:
        """Drop the model."""
        self._wrapper = None
