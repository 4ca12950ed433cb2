"""The listener: limits against hostile clients, drain, admission control."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.config.common import _Strict

PRIORITIES = ("interactive", "batch")


class AdmissionConfig(_Strict):
    """Gateway-wide backpressure: a cap on completions in flight and a bounded wait queue."""

    max_in_flight: Annotated[int, Field(ge=1, le=1_000_000)] = 4096
    # Requests allowed to wait for a slot (gateway-wide, and per backend with max_concurrency);
    # beyond it, 429 at once.
    queue_size: Annotated[int, Field(ge=0, le=1_000_000)] = 1024
    # Seconds a request may wait in a queue before its 429.
    queue_timeout: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # Request header carrying the priority (``interactive`` or ``batch``); waiting
    # interactive requests are admitted before batch ones.
    priority_header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")] = "x-priority"
    default_priority: Literal["interactive", "batch"] = "interactive"


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    # Largest request body accepted (413 beyond it).
    max_body_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = 4 * 1024 * 1024
    # Seconds a SIGTERM waits for in-flight requests and streams.
    drain_timeout: Annotated[float, Field(ge=0)] = 30.0
    # Seconds a SIGTERM keeps accepting (while /health says draining) before it stops
    # listening, so load balancers notice first.
    drain_delay: Annotated[float, Field(ge=0, le=600)] = 0.0
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    access_log: bool = False
    # GET /docs: the API explorer (Swagger UI over /openapi.json, served from a pinned package, no CDN).
    api_explorer: bool = True
    # --- hardening against hostile or broken clients (README "Security") ---
    # Longest request line and longest header field (bytes), and most header fields; beyond: 400.
    max_header_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 8190
    max_headers: Annotated[int, Field(ge=16, le=10_000)] = 100
    # Longest array in ``prompt`` (a batch's prompts, one prompt's token ids); beyond: 400.
    max_prompt_array: Annotated[int, Field(ge=1, le=16 * 1024 * 1024)] = 131_072
    # Seconds a connection may take to deliver a request's headers, counted from its opening or
    # its previous answer (so also how long an idle keep-alive connection is kept): slowloris.
    client_header_timeout: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # Seconds a request's body may take to arrive once its headers are in; beyond: 408.
    client_body_timeout: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # One JSON line per completion request on the ``gateway.security.audit`` logger (key, model, backend,
    # status, tokens, latency).
    audit_log: bool = False
