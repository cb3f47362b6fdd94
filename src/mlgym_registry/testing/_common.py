"""What every check of the kit shares: its error and how it names things."""

from __future__ import annotations

from typing import Any


class ConformanceError(AssertionError):
    """A component that does not honour its contract; the message says which part and why."""


def _fail(what: str, why: str) -> None:
    raise ConformanceError(f"{what}: {why}")


def _name(obj: Any) -> str:
    """How a message names ``obj``: a template set by its ``name``, a function or class by its qualified name, an
    instance by its class's."""
    from ..components.template_set import TemplateSet

    if isinstance(obj, TemplateSet):
        return repr(obj.name)
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__
