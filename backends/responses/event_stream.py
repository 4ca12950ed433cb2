"""The Responses event stream's contract, shared by the chat bridge's stream and the native relay's.

:class:`ResponseEventStream` can end itself with ``response.failed`` and say where it stands (the
Response the conversation store keeps); :func:`event_bytes` writes one event as OpenAI does;
:func:`failure_of` is a Response's ``error`` object for an error.
"""

from __future__ import annotations

from typing import Any

from backends.base import CompletionStream
from backends.exact_json import dumps_exact
from schemas.errors import GatewayError

__all__ = ["ResponseEventStream", "event_bytes", "failure_of"]


def event_bytes(event: dict[str, Any], backend: str) -> bytes:
    """One SSE event as OpenAI writes it: ``event: <type>`` then the JSON ``data`` line."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + dumps_exact(event, backend, "a stream event") + b"\n\n"


def failure_of(error: GatewayError) -> dict[str, Any]:
    """A Response's ``error`` object for ``error`` (the envelope's code and message)."""
    body = error.envelope()["error"]
    return {"code": body.get("code") or "server_error", "message": body.get("message") or "upstream failure"}


class ResponseEventStream(CompletionStream):
    """A stream of Responses events: it can end itself with ``response.failed``, and say where it stands."""

    # ``orjson.dumps`` of the final Response (``snapshot``'s once finished), where the last event was
    # written from those bytes: the store's record is cut from them (records.encode's ``dumped``).
    final_dumped: bytes | None = None
    # Where ``,"output":`` starts in ``final_dumped`` (0: not said): the store cuts the record there
    # (records.encode's ``output_at``) without dumping the output again to find it.
    final_output_at = 0

    def failed_event(self, error: GatewayError) -> bytes:
        """The last event after a failure midway: ``response.failed`` with ``error``."""
        raise NotImplementedError

    def snapshot(self, status: str) -> dict[str, Any] | None:
        """The Response now (its final form once finished; else with ``status``), for the store."""
        raise NotImplementedError
