"""Which endpoints a model is served on: ``models[].endpoints`` x what its routes' backends serve."""

from __future__ import annotations

from typing import ClassVar

import pytest

from backends.base import Backend
from backends.chat_capabilities import ChatCapabilities
from backends.mock.capabilities import MOCK_CHAT
from gateway.app import create_app
from gateway.configfile import ConfigError, parse_config
from gateway.flow.endpoints import OPS
from gateway.state import STATE
from schemas.chat import ChatCompletionRequest
from schemas.endpoints import Endpoint
from schemas.errors import NotFoundError
from tests.fakes import ScriptedBackend


class ChatScripted(ScriptedBackend):
    """A scripted backend that also declares chat (the router only reads the declaration here)."""

    kind: ClassVar[str] = "scripted-chat"
    endpoints: frozenset[Endpoint] = frozenset(Endpoint)
    chat_capabilities: ChatCapabilities | None = MOCK_CHAT


def config(models: str) -> str:
    return f"""backends:
  - {{name: text, type: openai, base_url: "http://127.0.0.1:9"}}
  - {{name: both, type: openai, base_url: "http://127.0.0.1:9"}}
models:
{models}"""


def backends() -> dict[str, Backend]:
    return {"text": ScriptedBackend("text"), "both": ChatScripted("both")}


def test_endpoint_no_route_can_serve_is_a_start_up_error_with_its_yaml_path() -> None:
    text = config("  - name: m\n    endpoints: [completions, chat]\n    routes: [{backend: text, model: x}]\n")
    with pytest.raises(ConfigError) as caught:
        create_app(parse_config(text, env={}), backends=backends())
    (path, message), *_ = caught.value.problems
    assert path == "models[0].endpoints[1]"
    assert "'chat'" in message and "text" in message


def test_default_is_every_endpoint_the_routes_serve() -> None:
    text = config(
        "  - name: mixed\n    routes: [{backend: text, model: x}, {backend: both, model: y}]\n"
        "  - name: chat-only\n    endpoints: [chat]\n    routes: [{backend: both, model: y}]\n"
        "  - name: plain\n    routes: [{backend: text, model: x}]\n"
    )
    router = create_app(parse_config(text, env={}), backends=backends())[STATE].router
    mixed = router.lookup("mixed")
    assert [r.backend.name for r in mixed.routes_for(OPS[Endpoint.COMPLETIONS])] == ["text", "both"]
    assert [r.backend.name for r in mixed.routes_for(OPS[Endpoint.CHAT])] == ["both"]  # chat only where served
    with pytest.raises(NotFoundError) as caught:
        router.lookup("chat-only").routes_for(OPS[Endpoint.COMPLETIONS])
    assert caught.value.param == "model" and "served on v1/chat/completions" in caught.value.message
    with pytest.raises(NotFoundError) as caught:
        router.lookup("plain").routes_for(OPS[Endpoint.CHAT])
    assert "not supported in the v1/chat/completions endpoint" in caught.value.message


def test_chat_refusal_comes_from_the_chat_table_of_the_route() -> None:
    text = config("  - name: m\n    routes: [{backend: both, model: y}]\n")
    router = create_app(parse_config(text, env={}), backends=backends())[STATE].router
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_k": 4}
    )
    with pytest.raises(Exception) as caught:
        router.candidates(router.lookup("m"), request, OPS[Endpoint.CHAT])
    error = caught.value
    assert getattr(error, "param", None) == "top_k" and getattr(error, "code", None) == "unsupported_parameter"
    assert "(type scripted-chat)" in str(error)
