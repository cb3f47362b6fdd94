"""Moved to ``mlgym_registry.options`` (the option rules now sit with their owners); kept for one release."""

from ._moved import alias

alias(__name__, "mlgym_registry.options")
