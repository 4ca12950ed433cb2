"""The upstream HTTP seam (``base``) and its clients: httptools (the default), aiohttp, httpx."""

from __future__ import annotations

from backends.transport.aiohttp_client import AiohttpTransport
from backends.transport.base import HTTPTransport, UpstreamResponse, get_ok
from backends.transport.httptools_client import FastHTTPTransport
from backends.transport.httpx_client import HttpxTransport
from schemas.config import HTTPUpstreamConfig

__all__ = [
    "AiohttpTransport",
    "FastHTTPTransport",
    "HTTPTransport",
    "HttpxTransport",
    "UpstreamResponse",
    "get_ok",
    "make_transport",
]


def make_transport(config: HTTPUpstreamConfig) -> HTTPTransport:
    """The configured upstream client for any HTTP backend (OpenAI-shaped or native)."""
    match config.transport:
        case "httpx":
            return HttpxTransport(config.name, config.timeout, config.max_connections)
        case "aiohttp":
            return AiohttpTransport(config.name, config.timeout, config.max_connections)
    return FastHTTPTransport(config.name, config.timeout, config.max_connections)
