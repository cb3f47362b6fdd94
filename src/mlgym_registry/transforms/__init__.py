"""The TorchRL transforms of the chain ``make`` builds, one module per stage, over a ``BackendEnv``.

``mlgym_registry.chain.build_env`` assembles them; they are exported here for anyone assembling a chain by hand.
"""

from .action_isolator import ActionIsolator
from .backend_env import BackendEnv
from .chat_batch import ChatBatch
from .chat_template import ChatTemplate
from .context_policy import ContextPolicy
from .group_key import GroupKey
from .history_view import HistoryView
from .layout import LAYOUTS, Layout
from .message_to_history import MessageToHistory
from .read_state import ReadState
from .reset_module import ResetModule
from .retry_skip import RetrySkip
from .reward_assigner import RewardAssigner
from .state_to_message import StateToMessage
from .task_sampler import TaskSampler
from .tokens import TokensPrompt

__all__ = [
    "LAYOUTS",
    "ActionIsolator",
    "BackendEnv",
    "ChatBatch",
    "ChatTemplate",
    "ContextPolicy",
    "GroupKey",
    "HistoryView",
    "Layout",
    "MessageToHistory",
    "ReadState",
    "ResetModule",
    "RetrySkip",
    "RewardAssigner",
    "StateToMessage",
    "TaskSampler",
    "TokensPrompt",
]
