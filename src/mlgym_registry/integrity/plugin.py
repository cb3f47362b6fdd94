"""The package's canary set, registered as an ordinary plugin with a lazy reference."""

from __future__ import annotations

from ..hookspecs import hookimpl


@hookimpl
def register_canaries(register):
    register("mlgym_registry", "mlgym_registry.integrity.canaries:builtin_canaries",
             description="The package's canaries: the baseline twice, null and degenerate submissions of the task's "
                         "kind, planted hacks (forged score lines, rewritten evaluator and task files, module "
                         "shadows, rebound builtins, sleeping, hidden files, a full disk) and farming.")
