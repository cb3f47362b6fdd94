"""The conformance kit's fixtures, as a plugin's own ``conftest.py`` exposes them."""

from mlgym_registry.testing import integrity_audit, registered_plugin  # noqa: F401 - pytest fixtures
