"""Checked component outputs: the chain checks what each component returns where it calls it.

- parser: a pair ``(thought, action)`` of two strings (a tuple or a list), or ``FormatError`` ("no action").
- action isolator: the action, a string (or ``FormatError``).
- reward assigner: a finite number: a ``float``, an ``int``, any ``numbers.Real`` (numpy's scalars are), or a
  tensor/array holding exactly one real value; a ``bool`` is refused (it is almost always a predicate returned by
  mistake: return ``float(ok)``). And the ``info`` it was given must be the same afterwards: same keys, same values,
  the same ``score`` list with the same metric dicts (compared shallowly: one level into ``info`` and into each of
  ``info["score"]``'s dicts; a shallow copy of those is taken before the call, a few dozen objects at most).
- template set: the templates the chain renders (and the format-error text) are strings.
- history processor: a non-empty list of ``{"role", "content"}`` dicts, each role one of system, user, assistant.

A violation raises ``ComponentOutputError``, which names the kind, the registered name, the distribution that
registered it, the bad value and the contract. One exception: a parser that raises something else than
``FormatError`` on a reply, but reads an ordinary reply, failed on that reply (a hostile one: nested 50,000 deep, a
megabyte of openers): the reply is a format error (``ParserFailedOnReply``, a ``FormatError``: the chain retries and
applies ``reward_wrong_format``, and the episode goes on), and a ``ParserFailedWarning`` carries the component's error
for whoever runs the env. A parser that fails on an ordinary reply too is broken: its error fails the step. An action
isolator is judged the same way: one that raises on a reply but turns an ordinary reply into an action makes that
reply a format error (``IsolatorFailedOnReply``, with an ``IsolatorFailedWarning``). The
checks cost a few isinstance calls per step (``bench/bench_output_checks.py`` measures them); ``ENABLED`` turns them
off, for that benchmark only.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import ComponentOutputError, ComponentRaisedError, FormatError

ENABLED = True
"""Whether the chain checks component outputs. On by default; the benchmark turns it off to measure the cost."""

CONTRACTS = {
    "parser": "a parser must return a pair (thought, action) of two strings, or raise FormatError when the response "
              "holds no action",
    "isolator": "an action isolator must return the action as a string, or raise FormatError when the response holds "
                "no action",
    "reward": "a reward assigner must return a finite float (an int, a numpy number or a one-element tensor will do; "
              "a bool will not)",
    "reward_info": "a reward assigner must not change the info it is given (copy it first)",
    "template": "a template set's templates must be strings (str.format templates) and render to strings",
    "history": "a history processor must return a non-empty list of {'role': 'system' | 'user' | 'assistant', "
               "'content': str} dicts",
}

_MISSING = object()

Describe = str | Callable[[], str]
"""What a component was called on, for its error: text, or a function making it (called only when it raised, so
that no step pays for describing itself)."""

MUST = {
    "parser": "a parser must return (thought, action), or raise FormatError when the response holds no action, and "
              "raise nothing else",
    "isolator": "an action isolator must return the action, or raise FormatError when the response holds no action, "
                "and raise nothing else",
    "reward": "a reward assigner must return a float for every step, never raise (read info['score'][-1] only when "
              "info['evaluation_status'] == 'ok')",
    "template": "a template set's templates must render with the placeholders the env gives each of them",
    "history": "a history processor must return the messages the policy sees for every conversation, never raise",
}
"""What each kind must do instead of raising, for ``raised``'s message."""


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters."""
    try:
        text = " ".join(repr(value).split())
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def origin(kind: str, name: str, task: Any = None) -> str:
    """Where the component ``name`` of ``kind`` came from, for an error message: what the registry found when it
    resolved ``task`` (``ResolvedTask.origins``); without that (a chain assembled by hand), its lazy reference."""
    known = (getattr(task, "origins", None) or {}).get(kind)
    if known:
        return str(known)
    ref = (getattr(getattr(task, "spec", None), "components", None) or {}).get(kind)
    return f"from {ref!r}" if ref else "not registered by name"


def fail(kind: str, task: Any, problem: str, contract: str, value: Any = None) -> ComponentOutputError:
    """The error of ``task``'s ``kind`` component (its name is the one the task spec holds)."""
    name = str(getattr(getattr(task, "spec", None), kind, None) or "?")
    return ComponentOutputError(kind, name, origin(kind, name, task), problem, contract, value)


