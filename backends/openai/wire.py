"""OpenAI's HTTP wire, for every family that speaks it (``openai``, ``vllm``): a library, not a base class.

:class:`OpenAIWire` owns what any request to an OpenAI-compatible server needs and nothing of one
family's dialect: the endpoint URLs under ``base_url``, the headers (the entry's own, the bearer
key, the content type, the request id), the transport with its POST paths (a non-200 answer goes
to the caller's ``status_error``), the completions body as the client sent it, the stream relay's
construction (which usage the client asked for), health and close. Each family's adapter holds
one and reads top to bottom in its own module: ``backends.openai.adapter`` relays, and
``backends.vllm.adapter`` translates per server version around the same calls.

The POST paths call ``transport.send`` themselves rather than ``send_ok``: one coroutine less
per request on the hot path; any status but 200 takes the one shared path (``refuse_status``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson

from backends.base import Call, UpstreamCall
from backends.capabilities import Capabilities
from backends.openai.chat import ask_stream_usage
from backends.openai.relay import OpenAIStreamRelay
from backends.transport import HTTPTransport, get_ok, make_transport
from backends.transport.base import StatusError, UpstreamResponse, refuse_status
from schemas.config import OpenAIBackendConfig, VLLMBackendConfig

__all__ = ["OpenAIWire", "client_usage"]

_JSON = "application/json"
R = TypeVar("R", bound=OpenAIStreamRelay)


def client_usage(call: Call[Any]) -> tuple[bool, bool]:
    """(a usage chunk, usage in every chunk): what the client asked for, whatever the gateway asked upstream.

    Per-chunk usage needs ``include_usage`` too, as on vLLM itself.
    """
    options = call.request.stream_options
    wants_usage = bool(options and options.include_usage)
    return wants_usage, wants_usage and bool(options and options.continuous_usage_stats)


class OpenAIWire:
    """One backend entry's connection to an OpenAI-compatible server (see the module docstring).

    The transport is the caller's when it passes one (a pool shares one between its servers);
    :meth:`close` closes it either way, as the adapters always did.
    """

    __slots__ = (
        "_get_headers",
        "_headers",
        "backend",
        "base_url",
        "chat_url",
        "completions_url",
        "embeddings_url",
        "max_event",
        "rerank_url",
        "responses_url",
        "stream_usage",
        "transport",
    )

    def __init__(self, config: OpenAIBackendConfig | VLLMBackendConfig, transport: HTTPTransport | None) -> None:
        self.backend = config.name
        self.base_url = str(config.base_url).rstrip("/")
        self.completions_url = self.base_url + "/completions"
        self.chat_url = self.base_url + "/chat/completions"
        self.embeddings_url = self.base_url + "/embeddings"
        self.rerank_url = self.base_url + "/rerank"
        self.responses_url = self.base_url + "/responses"
        self.transport = transport if transport is not None else make_transport(config)
        headers = {name: value.get_secret_value() for name, value in config.headers.items()}
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self._get_headers = dict(headers)  # GETs (health, vLLM's /version) send no body
        headers["Content-Type"] = _JSON
        self._headers = headers
        self.stream_usage = config.stream_usage  # ask a stream's usage upstream for the gateway's metrics
        self.max_event = config.limits.max_event_bytes

    def __repr__(self) -> str:  # the headers hold the key: never in a repr
        return f"<OpenAIWire {self.backend!r} {self.base_url}>"

    # --- request ----------------------------------------------------------------------
    def completion_fields(self, call: UpstreamCall, table: Capabilities) -> dict[str, Any]:
        """The completions body as the client sent it (set fields, no nulls), ``model`` the route's."""
        fields = call.request.upstream_fields()
        # Only neutral values of unsupported fields can get here (the capability check ran).
        table.strip_unsupported(fields)
        fields["model"] = call.upstream_model
        if fields.get("stream") and self.stream_usage:
            ask_stream_usage(fields)
        return fields

    async def post(
        self, url: str, fields: dict[str, Any], call: Call[Any], status_error: StatusError, *, stream: bool
    ) -> UpstreamResponse:
        """POST one body; the 200 response (the caller releases it); another status raises ``status_error``'s error.

        The headers: the entry's plus the attempt's own (request id, trace context: ``Call.headers``).
        """
        resp = await self.transport.send(
            "POST", url, body=orjson.dumps(fields), headers=call.headers(self._headers), stream=stream
        )
        if resp.status != 200:
            await refuse_status(resp, status_error, url)
        return resp

    async def post_read(self, url: str, fields: dict[str, Any], call: Call[Any], status_error: StatusError) -> bytes:
        """POST one body and read the whole answer (non-streamed calls); another status than 200 raises."""
        resp = await self.transport.send(
            "POST", url, body=orjson.dumps(fields), headers=call.headers(self._headers), stream=False
        )
        if resp.status != 200:
            await refuse_status(resp, status_error, url)
        try:
            return await resp.read()
        finally:
            resp.release()

    async def get(self, url: str) -> UpstreamResponse:
        """GET ``url`` with the entry's headers, whatever the status (the caller reads and releases it)."""
        return await self.transport.send("GET", url, body=None, headers=self._get_headers, stream=False)

    # --- answer -----------------------------------------------------------------------
    def relay(self, relay: type[R], resp: UpstreamResponse, call: Call[Any]) -> R:
        """The stream relay of one upstream response, keeping the usage the client asked for (the
        bridge's chat call: the usage chunk, whose details it reads; :class:`~backends.base.BridgeChatCall`)."""
        wants_usage, wants_continuous = client_usage(call) if call.for_client else (True, False)
        return relay(
            resp,
            call,
            self.backend,
            client_wants_usage=wants_usage,
            client_wants_continuous_usage=wants_continuous,
            max_event=self.max_event,
        )

    # --- lifecycle --------------------------------------------------------------------
    async def healthy(self, url: str) -> bool:
        return await get_ok(self.transport, url, self._get_headers) is not None

    async def close(self) -> None:
        await self.transport.close()
