"""The embedded, container-free backend: MLGym's environment contract in a temporary workspace on this machine."""

from .backend import CommandTimeout, LocalBackend, LocalTask

__all__ = ["CommandTimeout", "LocalBackend", "LocalTask"]
