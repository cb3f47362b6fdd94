"""What every stage of the chain shares: access to the base env, the current task and its components."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import Transform

from ..components import output_checks
from ..components.template_set import TemplateSet
from ..components.templates import format_reply_instructions
from .backend_env import BackendEnv, task_fields
from .layout import Layout

ASSISTANT_KEY = "_assistant"
"""Private key (in the inverse pass only) holding the assistant turn's content, as the chat template extracted it."""
FORMAT_ERROR_KEY = "_format_error"
"""Private key (in the inverse pass only) holding the isolator's format-error text on a retry step."""


def template_set(template: Any) -> TemplateSet:
    """A ``TemplateSet`` from a template component (a ``TemplateSet`` or a zero-arg callable returning one)."""
    if isinstance(template, TemplateSet):
        return template
    if callable(template):
        built = template()
        if isinstance(built, TemplateSet):
            return built
    # duck typing: anything with MLGym's template fields works
    if hasattr(template, "system_template") and hasattr(template, "task_template"):
        return template
    raise TypeError(f"template component {template!r} is not a TemplateSet nor a factory of one")


def format_template(template: str, fields: dict[str, Any], *, what: str) -> str:
    """``template.format(**fields)``, with an error naming the template and the missing placeholder."""
    try:
        return template.format(**fields)
    except KeyError as exc:
        raise KeyError(
            f"{what} uses the placeholder {{{exc.args[0]}}}, which neither the task, the tools nor the state provide; "
            f"available: {', '.join(sorted(fields))}"
        ) from None


def refuse_stepped(tensordict: TensorDictBase) -> None:
    """Raise ``EnvMisuseError`` when ``tensordict`` was already stepped (it holds the previous step's ``next``): the
    usual slip of stepping by hand without ``env.step_mdp``, which otherwise fails deep in tensordict."""
    if "next" in tensordict.keys():
        from ..errors import EnvMisuseError

        raise EnvMisuseError(
            "env.step() got a tensordict that was already stepped (it holds the previous step's 'next'); step the "
            "next turn with the output of env.step_mdp(td) (or td['next']), as TorchRL's rollout() and collectors do"
        )


def missing_response(layout: Layout) -> Exception:
    """The error of a step whose input holds no model response: where the env reads it, and what writes it there."""
    from ..errors import PolicyOutputError

    message = f"the step input has no model response at {layout.response!r}: write the response text there"
    if layout.tokens_response is not None:
        message += (" (TorchRL's TransformersWrapper and vLLMWrapper do, in every input mode; with "
                    f"input_mode='tokens' the token ids at {layout.tokens_response!r} do too)")
    return PolicyOutputError(message)


def text_of(value: Any, default: str = "") -> str:
    """The string in a tensordict entry (a ``str`` or TorchRL's ``NonTensorData`` around one); ``default`` for None."""
    if value is None:
        return default
    return value if isinstance(value, str) else str(getattr(value, "data", value))


def is_retry(tensordict: TensorDictBase, layout: Layout) -> bool:
    """True when the step held in ``tensordict`` (time t) was flagged as a retry by the isolator."""
    value = tensordict.get(layout.retry, None)
    if value is None:
        return False
    if isinstance(value, torch.Tensor):
        return bool(value.any())
    return bool(value)


class ChainTransform(Transform):
    """A stage of the chain: reads the current task, backend and tools from the ``BackendEnv`` at the bottom."""

    def __init__(self, layout: Layout, **kwargs: Any):
        super().__init__(**kwargs)
        self.layout = layout

    @property
    def base(self) -> BackendEnv:
        """The ``BackendEnv`` under the chain."""
        parent = self.parent
        if parent is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to an env")
        base = parent.base_env
        if not isinstance(base, BackendEnv):
            raise TypeError(f"{type(self).__name__} needs a BackendEnv at the bottom of the chain, got {type(base)}")
        return base

    @property
    def templates(self) -> TemplateSet:
        """The current task's template set."""
        return template_set(self.base.task.template)

    def render_template(self, template: Any, fields: dict[str, Any], *, what: str) -> str:
        """``format_template`` of one of the current task's templates, checked to be a string (``output_checks``)."""
        if output_checks.ENABLED and not isinstance(template, str):
            output_checks.check_template_text(template, self.base.task, what)
        return output_checks.render_template(self.base.task, what, lambda: format_template(template, fields, what=what))

    def template_fields(self) -> dict[str, Any]:
        """Task fields plus ``command_docs``, the tools' env variables and ``format_instructions`` (how to write a
        reply for the current task's parser, ``format_reply_instructions``): what every template may use.

        They are fixed for an episode, so they are gathered once per reset (the reset module clears the cache).
        """
        base = self.base
        if base.fields is None:
            fields = task_fields(base.backend)
            tools = base.tools
            if tools is not None:
                fields.update(tools.env_variables)
                fields["command_docs"] = tools.command_docs
            fields["format_instructions"] = self._format_instructions()
            base.fields = fields
        return dict(base.fields)

    def _format_instructions(self) -> Any:
        """The current task's parser's ``format_instructions`` (or the fallback), checked to be a string."""
        parser = self.base.task.parser
        text = format_reply_instructions(parser)
        if output_checks.ENABLED and not isinstance(text, str):
            source = ("format_instructions" if getattr(parser, "format_instructions", None) is not None
                      else "format_action('ls -a')")
            raise output_checks.fail("parser", self.base.task, f"gave {output_checks.short_repr(text)} as its "
                                     f"{source}", "a parser's format_instructions (how to write a reply, shown in the "
                                     "system prompt) must be a string, and format_action(action) must return the "
                                     "response text (a string)", text)
        return text
