"""The chat bridge's lifecycle events as byte templates, and its last Response from bytes.

Each template is the bytes the event's dict serialises to (``tests/backends/responses/
test_bridge_lifecycle_bytes.py`` holds them to it): ``%`` templates formatted inline by
:class:`~backends.responses.events.ChatResponseEvents`, so an event costs no call of its own.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.responses.echo import FIXED

__all__ = [
    "ARGUMENTS_DONE",
    "DELTA",
    "DETAILS",
    "ENDS",
    "INCOMPLETE",
    "INPUT_DONE",
    "ITEM_DONE",
    "LAST_EVENT",
    "LAST_RESPONSE",
    "NO_DETAILS",
    "NO_LOGPROBS",
    "OPEN_REASONING",
    "OPEN_TEXT",
    "OPEN_TEXT_DELTA",
    "REASONING_DONE",
    "REASONING_ITEM",
    "START",
    "SUMMARY",
    "SUMMARY_ADDED",
    "SUMMARY_DONE",
    "TEXT_DONE",
    "TEXT_END",
    "TEXT_HEAD",
    "TEXT_MESSAGE",
    "WHERE_DELTA",
    "delta_template",
    "detailed",
    "final_bytes",
    "output_at",
]

# A chat finish_reason that leaves the Response incomplete, and the reason it gives.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_TEXT_DELTA = b"response.output_text.delta"
TEXT_HEAD = b"event: " + _TEXT_DELTA + b'\ndata: {"type":"' + _TEXT_DELTA + b'","sequence_number":'
_ESCAPED_TEXT_HEAD = TEXT_HEAD.replace(b"%", b"%%")
NO_LOGPROBS = b',"logprobs":[]}\n\n'
# A Response's incomplete_details, null and with each reason (the first such key of its echo is its own:
# only ours come before it).
NO_DETAILS = b'"incomplete_details":null'
DETAILS = {reason: b'"incomplete_details":{"reason":"%b"}' % reason.encode() for reason in INCOMPLETE.values()}
WHERE_DELTA = len(b'"delta":')
# A delta event (its type twice, sequence number, its fixed fields ending in "delta":, the delta's JSON
# string, what follows it): one format, no intermediate bytes.
DELTA = b'event: %b\ndata: {"type":"%b","sequence_number":%d%b%b%b\n\n'
# response.created and response.in_progress (each: its sequence number, the Response's bytes up to its
# status's value and its echo's members: ResponseFrame.around_status), as their dicts serialise.
START = (
    b'event: response.created\ndata: {"type":"response.created","sequence_number":%d,"response":%bin_progress",'
    b'%b,"output":[],"usage":null}}\n\nevent: response.in_progress\ndata: {"type":"response.in_progress",'
    b'"sequence_number":%d,"response":%bin_progress",%b,"output":[],"usage":null}}\n\n'
)
# A message item opened with an empty output_text part (its sequence number, output index, id; the
# part's sequence number, the item's id and output index), as the two events' dicts serialise.
OPEN_TEXT = (
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added","sequence_number":%d,'
    b'"output_index":%d,"item":{"id":"%b","type":"message","role":"assistant","status":"in_progress","content":[]}}'
    b'\n\nevent: response.content_part.added\ndata: {"type":"response.content_part.added","sequence_number":%d,'
    b'"item_id":"%b","output_index":%d,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}\n\n'
)
# The text deltas' template (delta_template's) of the part OPEN_TEXT opened (the item's id, output index).
OPEN_TEXT_DELTA = (
    _ESCAPED_TEXT_HEAD + b'%%d,"item_id":"%b","output_index":%d,"content_index":0,"delta":%%b' + NO_LOGPROBS
)
# An output_text part's closing events (sequence number, its deltas' fixed fields less "delta":, its
# text's JSON; the same for content_part.done).
TEXT_DONE = (
    b'event: response.output_text.done\ndata: {"type":"response.output_text.done","sequence_number":%d'
    b'%b"text":%b,"logprobs":[]}\n\nevent: response.content_part.done\ndata: {"type":'
    b'"response.content_part.done","sequence_number":%d%b"part":{"type":"output_text","text":%b,'
    b'"annotations":[]}}\n\n'
)
# A reasoning item opened (sequence number, output index, its id); with a summary, the summary's part
# opened (sequence number, its id, output index), as their dicts serialise.
OPEN_REASONING = (
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added","sequence_number":%d,'
    b'"output_index":%d,"item":{"id":"%b","type":"reasoning","summary":[],"content":[],"status":"in_progress"}}\n\n'
)
SUMMARY_ADDED = (
    b'event: response.reasoning_summary_part.added\ndata: {"type":"response.reasoning_summary_part.added",'
    b'"sequence_number":%d,"item_id":"%b","output_index":%d,"summary_index":0,"part":{"type":"summary_text",'
    b'"text":""}}\n\n'
)
# A reasoning item's closing event (sequence number, its id, output index, its text's JSON); with a
# summary, the summary's two (the same, twice); the closed item (its id, its summary: [] or SUMMARY
# around the text's JSON, the text's JSON, its status).
REASONING_DONE = (
    b'event: response.reasoning_text.done\ndata: {"type":"response.reasoning_text.done","sequence_number":%d,'
    b'"item_id":"%b","output_index":%d,"content_index":0,"text":%b}\n\n'
)
SUMMARY_DONE = (
    b'event: response.reasoning_summary_text.done\ndata: {"type":"response.reasoning_summary_text.done",'
    b'"sequence_number":%d,"item_id":"%b","output_index":%d,"summary_index":0,"text":%b}\n\n'
    b'event: response.reasoning_summary_part.done\ndata: {"type":"response.reasoning_summary_part.done",'
    b'"sequence_number":%d,"item_id":"%b","output_index":%d,"summary_index":0,"part":{"type":"summary_text",'
    b'"text":%b}}\n\n'
)
SUMMARY = b'[{"type":"summary_text","text":%b}]'
REASONING_ITEM = (
    b'{"id":"%b","type":"reasoning","summary":%b,"content":[{"type":"reasoning_text","text":%b}],"status":"%b"}'
)
# A call's closing event (sequence number, its id, output index, its arguments' JSON, its name's JSON;
# a custom tool call's: its input's JSON).
ARGUMENTS_DONE = (
    b'event: response.function_call_arguments.done\ndata: {"type":"response.function_call_arguments.done",'
    b'"sequence_number":%d,"item_id":"%b","output_index":%d,"arguments":%b,"name":%b}\n\n'
)
INPUT_DONE = (
    b'event: response.custom_tool_call_input.done\ndata: {"type":"response.custom_tool_call_input.done",'
    b'"sequence_number":%d,"item_id":"%b","output_index":%d,"input":%b}\n\n'
)
# response.output_item.done (sequence number, output index, the item's JSON).
ITEM_DONE = (
    b'event: response.output_item.done\ndata: {"type":"response.output_item.done","sequence_number":%d,'
    b'"output_index":%d,"item":%b}\n\n'
)
# response.completed or response.incomplete (the type twice, sequence number, the Response's JSON).
LAST_EVENT = b'event: %b\ndata: {"type":"%b","sequence_number":%d,"response":%b}\n\n'
# The last Response from the first one's bytes (ResponseFrame.around_status: up to its status's value, then
# its echo's members; the echo with incomplete_details set where it is incomplete), its status, its output
# items' JSON (comma-joined) and its usage's.
LAST_RESPONSE = b'%b%b",%b,"output":[%b],"usage":%b}'
# A message holding one output_text part, closed (its id, status, text's JSON), as its dict serialises.
TEXT_MESSAGE = (
    b'{"id":"%b","type":"message","role":"assistant","status":"%b","content":[{"type":"output_text","text":%b,'
    b'"annotations":[]}]}'
)
# The common end of a stream: its open text part's closing events (TEXT_DONE), its message's (ITEM_DONE),
# and the last event (LAST_EVENT, its Response LAST_RESPONSE's bytes: the store's record is cut from them).
TEXT_END = TEXT_DONE + ITEM_DONE + LAST_EVENT
# TEXT_END with the last event's type written in, by the Response's incomplete reason (None: completed),
# and that status: two %-arguments fewer per stream, made once.
ENDS: dict[str | None, tuple[bytes, bytes]] = {
    reason: (
        status,
        TEXT_DONE + ITEM_DONE + LAST_EVENT.replace(b"%b", b"response." + status, 2),
    )
    for reason, status in ((None, b"completed"), *((reason, b"incomplete") for reason in INCOMPLETE.values()))
}
# An echo made by ResponseFrame.around_status starts with its fixed members, incomplete_details null among
# them: set by a slice there (no search through the echo), and by each reason's bytes.
_NULL_ECHO = FIXED + b"null"
_DETAILED_ECHO = {reason: FIXED + details[len(b'"incomplete_details":') :] for reason, details in DETAILS.items()}


def detailed(echo: bytes, reason: str) -> bytes:
    """``echo`` (ResponseFrame.around_status's) with its ``incomplete_details`` set to ``reason`` (an
    :data:`INCOMPLETE` value): the first such key of the echo is the Response's own."""
    if echo.startswith(_NULL_ECHO):  # (the usual: nothing can come before it that holds that key)
        return _DETAILED_ECHO[reason] + echo[len(_NULL_ECHO) :]
    return echo.replace(NO_DETAILS, DETAILS[reason], 1)