def raised(kind: str, task: Any, exc: BaseException, during: Describe = "") -> ComponentRaisedError:
    """The error of ``task``'s ``kind`` component that raised ``exc`` (``during``, or what it returns when it is a
    function, says on what, e.g. " on a step with exit_status 'submitted'"): it names the component, its
    distribution, the exception and the fix."""
    name = str(getattr(getattr(task, "spec", None), kind, None) or "?")
    check = f"`mlgym-registry check --kind {kind} {name}` runs the conformance kit on it"
    return ComponentRaisedError(kind, name, origin(kind, name, task),
                                f"raised {type(exc).__name__}: {_exception_text(exc)}"
                                f"{during() if callable(during) else during}",
                                f"{MUST[kind]}. Fix it; {check}", exc)


def _exception_text(exc: BaseException, limit: int = 300) -> str:
    """``exc``'s message on one line (a ``KeyError`` with a sentence shows the sentence, not its repr)."""
    args = getattr(exc, "args", ())
    text = args[0] if isinstance(exc, KeyError) and len(args) == 1 and isinstance(args[0], str) and " " in args[0] \
        else str(exc)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def calling(kind: str, task: Any, call: Any, *args: Any, during: Describe = "") -> Any:
    """``call(*args)``, with any exception but ``FormatError`` (a parser's or isolator's "no action") and another
    component's ``ComponentOutputError`` turned into ``raised``'s error (the exception itself when checks are off)."""
    if not ENABLED:
        return call(*args)
    try:
        return call(*args)
    except (FormatError, ComponentOutputError):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a component raises is reported as that component's
        raise raised(kind, task, exc, during) from exc


def returned(value: Any) -> str:
    return f"returned {short_repr(value)}"


# -- parser and isolator -----------------------------------------------------------------------------------------
def check_parser_output(value: Any, task: Any) -> tuple[str, str]:
    """``value`` as ``(thought, action)`` when it is a pair of two strings; ``ComponentOutputError`` otherwise."""
    if (type(value) is tuple or type(value) is list) and len(value) == 2:
        thought, action = value
        if isinstance(thought, str) and isinstance(action, str):
            return thought, action
        part, bad = ("thought", thought) if not isinstance(thought, str) else ("action", action)
        problem = f"returned a pair whose {part} is {short_repr(bad, 40)}: {short_repr(value, 60)}"
        raise fail("parser", task, problem, CONTRACTS["parser"], value)
    raise fail("parser", task, returned(value), CONTRACTS["parser"], value)


ORDINARY_REPLIES = (
    "DISCUSSION\nLet me look at the files first.\n```\nls -a\n```",
    "<command>\nls -a\n</command>",
    '{"thought": "Let me look at the files first.", "command": "ls -a"}',
    "ls -a",
)
"""One ordinary reply in each common style (the kit's ``WELL_FORMED_RESPONSES``): a parser that reads none of them,
nor its own ``format_action("ls -a")``, is broken rather than beaten by a reply."""


class ParserFailedWarning(RuntimeWarning):
    """A parser raised something else than ``FormatError`` on a reply it could not read; the reply was taken as a
    format error. The message is the parser's ``ComponentRaisedError`` (kind, name, distribution, exception, fix)."""


class IsolatorFailedWarning(RuntimeWarning):
    """An action isolator raised something else than ``FormatError`` on a reply; the reply was taken as a format
    error. The message is the isolator's ``ComponentRaisedError`` (kind, name, distribution, exception, fix)."""


class ComponentFailedOnReply(FormatError):
    """The format error of a reply a component raised on (not ``FormatError``): the message is for the model, the
    component's own error is ``component_error`` (a ``ComponentRaisedError``, with the exception as its ``cause``)."""

    def __init__(self, message: str, component_error: ComponentRaisedError):
        super().__init__(message)
        self.component_error = component_error


