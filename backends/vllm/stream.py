"""vLLM's SSE stream relayed to the client: the OpenAI relay plus a ``finish_reason`` check.

vLLM may end a choice with ``finish_reason`` ``abort``, ``error`` (0.12+, 0.33)
or ``repetition`` (0.33), outside OpenAI's enum. ``stop``/``length`` final
chunks and ``null`` ones pass untouched on the relay's byte path; a read that
contains another value is parsed: ``repetition`` (and unknown values) become
``stop``, ``abort``/``error`` end the stream with an error event, never with an
invented ``finish_reason`` (see :func:`backends.vllm.dialect.map_finish_reason`).

Deliberately *not* stripped from streams: vLLM's extra per-choice fields
(``stop_reason``, ``token_ids``, ``prompt_token_ids``, all ``null`` unless
asked). Removing them would cost a parse of every event, which the relay exists
to avoid; OpenAI clients ignore unknown fields. Non-streamed answers are
rebuilt in OpenAI's shape instead (:func:`backends.vllm.dialect.normalise_body`).

Cost on the byte path: one extra ``bytes.find`` per network read.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.openai.relay import OpenAIStreamRelay
from backends.vllm.dialect import UpstreamGenerationError, map_finish_reason

__all__ = ["VLLMStreamRelay", "has_foreign_finish_reason"]

_FINISH = b'"finish_reason":"'
_OPENAI_VALUES = (b'stop"', b'length"', b'content_filter"')


def has_foreign_finish_reason(block: bytes) -> bool:
    """Whether a block of compact JSON events carries a ``finish_reason`` outside OpenAI's enum.

    As in the relay, ``"finish_reason":"`` can only be JSON structure: quotes inside
    strings are escaped.
    """
    at = block.find(_FINISH)
    while at >= 0:
        value = at + len(_FINISH)
        if not any(block.startswith(known, value) for known in _OPENAI_VALUES):
            return True
        at = block.find(_FINISH, value)
    return False


class VLLMStreamRelay(OpenAIStreamRelay):
    """:class:`OpenAIStreamRelay` for vLLM: maps foreign ``finish_reason`` values (see module doc)."""

    def _process(self, block: bytes) -> bytes:
        out = super()._process(block)
        if _FINISH in out and has_foreign_finish_reason(out):
            out = self._map_finish(out)
        return out

    def _map_finish(self, block: bytes) -> bytes:
        kept: list[bytes] = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            if not has_foreign_finish_reason(event):
                kept.append(event + b"\n\n")
                continue
            obj: Any = orjson.loads(event.removeprefix(b"data:").lstrip(b" "))
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
