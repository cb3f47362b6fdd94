"""The state the code driving a ``ChainEnv`` keeps on it, by name: what the env reads (``chain_env``) and what a fork
leaves behind (``forking``), in one place."""

LAST_OUTPUT = "_last_output"
"""Where the env keeps its last outermost call's output (``ChainEnv.last_output``): what a fork resumes at."""
RESUME_AT = "_resume_at"
"""Where a fork's child made with ``resume_on_reset`` keeps the branch its resets return until it is stepped."""
DRIVER_STATE = ("_output_adapter", "_call_depth", "_pool_token", LAST_OUTPUT, RESUME_AT)
"""What the code driving an env keeps on it (``ChainEnv.hand_outputs_to``, a pool's name for its outputs, its last
output): a child starts without the parent's (a child made to resume gets the branch of its own)."""
