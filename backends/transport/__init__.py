"""The upstream HTTP seam (``base``), its clients (httptools by default, aiohttp, httpx), their way out
(``egress``: proxy, TLS), the decoder (``sse``)."""

from __future__ import annotations

from backends.transport.aiohttp_client import AiohttpTransport
from backends.transport.base import HTTPTransport, UpstreamResponse, get_ok, send_ok
from backends.transport.egress import Egress, egress_of
from backends.transport.httptools_client import FastHTTPTransport
from backends.transport.httpx_client import HttpxTransport
from backends.transport.sse import EventBuffer, sse_data
from schemas.config import HTTPUpstreamConfig

__all__ = [
    "AiohttpTransport",
    "Egress",
    "EventBuffer",
    "FastHTTPTransport",
    "HTTPTransport",
    "HttpxTransport",
    "UpstreamResponse",
    "egress_of",
    "get_ok",
    "make_transport",
    "send_ok",
    "sse_data",
]


def make_transport(config: HTTPUpstreamConfig, egress: Egress | None = None) -> HTTPTransport:
    """The configured upstream client for any HTTP backend (OpenAI-shaped or native).

    ``egress``: the backend's, when already built for another of its transports (its probes).
    """
    max_body = config.limits.max_response_bytes
    egress = egress or egress_of(config)
    match config.transport:
        case "httpx":
            return HttpxTransport(config.name, config.timeout, config.max_connections, max_body=max_body, egress=egress)
        case "aiohttp":
            return AiohttpTransport(
                config.name, config.timeout, config.max_connections, max_body=max_body, egress=egress
            )
    return FastHTTPTransport(config.name, config.timeout, config.max_connections, max_body=max_body, egress=egress)