class ParserFailedOnReply(ComponentFailedOnReply):
    """The format error of a reply the parser raised on (see ``ComponentFailedOnReply``)."""


class IsolatorFailedOnReply(ComponentFailedOnReply):
    """The format error of a reply the action isolator raised on (see ``ComponentFailedOnReply``)."""


_ON_REPLY: dict[str, tuple[type[ComponentFailedOnReply], type[RuntimeWarning], str]] = {
    "parser": (ParserFailedOnReply, ParserFailedWarning, "The reply could not be read: the parser failed on it"),
    "isolator": (IsolatorFailedOnReply, IsolatorFailedWarning,
                 "The reply could not be used: the action isolator failed on it"),
}


def failed_on_reply(kind: str, task: Any, response: str, exc: Exception,
                    handles_ordinary: Callable[[], bool]) -> ComponentRaisedError | ComponentFailedOnReply:
    """What the chain raises for ``task``'s ``kind`` component (``"parser"`` or ``"isolator"``) that raised ``exc``
    (not ``FormatError``) on ``response``: its ``ComponentRaisedError`` when ``handles_ordinary()`` says it cannot
    handle an ordinary reply either (it is broken: the step fails), else the reply's format error
    (``ParserFailedOnReply``, ``IsolatorFailedOnReply``) after a warning carrying that error."""
    error = raised(kind, task, exc, during=f" on a reply of {len(response):,} characters")
    if not handles_ordinary():
        return error
    failure, warning, told = _ON_REPLY[kind]
    warnings.warn(f"{error}. The reply was taken as a format error (the episode goes on)", warning, stacklevel=3)
    return failure(f"{told} ({type(exc).__name__}). Write a plain reply in the format asked for.", error)


def parser_raised(task: Any, parser: Any, response: str, exc: Exception) -> ComponentRaisedError | ParserFailedOnReply:
    """What the chain raises for a parser that raised ``exc`` (not ``FormatError``) on ``response``: the parser's
    ``ComponentRaisedError`` when it cannot read an ordinary reply either (it is broken: the step fails), else a
    ``ParserFailedOnReply`` (the reply is a format error) after a ``ParserFailedWarning`` with that error."""
    return failed_on_reply("parser", task, response, exc, lambda: reads_an_ordinary_reply(parser))


def isolator_raised(task: Any, isolator: Any, parser: Any, response: str,
                    exc: Exception) -> ComponentRaisedError | IsolatorFailedOnReply:
    """What the chain raises for an isolator that raised ``exc`` (not ``FormatError``) on ``response``: the
    isolator's ``ComponentRaisedError`` when it gives no action for an ordinary reply either (it is broken: the step
    fails), else an ``IsolatorFailedOnReply`` (the reply is a format error) after an ``IsolatorFailedWarning``."""
    return failed_on_reply("isolator", task, response, exc, lambda: isolates_an_ordinary_reply(isolator, parser))


def ordinary_replies(parser: Any) -> list[str]:
    """``ORDINARY_REPLIES``, after the parser's own ``format_action("ls -a")`` when it declares one that works."""
    replies = list(ORDINARY_REPLIES)
    try:
        own = parser.format_action("ls -a") if callable(getattr(parser, "format_action", None)) else None
    except Exception:  # noqa: BLE001 - a broken format_action is one more sign of a broken parser, not an error here
        own = None
    if isinstance(own, str):
        replies.insert(0, own)
    return replies


def reads_an_ordinary_reply(parser: Any) -> bool:
    """Whether ``parser`` gives a pair of strings for its own ``format_action("ls -a")`` or for one of
    ``ORDINARY_REPLIES`` (whatever it raises on the others)."""
    for reply in ordinary_replies(parser):
        try:
            value = parser(reply)
        except Exception:  # noqa: BLE001 - FormatError or not, this reply was not read
            continue
        if (type(value) is tuple or type(value) is list) and len(value) == 2 and all(isinstance(part, str)
                                                                                  for part in value):
            return True
    return False


