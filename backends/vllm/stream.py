"""vLLM's SSE stream relayed to the client: the OpenAI relay plus vLLM's differences.

``finish_reason``: vLLM may end a choice with ``abort``, ``error`` (0.12+, 0.33)
or ``repetition`` (0.33), outside OpenAI's enum. ``stop``/``length`` final
chunks and ``null`` ones pass untouched on the relay's byte path; a read that
contains another value (compact or spaced JSON) is parsed: ``repetition`` (and
unknown values) become ``stop``, ``abort``/``error`` end the stream with an error
event, never with an invented ``finish_reason`` (see
:func:`backends.vllm.dialect.map_finish_reason`).

``usage``: with ``include_usage`` OpenAI sends ``"usage": null`` in every ordinary
chunk; vLLM leaves the key out, so it is added (only for clients that asked for usage).

vLLM's own keys (checked against the 0.32.0 wheel's serving code; chat golden
``tests/fixtures/chat/vllm/0.32.0/stream_vllm_keys.json``) leave the stream when they carry
nothing, so chunks have OpenAI's shape: per choice ``stop_reason``, ``token_ids`` and, in
completions, ``prompt_token_ids``; in chat's first chunk the top-level ``prompt_token_ids``
and ``prompt_text`` (the rendered template: vLLM fills them only for ``return_token_ids`` /
``return_prompt_text``; the chat schema refuses the latter, so no template leaks). Each is cut on
the bytes as ``,"<key>":null`` (a quote inside a JSON string is escaped, so that sequence is
structure only). Kept when they carry something: the ``stop_reason`` of a final chunk (the
stop string or token id that matched) and the token ids a client asked for with
``return_token_ids`` (both endpoints). Non-streamed answers are rebuilt in OpenAI's shape instead
(:func:`backends.vllm.dialect.normalise_body`).

Cost on the byte path: one regex search and four ``in`` scans per network read (plus, with
include_usage, one ``replace``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.openai.relay import OpenAIStreamRelay, with_usage_null
from backends.vllm.dialect import UpstreamGenerationError, map_finish_reason

__all__ = ["VLLMChatStreamRelay", "VLLMStreamRelay", "has_foreign_finish_reason", "rename_reasoning"]

# A string-valued finish_reason outside OpenAI's enum, whatever the JSON spacing. As in the
# relay, '"finish_reason"' followed by a colon can only be JSON structure (quotes inside
# strings are escaped).
_FOREIGN = re.compile(rb'"finish_reason"\s*:\s*"(?!(?:stop|length|content_filter)")')
# Chat adds OpenAI's tool_calls and function_call to the enum.
_CHAT_FOREIGN = re.compile(rb'"finish_reason"\s*:\s*"(?!(?:stop|length|content_filter|tool_calls|function_call)")')
_OPENAI_FINISH = frozenset({None, "stop", "length", "content_filter"})
_NULL_EXTRAS = (b',"token_ids":null', b',"stop_reason":null', b',"prompt_token_ids":null', b',"prompt_text":null')
_CHAT_FINISH = _OPENAI_FINISH | {"tool_calls", "function_call"}


def has_foreign_finish_reason(block: bytes) -> bool:
    """Whether a block of JSON events carries a ``finish_reason`` outside OpenAI's enum."""
    return _FOREIGN.search(block) is not None


