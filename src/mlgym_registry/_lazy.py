"""Names a package exports but loads on first use (PEP 562): what lets a package's front stay cheap to import."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]) -> tuple[Callable[[str], Any],
                                                                                 Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of the package whose globals are ``namespace``: each name of
    ``exports`` is imported from the submodule it maps to (``{"BackendEnv": "backend_env"}``) when first asked for,
    then kept in ``namespace``; any other name raises ``AttributeError``.

        __getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
