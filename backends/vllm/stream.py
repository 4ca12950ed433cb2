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

Deliberately *not* stripped from streams: vLLM's extra per-choice fields
(``stop_reason``, ``token_ids``, ``prompt_token_ids``, all ``null`` unless
asked). Removing them would cost a parse of every event, which the relay exists
to avoid; OpenAI clients ignore unknown fields. Non-streamed answers are
rebuilt in OpenAI's shape instead (:func:`backends.vllm.dialect.normalise_body`).

Cost on the byte path: one regex search per network read (plus, with include_usage,
one split of the read).
"""

from __future__ import annotations

import re

import orjson

from backends.errors import UpstreamProtocolError
from backends.openai.relay import OpenAIStreamRelay
from backends.vllm.dialect import UpstreamGenerationError, map_finish_reason

__all__ = ["VLLMStreamRelay", "has_foreign_finish_reason"]

# A string-valued finish_reason outside OpenAI's enum, whatever the JSON spacing. As in the
# relay, '"finish_reason"' followed by a colon can only be JSON structure (quotes inside
# strings are escaped).
_FOREIGN = re.compile(rb'"finish_reason"\s*:\s*"(?!(?:stop|length|content_filter)")')
_USAGE_NULL = b',"usage":null}\n\n'


def has_foreign_finish_reason(block: bytes) -> bool:
    """Whether a block of JSON events carries a ``finish_reason`` outside OpenAI's enum."""
    return _FOREIGN.search(block) is not None


class VLLMStreamRelay(OpenAIStreamRelay):
    """:class:`OpenAIStreamRelay` for vLLM (see the module docstring)."""

    def _process(self, block: bytes) -> bytes:
        out = super()._process(block)
        if _FOREIGN.search(out) is not None:
            out = self._map_finish(out)
        if self._keep_usage_chunk and out:
            out = _with_usage_null(out)
        return out

    def _map_finish(self, block: bytes) -> bytes:
        # The relay's output: whole one-line ``data:`` events, nothing else.
        kept: list[bytes] = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            if _FOREIGN.search(event) is None:
                kept.append(event + b"\n\n")
                continue
            try:
                obj = orjson.loads(event.removeprefix(b"data:").lstrip(b" "))
                if not isinstance(obj, dict):
                    raise ValueError
            except ValueError:  # orjson.JSONDecodeError is a ValueError
                self._pending = UpstreamProtocolError(
                    "the upstream sent a stream event that is not a JSON object",
                    backend=self._backend,
                    reason="stream_garbage",
                )
                self.finished = False
                break
            try:
                for choice in obj.get("choices") or ():
                    finish = choice.get("finish_reason")
                    if finish not in (None, "stop", "length", "content_filter"):
                        choice["finish_reason"] = map_finish_reason(finish, self._backend)
            except UpstreamGenerationError as exc:
                # What came before still reaches the client; the relay raises this next
                # (ending the stream with an error event and [DONE]).
                exc.reason = "stream_error"
                self._pending = exc
                self.finished = False
                break
            kept.append(b"data: " + orjson.dumps(obj) + b"\n\n")
        return b"".join(kept)


def _with_usage_null(block: bytes) -> bytes:
    """``"usage":null`` added to the events of a block that lack a ``usage`` key."""
    events = block.count(b"\n\n")
    if block.count(b'"usage"') >= events:
        return block  # every event has one already (OpenAI, or per-chunk usage)
    out = []
    for event in block.split(b"\n\n"):
        if not event:
            continue
        if b'"usage"' in event or not event.endswith(b"}"):
            out.append(event + b"\n\n")
        else:
            out.append(event[:-1] + _USAGE_NULL)
    return b"".join(out)