def delta_template(head: bytes, where: bytes) -> bytes:
    """A text delta event as a ``%`` template of its sequence number and its JSON string (a run)."""
    escaped = _ESCAPED_TEXT_HEAD if head is TEXT_HEAD else head.replace(b"%", b"%%")
    return escaped + b"%d" + (where.replace(b"%", b"%%") if b"%" in where else where) + b"%b" + NO_LOGPROBS


def final_bytes(
    frame: tuple[bytes, bytes] | None, item_bytes: list[bytes], items: int, usage: dict[str, Any] | None,
    incomplete: str | None,
) -> tuple[bytes, int] | None:  # fmt: skip
    """The final Response's bytes from the first one's (``frame``) and the ``items`` closed items' (what
    ``orjson.dumps`` of the whole gives, without serialising the echoed request and the texts again), and
    where its ``,"output":`` starts (:func:`output_at`); None: the general way."""
    if frame is None or len(item_bytes) != items:
        return None
    try:
        counts = orjson.dumps(usage)
    except orjson.JSONEncodeError:  # (a count beyond 64 bits)
        return None
    head, echo = frame
    if incomplete is None:
        return LAST_RESPONSE % (head, b"completed", echo, b",".join(item_bytes), counts), output_at(head, 9, echo)
    echo = detailed(echo, incomplete)
    return LAST_RESPONSE % (head, b"incomplete", echo, b",".join(item_bytes), counts), output_at(head, 10, echo)


def output_at(head: bytes, status: int, echo: bytes) -> int:
    """Where ``,"output":`` starts in :data:`LAST_RESPONSE`'s bytes from ``head``, a status ``status``
    bytes long and ``echo`` (the store cuts the record there: ``final_output_at``)."""
    return len(head) + status + 2 + len(echo)
