"""The package's version, on its own so that any layer may name it without importing the package's front door."""

from __future__ import annotations

__version__ = "0.1.0"
"""This source tree's version, written here only: ``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``), and
``mlgym_registry.__version__`` hands it on."""
