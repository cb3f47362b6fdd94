"""Old import paths kept for one release after a module moved: the old module becomes the new one, with a warning.

A module that moved keeps a two-line file at its old path::

    from mlgym_registry._moved import alias
    alias(__name__, "mlgym_registry.records.trajectories")

Importing it then gives the new module itself (the same object, so monkeypatching and ``isinstance`` behave as
before) and warns once, with ``DeprecationWarning``, where to import it from now.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make the module being imported as ``old`` the module ``new``; warn that ``old`` goes in the next release."""
    warnings.warn(f"{old} moved to {new}: import it from there ({old} goes in the next release)",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
