"""The OpenAI-family chat translator: a validated chat request -> the upstream's body, its answers -> the client's.

Used by the ``openai`` backend and, underneath the vLLM dialect (``backends.vllm.chat``),
by ``vllm``. The request is forwarded as the client sent it (fields it set, nulls dropped),
which the capability check made sure the upstream honours:

- ``model`` is the route's upstream id;
- the output limit goes under the name the upstream reads (``max_tokens_field``: the
  backend key ``chat_max_tokens_field``), whichever name the client used (never both:
  the schema refuses that);
- a stream asks for usage (``stream_options.include_usage: true``) for the gateway's
  metrics; the relay drops that usage chunk again unless the client asked for it.

Answers keep OpenAI's shape: a non-streamed body is renamed to the client's model name;
a stream goes through the byte-level relay (:class:`ChatStreamRelay`), which also adds
``"usage": null`` to ordinary chunks for a client that asked for ``include_usage`` where
an OpenAI-compatible upstream leaves the key out (OpenAI itself sends it).
"""

from __future__ import annotations

from typing import Any, Literal

from backends.base import ChatCall, CompletionResult
from backends.chat_capabilities import ChatCapabilities
from backends.openai.body import relay_completion_body
from backends.openai.relay import OpenAIStreamRelay, with_usage_null
from schemas.chat import ChatCompletionRequest
from schemas.errors import UnsupportedParameterError

__all__ = [
    "ChatStreamRelay",
    "MaxTokensField",
    "ask_stream_usage",
    "chat_payload",
    "chat_refusal",
    "relay_chat_body",
]

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]
_LIMIT_NAMES: tuple[MaxTokensField, MaxTokensField] = ("max_completion_tokens", "max_tokens")


def ask_stream_usage(fields: dict[str, Any]) -> None:
    """Ask a streaming upstream for its usage chunk (in place), for the gateway's own metrics.

    One final chunk, never per-chunk usage: ``continuous_usage_stats`` is dropped unless the
    client asked for usage itself (vLLM ignores it without ``include_usage``).
    """
    options = fields.get("stream_options") or {}
    if not options.get("include_usage"):
        options = {k: v for k, v in options.items() if k != "continuous_usage_stats"}
        fields["stream_options"] = {**options, "include_usage": True}


def chat_payload(
    call: ChatCall, table: ChatCapabilities, *, max_tokens_field: MaxTokensField | None, stream_usage: bool
) -> dict[str, Any]:
    """The upstream JSON body for a chat call (before serialisation).

    ``max_tokens_field`` None keeps the client's name for the output limit (vLLM reads both,
    and its errors then name the field the client sent).
    """
    fields = call.request.upstream_fields()
    # Only neutral values of unsupported fields can get here (the capability check ran).
    table.fields.strip_unsupported(fields)
    fields["model"] = call.upstream_model
    if max_tokens_field is not None:
        other = _LIMIT_NAMES[1] if max_tokens_field == _LIMIT_NAMES[0] else _LIMIT_NAMES[0]
        if other in fields:
            fields[max_tokens_field] = fields.pop(other)
    if stream_usage and fields.get("stream"):
        ask_stream_usage(fields)
    return fields


def chat_refusal(
    table: ChatCapabilities | None, request: ChatCompletionRequest, backend: str, kind: str
) -> UnsupportedParameterError | None:
    """The 400 naming the first thing ``table`` cannot honour (None: the backend can serve it).

    The router checks before routing; adapters whose table can change (vLLM's follows the
    server's version) check again at send time with this. Built by the one refusal
    constructor (:meth:`ChatCapabilities.refusal`).
    """
    if table is None:
        return UnsupportedParameterError(
            f"backend '{backend}' (type {kind}) serves no chat endpoint", param="model", backend=backend
        )
    return table.refusal(request, backend, kind)


def relay_chat_body(data: bytes, call: ChatCall, backend: str) -> CompletionResult:
    """An upstream ``chat.completion`` body as sent, the model name swapped (:func:`relay_completion_body`)."""
    return relay_completion_body(data, call, backend, "chat.completion")


class ChatStreamRelay(OpenAIStreamRelay):
    """The relay for an OpenAI-compatible chat stream; ``"usage": null`` on ordinary chunks for a client
    that asked for ``include_usage`` (no parse: one count per read when the upstream sent the key)."""

    def _process(self, block: bytes) -> bytes:
        out = super()._process(block)
        if self._usage_null and out:
            out = with_usage_null(out)
        return out