class VLLMStreamRelay(OpenAIStreamRelay):
    """:class:`OpenAIStreamRelay` for vLLM (see the module docstring)."""

    foreign: ClassVar[re.Pattern[bytes]] = _FOREIGN
    openai_finish: ClassVar[frozenset[str | None]] = _OPENAI_FINISH
    renames_reasoning: ClassVar[bool] = False  # delta.reasoning -> reasoning_content for a client (chat)

    def _process(self, block: bytes) -> bytes:
        # One method for both endpoints (chat's reasoning rename is a flag, not an override calling
        # this one): one frame per read less, the reads of a token-at-a-time stream being most of them.
        out = OpenAIStreamRelay._process(self, block)
        if self._for_client:  # (the Responses bridge reads past them)
            for extra in _NULL_EXTRAS:  # vLLM's own keys that carry nothing: OpenAI's shape
                if extra in out:
                    out = out.replace(extra, b"")
        if self.foreign.search(out) is not None:
            out = self._map_finish(out)
        if self._usage_null and out:
            out = with_usage_null(out)
        # The Responses bridge reads either name (backends.responses.events): no rename for it.
        if self.renames_reasoning and self._for_client and _REASONING.search(out) is not None:
            out = _rename_reasoning(out, self._backend)
        return out

    def _map_finish(self, block: bytes) -> bytes:
        # The relay's output: whole one-line ``data:`` events, nothing else.
        kept: list[bytes] = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            if self.foreign.search(event) is None:
                kept.append(event + b"\n\n")
                continue
            try:
                obj = loads_keeping_integers(event.removeprefix(b"data:").lstrip(b" "), self._backend)
                if not isinstance(obj, dict):
                    raise ValueError
            except (ValueError, UpstreamProtocolError):  # orjson.JSONDecodeError is a ValueError
                self._pending = UpstreamProtocolError(
                    "the upstream sent a stream event that is not a JSON object",
                    backend=self._backend,
                    reason="stream_garbage",
                )
                self.finished = False
                self.relayed_events -= block.count(b"\n\n") - len(kept)  # this one and the rest are dropped
                break
            try:
                for choice in obj.get("choices") or ():
                    finish = choice.get("finish_reason")
                    if finish not in self.openai_finish:
                        choice["finish_reason"] = map_finish_reason(finish, self._backend)
            except UpstreamGenerationError as exc:
                # What came before still reaches the client; the relay raises this next
                # (ending the stream with an error event and [DONE]).
                exc.reason = "stream_error"
                self._pending = exc
                self.finished = False
                self.relayed_events -= block.count(b"\n\n") - len(kept)
                break
            kept.append(b"data: " + dumps_exact(obj, self._backend, "a stream event") + b"\n\n")
        return b"".join(kept)


class VLLMChatStreamRelay(VLLMStreamRelay):
    """vLLM's ``chat.completion.chunk`` stream: the completions rules, plus chat's finish reasons and
    the reasoning text under one name.

    Reasoning: vLLM named the delta field ``reasoning_content`` (0.7-0.11), sent both
    (0.12-0.15), then only ``reasoning`` (0.16+). Clients get ``reasoning_content``
    (:data:`backends.vllm.chat.REASONING_FIELD`), never both. Only reads that carry a
    ``"reasoning"`` key are parsed (as in the relay, a quoted key followed by ``:`` is
    JSON structure, never generated text); others stay on the byte path.

    Tool-call deltas pass as vLLM sent them: each carries its call's ``index``, so two
    calls streamed with interleaved argument fragments stay apart.
    """

    foreign: ClassVar[re.Pattern[bytes]] = _CHAT_FOREIGN
    openai_finish: ClassVar[frozenset[str | None]] = _CHAT_FINISH
    renames_reasoning: ClassVar[bool] = True


_REASONING = re.compile(rb'"reasoning"\s*:')


def _rename_reasoning(block: bytes, backend: str) -> bytes:
    """``delta.reasoning`` -> ``delta.reasoning_content`` in the events of a block that carry it."""
    out: list[bytes] = []
    for event in block.split(b"\n\n"):
        if not event:
            continue
        if _REASONING.search(event) is None:
            out.append(event + b"\n\n")
            continue
        obj = loads_keeping_integers(event.removeprefix(b"data:").lstrip(b" "), backend)  # the relay wrote it
        for choice in obj.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict):
                rename_reasoning(delta)
        out.append(b"data: " + dumps_exact(obj, backend, "a stream event") + b"\n\n")
    return b"".join(out)


def rename_reasoning(message: dict[str, Any]) -> None:
    """A message or delta's reasoning text under ``reasoning_content`` only (in place)."""
    if "reasoning" not in message:
        return
    text = message.pop("reasoning")
    if message.get("reasoning_content") is None and text is not None:
        message["reasoning_content"] = text
