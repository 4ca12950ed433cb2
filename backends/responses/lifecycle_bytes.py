"""The chat bridge's lifecycle events as byte templates, and its last Response from bytes.

Each template is the bytes the event's dict serialises to (``tests/backends/responses/
test_bridge_lifecycle_bytes.py`` holds them to it): ``%`` templates formatted inline by
:class:`~backends.responses.events.ChatResponseEvents`, so an event costs no call of its own.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = [
    "INCOMPLETE",
    "ITEM_DONE",
    "LAST_EVENT",
    "NO_LOGPROBS",
    "NO_OUTPUT",
    "OPEN_TEXT",
    "STATUS",
    "TEXT_DONE",
    "TEXT_HEAD",
    "WHERE_DELTA",
    "delta_template",
    "final_bytes",
]

# A chat finish_reason that leaves the Response incomplete, and the reason it gives.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_TEXT_DELTA = b"response.output_text.delta"
TEXT_HEAD = b"event: " + _TEXT_DELTA + b'\ndata: {"type":"' + _TEXT_DELTA + b'","sequence_number":'
NO_LOGPROBS = b',"logprobs":[]}\n\n'
STATUS = b'"status":"in_progress"'
NO_OUTPUT = b',"output":[],"usage":null}'
_NO_DETAILS = b'"incomplete_details":null'
_DETAILS = {reason: b'"incomplete_details":{"reason":"%b"}' % reason.encode() for reason in INCOMPLETE.values()}
WHERE_DELTA = len(b'"delta":')
# A message item opened with an empty output_text part (its sequence number, output index, id; the
# part's sequence number, the item's id and output index), as the two events' dicts serialise.
OPEN_TEXT = (
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added","sequence_number":%d,'
    b'"output_index":%d,"item":{"id":"%b","type":"message","role":"assistant","status":"in_progress","content":[]}}'
    b'\n\nevent: response.content_part.added\ndata: {"type":"response.content_part.added","sequence_number":%d,'
    b'"item_id":"%b","output_index":%d,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}\n\n'
)
# An output_text part's closing events (sequence number, its deltas' fixed fields less "delta":, its
# text's JSON; the same for content_part.done).
TEXT_DONE = (
    b'event: response.output_text.done\ndata: {"type":"response.output_text.done","sequence_number":%d'
    b'%b"text":%b,"logprobs":[]}\n\nevent: response.content_part.done\ndata: {"type":'
    b'"response.content_part.done","sequence_number":%d%b"part":{"type":"output_text","text":%b,'
    b'"annotations":[]}}\n\n'
)
# response.output_item.done (sequence number, output index, the item's JSON).
ITEM_DONE = (
    b'event: response.output_item.done\ndata: {"type":"response.output_item.done","sequence_number":%d,'
    b'"output_index":%d,"item":%b}\n\n'
)
# response.completed or response.incomplete (the type twice, sequence number, the Response's JSON).
LAST_EVENT = b'event: %b\ndata: {"type":"%b","sequence_number":%d,"response":%b}\n\n'


def delta_template(head: bytes, where: bytes) -> bytes:
    """A text delta event as a ``%`` template of its sequence number and its JSON string (a run)."""
    return head.replace(b"%", b"%%") + b"%d" + where.replace(b"%", b"%%") + b"%b" + NO_LOGPROBS


def final_bytes(
    frame: tuple[bytes, bytes] | None, item_bytes: list[bytes], items: int, usage: dict[str, Any] | None,
    incomplete: str | None,
) -> bytes | None:  # fmt: skip
    """The final Response's bytes from the first one's (``frame``: its bytes around its status and
    output) and the ``items`` closed items' (what ``orjson.dumps`` of the whole gives, without
    serialising the echoed request and the texts again); None: the general way."""
    if frame is None or len(item_bytes) != items:
        return None
    try:
        counts = orjson.dumps(usage)
    except orjson.JSONEncodeError:  # (a count beyond 64 bits)
        return None
    head, echo = frame
    if incomplete is not None:  # the first such key is the Response's own (only ours come before it)
        echo = echo.replace(_NO_DETAILS, _DETAILS[incomplete], 1)
    status_bytes = b"completed" if incomplete is None else b"incomplete"
    return b'%b%b"%b,"output":[%b],"usage":%b}' % (head, status_bytes, echo, b",".join(item_bytes), counts)
