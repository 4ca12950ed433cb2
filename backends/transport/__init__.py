"""The upstream HTTP seam (``base``), its clients (httptools by default, aiohttp, httpx), the decoder (``sse``)."""

from __future__ import annotations

from backends.transport.aiohttp_client import AiohttpTransport
from backends.transport.base import HTTPTransport, UpstreamResponse, get_ok, send_ok
from backends.transport.httptools_client import FastHTTPTransport
from backends.transport.httpx_client import HttpxTransport
from backends.transport.sse import EventBuffer, sse_data
from schemas.config import HTTPUpstreamConfig

__all__ = [
    "AiohttpTransport",
    "EventBuffer",
    "FastHTTPTransport",
    "HTTPTransport",
    "HttpxTransport",
    "UpstreamResponse",
    "get_ok",
    "make_transport",
    "send_ok",
    "sse_data",
]


def make_transport(config: HTTPUpstreamConfig) -> HTTPTransport:
    """The configured upstream client for any HTTP backend (OpenAI-shaped or native)."""
    max_body = config.limits.max_response_bytes
    match config.transport:
        case "httpx":
            return HttpxTransport(config.name, config.timeout, config.max_connections, max_body=max_body)
        case "aiohttp":
            return AiohttpTransport(config.name, config.timeout, config.max_connections, max_body=max_body)
    return FastHTTPTransport(config.name, config.timeout, config.max_connections, max_body=max_body)
