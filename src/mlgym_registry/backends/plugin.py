"""The built-in backends, registered as an ordinary plugin."""

from __future__ import annotations

from ..hookspecs import hookimpl


@hookimpl
def register_backends(register):
    register(
        "local",
        "mlgym_registry.backends.local:LocalBackend",
        description="Embedded, container-free backend: a bash session in a temporary workspace.",
    )
    register(
        "mlgym",
        "mlgym_registry.backends.mlgym:MLGymBackend",
        description="The real MLGym (facebookresearch/MLGym) in docker or podman containers.",
    )
