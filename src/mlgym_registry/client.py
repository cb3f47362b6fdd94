"""The OpenEnv client of ``mlgym-registry serve``, and the wire types it shares with the server.

Needs the ``[openenv]`` extra; ``import mlgym_registry`` never imports this module. OpenEnv's ``AutoEnv`` finds it
by its conventions: the module ``<package>.client`` holding ``MlgymEnv``, ``MlgymAction`` and ``MlgymObservation``,
named from ``name: mlgym`` in the package's ``openenv.yaml`` (see docs/serving.md, "Discovery").

    from mlgym_registry.client import connect

    with connect("http://127.0.0.1:8000") as env:
        result = env.reset(seed=0)
        result = env.step(MlgymAction(response="...```\\nls\\n```"))
"""

from __future__ import annotations

import os
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

ENV_NAME = "mlgym"
"""The environment's name in OpenEnv: its ``openenv.yaml`` name, the task routes' ``/{env_name}/...`` and the
``/metadata`` name."""

DEFAULT_MESSAGE_TIMEOUT_S = 4 * 3600.0
"""How long ``connect`` lets one reset or step take: OpenEnv's client gives up after 60 s by default, drops the
connection and opens a fresh, un-reset session on the next call, while a training command or an evaluation may run
for the task's ``training_timeout`` (an hour unless the task says otherwise). ``GET /serving`` gives the figure for
the tasks a server serves (``message_timeout_s``)."""

TOKEN_HEADER = "Authorization"
"""The header that carries the server's token, as ``Bearer <token>``, on HTTP requests and the WebSocket handshake."""


class MlgymAction(Action):
    """One turn of the agent: the model's whole reply, parsed by the task's parser as in ``registry.make``."""

    response: str = Field(description="the model's reply; its command is the last fenced block")


class MlgymObservation(Observation):
    """What the agent sees after a reset or a step.

    ``message`` is the next user message of the conversation (the command's output with the state line, or the
    format-error message); ``reward`` and ``done`` are the chain's. ``metadata`` holds ``task``, ``exit_status``,
    ``score``, ``evaluation_status``, ``evaluations``, ``submission``, ``thought``, ``action``, ``output``,
    ``format_error``, ``terminated`` and ``truncated`` (after a reset: ``task`` and ``system``, the system message).
    ``prompt`` is the whole conversation rendered by the chat template, only when the episode was reset with
    ``prompt=True`` (it grows every turn).
    """

    message: str = Field(default="", description="the next user message the model sees")
    prompt: str | None = Field(default=None, description="the rendered prompt (reset with prompt=True)")


class MlgymState(State):
    """The session's state: the task, the episode's id, seed and step count, and whether it is over."""

    task: str | None = Field(default=None, description="the task of the current episode")
    seed: int | None = Field(default=None, description="the seed the episode was reset with")
    episode_done: bool = Field(default=False, description="True once the episode has ended: reset to go on")
    exit_status: str = Field(default="", description="how the episode ended (MLGym's exit status)")


class MlgymEnv(EnvClient[MlgymAction, MlgymObservation, MlgymState]):
    """OpenEnv client of ``mlgym-registry serve`` (one WebSocket session, one env on the server).

    ``reset(task=..., seed=..., prompt=False)`` starts an episode (``task`` chooses among the served tasks);
    ``step(MlgymAction(response=...))`` sends a reply. A step before the first reset, or after the episode ended,
    is an error and the session stays usable. Build it with ``connect`` for a message timeout long enough for
    training commands and the token header; OpenEnv's ``GenericEnvClient`` speaks the same protocol with dicts.
    """

    def _step_payload(self, action: MlgymAction | dict[str, Any] | str) -> dict[str, Any]:
        if isinstance(action, str):
            return {"response": action}
        if isinstance(action, dict):
            return action
        return action.model_dump(exclude={"metadata"}, exclude_defaults=False)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MlgymObservation]:
        fields = dict(payload.get("observation") or {})
        fields.pop("reward", None)
        fields.pop("done", None)
        observation = MlgymObservation(**fields, reward=payload.get("reward"), done=payload.get("done", False))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False),
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> MlgymState:
        return MlgymState(**payload)


def auth_headers(token: str | None) -> dict[str, str] | None:
    """The headers that carry ``token`` (None without one)."""
    return {TOKEN_HEADER: f"Bearer {token}"} if token else None


def connect(base_url: str, *, token: str | None = None, token_env: str | None = None,
            message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S, client_cls: type[EnvClient] = MlgymEnv,
            **kwargs: Any) -> Any:
    """A synchronous client of the server at ``base_url`` (``http://host:port``), not yet connected.

    ``token`` (or the environment variable named ``token_env``) is sent as ``Authorization: Bearer``;
    ``message_timeout_s`` replaces OpenEnv's 60 s default (see ``DEFAULT_MESSAGE_TIMEOUT_S``); ``client_cls`` may be
    ``openenv.GenericEnvClient`` for dict observations; ``kwargs`` go to the client's constructor.
    """
    if token is None and token_env:
        token = os.environ.get(token_env) or None
    client = client_cls(base_url=base_url, message_timeout_s=message_timeout_s, headers=auth_headers(token), **kwargs)
    return client.sync()