def isolates_an_ordinary_reply(isolator: Any, parser: Any) -> bool:
    """Whether ``isolator(reply, parser)`` gives an action (a string) for one of ``ordinary_replies(parser)``."""
    for reply in ordinary_replies(parser):
        try:
            if isinstance(isolator(reply, parser), str):
                return True
        except Exception:  # noqa: BLE001 - FormatError or not, this reply gave no action
            continue
    return False


class CheckedParser:
    """A task's parser whose every output is checked; reads any other attribute from the parser itself.

    What the parser raises but ``FormatError`` is ``parser_raised``'s: a format error of the reply when the parser
    reads ordinary replies, the parser's ``ComponentRaisedError`` (the step fails) when it does not."""

    __slots__ = ("parser", "task")

    def __init__(self, parser: Any, task: Any):
        self.parser, self.task = parser, task

    def __call__(self, response: str) -> tuple[str, str]:
        try:
            value = self.parser(response)
        except (FormatError, ComponentOutputError):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a parser raises is judged by parser_raised
            raise parser_raised(self.task, self.parser, response, exc) from exc
        return check_parser_output(value, self.task)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)

    def __repr__(self) -> str:
        return repr(self.parser)


def checked_parser(task: Any) -> Any:
    """``task.parser``, wrapped so its outputs are checked (the parser itself when checks are off)."""
    return CheckedParser(task.parser, task) if ENABLED else task.parser


def call_isolator(task: Any, response: str, parser: Any) -> str:
    """``task.isolator(response, parser)``, its output checked, when checks are on. What it raises but
    ``FormatError`` is ``isolator_raised``'s: a format error of the reply when the isolator gives an action for an
    ordinary reply (asked with ``task.parser`` itself, so that the probe warns of nothing), its
    ``ComponentRaisedError`` (the step fails) when it does not. A parser's own error, raised through it, stays the
    parser's."""
    if not ENABLED:
        return task.isolator(response, parser)
    try:
        action = task.isolator(response, parser)
    except (FormatError, ComponentOutputError):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever an isolator raises is judged by isolator_raised
        raise isolator_raised(task, task.isolator, getattr(task, "parser", None) or parser, response, exc) from exc
    return check_isolator_output(action, task)


def check_isolator_output(value: Any, task: Any) -> str:
    """``value`` when it is a string; ``ComponentOutputError`` otherwise."""
    if isinstance(value, str):
        return value
    raise fail("isolator", task, returned(value), CONTRACTS["isolator"], value)


# -- reward ------------------------------------------------------------------------------------------------------
def reward_value(value: Any, task: Any) -> float:
    """``value`` as a finite float; ``ComponentOutputError`` for anything else (see the module docstring)."""
    if type(value) is float:  # the common case, first
        number = value
    elif isinstance(value, bool) or type(value).__name__ == "bool_":
        raise fail("reward", task, returned(value), CONTRACTS["reward"] + "; return float(flag) for a flag", value)
    elif isinstance(value, numbers.Real):
        number = float(value)
    else:
        number = _single_real(value)
        if number is None:
            raise fail("reward", task, returned(value), CONTRACTS["reward"], value)
    if not math.isfinite(number):
        raise fail("reward", task, returned(value), CONTRACTS["reward"], value)
    return number


def _single_real(value: Any) -> float | None:
    """The real number in a tensor or array of exactly one element (not bool, not complex), else None."""
    size = getattr(value, "numel", None)
    size = size() if callable(size) else getattr(value, "size", None)
    dtype = str(getattr(value, "dtype", ""))
    if size != 1 or not hasattr(value, "item") or "bool" in dtype or "complex" in dtype:
        return None
    try:
        item = value.item()
    except Exception:
        return None
    if isinstance(item, bool) or not isinstance(item, numbers.Real):
        return None
    return float(item)


def info_snapshot(info: Any) -> tuple | None:
    """What ``info_change`` compares: shallow copies of ``info``, of its ``score`` list and of that list's dicts."""
    if type(info) is not dict:
        return None
    score = info.get("score")
    if type(score) is list:
        return dict(info), score, list(score), [dict(item) if type(item) is dict else item for item in score]
    return dict(info), None, None, None


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # arrays and other values without a plain truth value
        return False


