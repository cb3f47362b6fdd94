"""The TorchRL transforms of the chain ``make`` builds, one module per stage, over a ``BackendEnv``.

``mlgym_registry.transforms.chain.build_env`` assembles them; they are exported here for anyone assembling a chain
by hand.

The names load on first use (PEP 562), so that ``transforms.chain``'s option rules, which ``registry.make`` checks
first, cost no torch import.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ActionIsolator": "action_isolator",
    "BackendEnv": "backend_env",
    "ChatBatch": "chat_batch",
    "ChatTemplate": "chat_template",
    "ContextPolicy": "context_policy",
    "GroupKey": "group_key",
    "HistoryView": "history_view",
    "LAYOUTS": "layout",
    "Layout": "layout",
    "MessageToHistory": "message_to_history",
    "ReadState": "read_state",
    "ResetModule": "reset_module",
    "RetrySkip": "retry_skip",
    "RewardAssigner": "reward_assigner",
    "StateToMessage": "state_to_message",
    "TaskSampler": "task_sampler",
    "TokensPrompt": "tokens",
    "TurnFacts": "turn_facts",
}
"""Each exported name and the module of this package that defines it."""

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
