"""The APIs the gateway serves: one name per endpoint, used by config, routing, metrics and backends."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ENDPOINT_PATHS", "Endpoint"]


class Endpoint(StrEnum):
    COMPLETIONS = "completions"  # POST /v1/completions (legacy text completions)
    CHAT = "chat"  # POST /v1/chat/completions


ENDPOINT_PATHS: dict[Endpoint, str] = {
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.CHAT: "/v1/chat/completions",
}
