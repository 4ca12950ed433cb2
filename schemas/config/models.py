"""Models clients ask for, and the routes that serve them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.config.common import Name, _Strict


class RouteConfig(_Strict):
    backend: Name
    # The upstream's own model id.
    model: Annotated[str, Field(min_length=1)]
    weight: Annotated[float, Field(gt=0)] = 1.0


class ModelConfig(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    routes: Annotated[list[RouteConfig], Field(min_length=1)]
    strategy: Literal["failover", "round_robin", "weighted", "least_outstanding"] = "failover"


