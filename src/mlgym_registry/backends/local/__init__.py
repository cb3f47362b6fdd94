"""The embedded, container-free backend: MLGym's environment contract in a temporary workspace on this machine."""

from .backend import LocalBackend, LocalTask
from .observations import CommandTimeout

__all__ = ["CommandTimeout", "LocalBackend", "LocalTask"]
