"""Models clients ask for, and the routes that serve them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from schemas.config.common import Name, _Strict
from schemas.config.pricing import PricingConfig
from schemas.endpoints import Endpoint


class RouteConfig(_Strict):
    backend: Name
    # The upstream's own model id.
    model: Annotated[str, Field(min_length=1)]
    weight: Annotated[float, Field(gt=0)] = 1.0
    # The upstream model's context window in tokens, for Responses' ``truncation``; unset: what
    # the backend reports (vLLM's ``max_model_len``), else unknown (the upstream decides).
    context_length: Annotated[int, Field(ge=1)] | None = None
    # What this route's tokens cost, when it differs from the model's ``pricing`` (the same model
    # on OpenAI and on your own vLLM); unset: the model's.
    pricing: PricingConfig | None = None


class ResponsesModelConfig(_Strict):
    """How ``POST /v1/responses`` treats this model's requests."""

    # OpenAI's built-in tools (web_search, file_search, ...) offered to a backend that cannot run
    # them: ``refuse`` (400 naming the tool, the default) or ``omit`` (left out; the answer's
    # ``x-gateway-omitted-tools`` header and the log say so). Clients such as the Codex CLI offer
    # web_search on every turn: ``omit`` is what lets them work against a self-hosted model.
    builtin_tools: Literal["refuse", "omit"] = "refuse"


class ModelConfig(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    routes: Annotated[list[RouteConfig], Field(min_length=1)]
    strategy: Literal["failover", "round_robin", "weighted", "least_outstanding"] = "failover"
    # The APIs this model is served on (``completions``, ``chat``, ``responses``); absent: every endpoint its
    # routes' backends can serve. A request to another endpoint gets 404 naming the ones it serves.
    endpoints: Annotated[list[Endpoint], Field(min_length=1)] | None = None
    responses: ResponsesModelConfig = ResponsesModelConfig()
    # Prices per million tokens (gateway.spend): the cost counter, the audit line's cost and the
    # keys' budgets read them. Unset (and unset on the route that answered): the request costs nothing.
    pricing: PricingConfig | None = None

    @field_validator("endpoints")
    @classmethod
    def _distinct(cls, value: list[Endpoint] | None) -> list[Endpoint] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each endpoint at most once")
        return value