def _dict_change(now: dict, before: dict, where: str) -> str | None:
    for key, value in before.items():
        current = now.get(key, _MISSING)
        if current is _MISSING:
            return f"removed {where}[{key!r}]"
        if not _same(current, value):
            return f"changed {where}[{key!r}] from {short_repr(value, 40)} to {short_repr(current, 40)}"
    if len(now) != len(before):
        added = next(key for key in now if key not in before)
        return f"added {where}[{added!r}] = {short_repr(now[added], 40)}"
    return None


def info_change(info: dict, snapshot: tuple) -> str | None:
    """How ``info`` differs from its ``snapshot`` (one sentence), or None when it does not."""
    before, score, items, dicts = snapshot
    change = _dict_change(info, before, "info")
    if change is not None or score is None:
        return change
    if len(score) != len(items) or any(a is not b for a, b in zip(score, items, strict=True)):
        return f"changed info['score'] from {short_repr(items, 40)} to {short_repr(score, 40)}"
    for index, (item, copy) in enumerate(zip(score, dicts, strict=True)):
        if type(item) is dict:
            change = _dict_change(item, copy, f"info['score'][{index}]")
            if change is not None:
                return change
    return None


def call_reward(task: Any, observation: str, info: dict) -> float:
    """``task.reward(observation, info, task.spec)`` as a float, checked (value and ``info``) when checks are on."""
    if not ENABLED:
        return float(task.reward(observation, info, task.spec))
    snapshot = info_snapshot(info)
    value = calling("reward", task, task.reward, observation, info, task.spec, during=lambda: _step_text(info))
    if snapshot is not None:
        change = info_change(info, snapshot)
        if change is not None:
            raise fail("reward", task, change, CONTRACTS["reward_info"], info)
    return reward_value(value, task)


def _step_text(info: Any) -> str:
    """The step a reward assigner raised on, for its error."""
    if not isinstance(info, dict):
        return ""
    return (f" on a step with exit_status {info.get('exit_status')!r}, evaluation_status "
            f"{info.get('evaluation_status')!r} and score {short_repr(info.get('score'), 60)}")


# -- template set ------------------------------------------------------------------------------------------------
def render_template(task: Any, what: str, render: Any, *args: Any) -> str:
    """``render(*args)`` of the template ``what``, whatever it raises (a placeholder the env does not give it, a bad
    format spec) reported as the template set's error."""
    return calling("template", task, render, *args, during=f" rendering its {what}")


def call_history(task: Any, messages: list) -> Any:
    """``task.history(messages)``, whatever it raises reported as the history processor's error."""
    return calling("history", task, task.history, messages,
                   during=lambda: f" on a conversation of {len(messages)} messages")


def check_template_text(value: Any, task: Any, what: str) -> str:
    """``value`` when it is a string; ``ComponentOutputError`` naming the template field ``what`` otherwise."""
    if isinstance(value, str):
        return value
    raise fail("template", task, f"gave {short_repr(value)} as its {what}", CONTRACTS["template"], value)


# -- history processor -------------------------------------------------------------------------------------------
_ROLES = frozenset(("system", "user", "assistant"))


def bad_message(messages: list) -> tuple[int, Any] | None:
    """The index and value of the first item of ``messages`` that is not a ``{"role", "content"}`` dict with a known
    role and string content, or None when all are."""
    for index, item in enumerate(messages):
        if not isinstance(item, dict) or item.get("role") not in _ROLES or not isinstance(item.get("content"), str):
            return index, item
    return None


def check_history_output(value: Any, task: Any) -> list:
    """``value`` when it is a non-empty list of ``{"role", "content"}`` dicts with a known role and string content;
    ``ComponentOutputError`` naming the first bad message otherwise."""
    if type(value) is not list or not value:
        raise fail("history", task, returned(value), CONTRACTS["history"], value)
    bad = bad_message(value)
    if bad is not None:
        raise fail("history", task, f"returned {short_repr(bad[1])} as message {bad[0]}", CONTRACTS["history"], bad[1])
    return value
