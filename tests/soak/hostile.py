"""The hostile parts of the fault run (``tests.soak.fault_run``): what the upstream does, what clients send.

Upstream: :func:`upstream_chooser` gives ``FakeUpstream.default`` a behaviour per request, picked by
the request's prompt (``wild:<mode>``), so a worker decides what its request meets. Every mode is
something issue 13 saw go wrong: gzip bombs, endless bodies and events, a double ``[DONE]``,
``retry:``/``event:``/``id:`` lines, a request read and then dropped unanswered, error bodies
echoing the upstream key (one straddling the 500-character cut), integers past 2^64, garbage.
A chat request picks its mode by its last message's content (``wild:<mode>``) and meets the same
modes in OpenAI's chat shapes, plus the chat-only ones of :data:`CHAT_MODES` (an error event
mid-stream, a malformed chunk, ``choices`` of the wrong type, and tool-call streams: one call's
arguments streamed forever while the call before never closes, 100,000 call indexes, negative
and huge indexes, a call without an ``id``).

Clients: :func:`probes` are raw-socket requests a client can send at will (the gateway's key
followed by NUL, CR or VT; bad and unknown ``Content-Encoding``; integers of 2^64; a body
trickled in slowly; a stream left midway) with the statuses each may get. Each opens its own
connection, so none of them shares a connection with the load whose answers are counted.
"""

from __future__ import annotations

import asyncio
import functools
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from tests.fakes import Behaviour

__all__ = ["CHAT_MODES", "MODES", "Probe", "chat_probes", "gzip_bomb", "probes", "send_probe", "upstream_chooser"]

BIG = 2**70  # far past int64 and uint64


@functools.cache
def gzip_bomb(inflated_mb: int) -> bytes:
    """A gzip body of zeros that inflates to ``inflated_mb`` MiB (about 1/1000 of that on the wire).

    Made once per size and process: compressing 200 MiB takes about a second, and the hostile
    chat tests ask for it once per case (the bytes are immutable, so every caller may share them)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip container
    zeros = bytes(1 << 20)
    parts = [comp.compress(zeros) for _ in range(inflated_mb)]
    return b"".join(parts) + comp.flush()


def _chunk_of(text: str, finish: str | None = None, *, chat: bool = False, **extra: Any) -> bytes:
    if chat:
        obj = {"id": "chatcmpl-wild", "object": "chat.completion.chunk", "created": 1, "model": "up-wild",
               "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}],
               **extra}  # fmt: skip
    else:
        obj = {"id": "cmpl-wild", "object": "text_completion", "created": 1, "model": "up-wild",
               "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], **extra}  # fmt: skip
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _calls(*fragments: dict[str, Any], finish: str | None = None) -> bytes:
    """One chat chunk carrying tool-call fragments."""
    choice = {"index": 0, "delta": {"tool_calls": list(fragments)}, "logprobs": None, "finish_reason": finish}
    obj = {"id": "chatcmpl-wild", "object": "chat.completion.chunk", "created": 1, "model": "up-wild",
           "choices": [choice]}  # fmt: skip
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _call(index: int, arguments: str, *, name: str | None = None, id: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    fragment: dict[str, Any] = {"index": index, "type": "function", "function": function}
    if id is not None:
        fragment["id"] = id
    return fragment


def _chat_modes() -> dict[str, Callable[[], Behaviour]]:
    """The chat-only modes: OpenAI chat chunks an upstream should not send."""
    done = b"data: [DONE]\n\n"
    opened = _calls(_call(0, '{"a": ', name="f", id="call_0"), _call(1, "", name="g", id="call_1"))
    return {
        "error_event": lambda: Behaviour(
            kind="raw",
            body=_chunk_of(" one", chat=True) + b'data: {"error": {"message": "engine died", "code": 500}}\n\n' + done,
        ),
        "malformed_chunk": lambda: Behaviour(
            kind="raw", body=_chunk_of(" one", chat=True) + b"data: {not json\n\n" + done
        ),
        "choices_wrong_type": lambda: Behaviour(
            kind="raw",
            body=b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":{"0":"no"}}\n\n' + done,
        ),
        # call 0 never closes while call 1's arguments keep coming: what is held must stay bounded
        "tool_flood": lambda: Behaviour(kind="endless", body=opened + _calls(_call(1, "x" * 60_000)) * 4),
        "tool_indexes": lambda: Behaviour(
            kind="raw",
            body=opened + b"".join(_calls(_call(i, "{}", name="h", id=f"c{i}")) for i in range(2, 100_002)) + done,
            events=1 << 20,
        ),
        "tool_index_neg": lambda: Behaviour(
            kind="raw",
            body=_calls(_call(-1, "{}", name="f", id="c"))
            + _calls(_call(0, "{}", name="g", id="d"), finish="tool_calls")
            + done,
        ),
        "tool_index_huge": lambda: Behaviour(
            kind="raw",
            body=b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":'
            b'[{"index":0,"delta":{"tool_calls":[{"index":%d,"id":"c","type":"function","function":{"name":"f",'
            b'"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}\n\n' % BIG + done,
        ),
        "tool_no_id": lambda: Behaviour(
            kind="raw",
            body=_calls(_call(0, '{"a": 1}', name="f")) + _calls(_call(1, "{}", name="g"), finish="tool_calls") + done,
        ),
    }


CHAT_MODES = ("error_event", "malformed_chunk", "choices_wrong_type", "tool_flood", "tool_indexes",
              "tool_index_neg", "tool_index_huge", "tool_no_id")  # fmt: skip


def _wild(body: dict[str, Any]) -> tuple[str | None, bool]:
    """The mode a request asks for (its prompt, or its last message's content) and whether it is chat."""
    messages = body.get("messages")
    if isinstance(messages, list):
        last = messages[-1] if messages else None
        text = last.get("content") if isinstance(last, dict) else None
        chat = True
    else:
        text, chat = body.get("prompt"), False
    if isinstance(text, str) and text.startswith("wild:"):
        return text[5:], chat
    return None, chat


def upstream_chooser(upstream_key: str, bomb: bytes) -> Callable[[dict[str, Any]], Behaviour]:
    """``FakeUpstream.default`` for the run: a ``wild:<mode>`` prompt picks the mode, anything else is served."""
    key = upstream_key.encode()
    # orjson refuses integers past 64 bits, so these bodies are written by hand.
    huge = (
        b'{"id":"cmpl-wild","object":"text_completion","created":%d,"model":"up-wild","choices":[{"index":0,'
        b'"text":" big","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":%d,'
        b'"completion_tokens":%d,"total_tokens":%d}}' % (BIG, BIG, BIG, BIG)
    )
    huge_chat = (
        b'{"id":"chatcmpl-wild","object":"chat.completion","created":%d,"model":"up-wild","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":" big"},"logprobs":null,"finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}' % (BIG, BIG, BIG, BIG)
    )
    chat_modes = _chat_modes()

    def modes_for(chat: bool) -> dict[str, Callable[[], Behaviour]]:
        def _chunk(text: str, finish: str | None = None) -> bytes:
            return _chunk_of(text, finish, chat=chat)

        huge_body = huge_chat if chat else huge
        huge_stream = (
            b'data: {"id":"x","object":"chat.completion.chunk","created":%d,"model":"m","choices":[{"index":%d,'
            b'"delta":{"content":" n"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,'
            b'"completion_tokens":1,"total_tokens":%d}}\n\ndata: [DONE]\n\n' % (BIG, BIG, BIG, BIG)
            if chat
            else b'data: {"id":"x","object":"text_completion","created":%d,"model":"m","choices":[{"index":%d,'
            b'"text":" n","logprobs":null,"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n' % (BIG, BIG)
        )
        return {
            "gzip_bomb": lambda: Behaviour(kind="status", status=200, body=bomb, headers={"Content-Encoding": "gzip"}),
            "gzip_bomb_stream": lambda: Behaviour(kind="raw", body=bomb, headers={"Content-Encoding": "gzip"}),
            "endless_body": lambda: Behaviour(kind="endless", body=b'{"id": "x", ' * 4096),
            "endless_event": lambda: Behaviour(kind="endless", body=b"data: " + b"a" * 16384),
            "endless_events": lambda: Behaviour(kind="endless", body=_chunk(" again") * 64),
            "double_done": lambda: Behaviour(
                kind="raw", body=_chunk(" one", "stop") + b"data: [DONE]\n\ndata: [DONE]\n\n"
            ),
            "sse_fields": lambda: Behaviour(
                kind="raw",
                body=(
                    b'retry: 1\n\nevent: ping\ndata: {"x": 1}\n\n: a comment\n\nid: 7\n'
                    + _chunk(" one")
                    + b"just a bare line\n\n"
                    + _chunk(" two", "stop")
                    + b"data: [DONE]\n\n"
                ),
                events=7,
            ),
            "read_then_close": lambda: Behaviour(kind="reset"),
            "key_in_text_4xx": lambda: Behaviour(
                kind="status", status=401, body=b"x" * 490 + b" bad key " + key + b"!"
            ),
            "key_in_json_4xx": lambda: Behaviour(
                kind="status", status=400, body={"error": {"message": f"key {upstream_key} refused", "param": "prompt"}}
            ),
            "key_in_5xx": lambda: Behaviour(kind="status", status=500, body=b"<html>" + key + b"</html>"),
            "huge_ints": lambda: Behaviour(kind="status", status=200, body=huge_body),
            "huge_ints_stream": lambda: Behaviour(kind="raw", body=huge_stream),
            "garbage": lambda: Behaviour(kind="garbage"),
            "stall": lambda: Behaviour(kind="stall", delay=3.0),
            "cut": lambda: Behaviour(kind="cut", events=2),
        }

    modes, chat_shaped = modes_for(False), {**modes_for(True), **chat_modes}

    def choose(body: dict[str, Any]) -> Behaviour:
        mode, chat = _wild(body)
        make = (chat_shaped if chat else modes).get(mode or "")
        return make() if make is not None else Behaviour()

    return choose


MODES = (
    "gzip_bomb", "gzip_bomb_stream", "endless_body", "endless_event", "endless_events", "double_done",
    "sse_fields", "read_then_close", "key_in_text_4xx", "key_in_json_4xx", "key_in_5xx", "huge_ints",
    "huge_ints_stream", "garbage", "stall", "cut",
)  # fmt: skip


# --- hostile clients ------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    name: str
    head: bytes  # the request head, without the final CRLF
    body: bytes = b""
    allowed: frozenset[int] = frozenset({400})
    trickle: float = 0.0  # seconds over which the body is sent, in pieces
    leave_after_first_read: bool = False  # a stream client that walks away


def _post(headers: bytes, body: bytes, *, length: int | None = None, path: bytes = b"/v1/completions") -> bytes:
    size = len(body) if length is None else length
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + headers
        + (b"Content-Length: %d\r\n" % size)
    )


def probes(key: str) -> list[Probe]:
    auth = b"Authorization: Bearer " + key.encode()
    ok = b'{"model": "fine", "prompt": "x", "max_tokens": 4}'
    stream = b'{"model": "fine", "prompt": "x", "max_tokens": 64, "stream": true}'
    huge = [
        b'{"model": "fine", "prompt": "x", "max_tokens": %d}' % 2**64,
        b'{"model": "fine", "prompt": [1, 2, %d]}' % 2**64,
        b'{"model": "fine", "prompt": "x", "top_k": %d}' % 2**64,
        b'{"model": "fine", "prompt": "x", "logit_bias": {"5": %d}}' % 2**64,
        b'{"model": "fine", "prompt": "x", "seed": -%d}' % 2**64,
        b'{"model": "fine", "prompt": "x", "n": 1e400}',
    ]
    close = b"Connection: close\r\n"
    found = [
        Probe("key+NUL", _post(auth + b"\x00\r\n" + close, ok), ok),
        Probe("key+CR", _post(auth + b"\r" + b"\r\n" + close, ok), ok),
        Probe("key+VT", _post(auth + b"\x0b\r\n" + close, ok), ok),
        Probe("key+CR-mid", _post(auth + b"\rX-Smuggled: 1\r\n" + close, ok), ok),
        Probe("api-key+NUL", _post(b"api-key: " + key.encode() + b"\x00\r\n" + close, ok), ok),
        Probe("key-in-long-header", _post(auth + b"a" * 10_000 + b"\r\n" + close, ok), ok, frozenset({400, 431})),
        Probe("gzip-header-plain-body", _post(auth + b"\r\nContent-Encoding: gzip\r\n" + close, ok), ok),
        Probe("unknown-encoding", _post(auth + b"\r\nContent-Encoding: zstd-x\r\n" + close, ok), ok,
              frozenset({400, 415})),
        Probe("wrong-key", _post(b"Authorization: Bearer sk-not-a-key-at-all-000\r\n" + close, ok), ok,
              frozenset({401})),
        Probe("too-big", _post(auth + b"\r\n" + close, b"", length=10**7), b"{" * 70_000, frozenset({413})),
        Probe("slow-body", _post(auth + b"\r\n" + close, ok), ok, frozenset({200}), trickle=0.8),
        Probe("leaves-mid-stream", _post(auth + b"\r\n", stream), stream, frozenset({200}),
              leave_after_first_read=True),
    ]  # fmt: skip
    found += [Probe(f"int-2^64-{i}", _post(auth + b"\r\n" + close, body), body) for i, body in enumerate(huge)]
    found += chat_probes(auth + b"\r\n" + close, auth + b"\r\n")
    return found


def chat_probes(head: bytes, keep_alive: bytes) -> list[Probe]:
    """Chat requests a client can send at will: integers of 2^64 in chat fields and schemas, 10,000-deep
    tool parameters, unknown keys inside messages, a 2 MB content string, a tool-call stream left midway."""
    chat = b"/v1/chat/completions"
    msgs = b'"messages": [{"role": "user", "content": "x"}]'
    tool = b'"tools": [{"type": "function", "function": {"name": "f", "parameters": %s}}]'
    bodies = {
        "chat-int-2^64-max_completion_tokens": b'{"model": "fine", %s, "max_completion_tokens": %d}' % (msgs, 2**64),
        "chat-int-2^64-top_logprobs": b'{"model": "fine", %s, "logprobs": true, "top_logprobs": %d}' % (msgs, 2**64),
        "chat-int-2^64-tool-params": b'{"model": "fine", %s, %s}' % (msgs, tool % (b'{"maximum": %d}' % 2**64)),
        "chat-int-2^64-json_schema": b'{"model": "fine", %s, "response_format": {"type": "json_schema", '
        b'"json_schema": {"name": "s", "schema": {"minimum": -%d}}}}' % (msgs, 2**64),
        "chat-deep-tool-params": b'{"model": "fine", %s, %s}' % (msgs, tool % (b"[" * 10_000 + b"]" * 10_000)),
        "chat-unknown-in-message": b'{"model": "fine", "messages": [{"role": "user", "content": "x", "foo": 1}]}',
    }
    found = [Probe(name, _post(head, body, path=chat), body) for name, body in bodies.items()]
    long = b'{"model": "fine", "messages": [{"role": "user", "content": "%s"}], "max_tokens": 4}' % (b"a" * 60_000)
    stream = b'{"model": "fine", %s, "max_tokens": 64, "stream": true, %s}' % (msgs, tool % b'{"type": "object"}')
    found += [
        Probe("chat-long-content", _post(head, long, path=chat), long, frozenset({200})),
        Probe("chat-leaves-mid-stream", _post(keep_alive, stream, path=chat), stream, frozenset({200}),
              leave_after_first_read=True),
    ]  # fmt: skip
    return found


async def send_probe(port: int, probe: Probe, within: float = 10.0) -> tuple[int | None, bytes]:
    """Send one probe; (status or None when the gateway answered nothing, everything it sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        async with asyncio.timeout(within):
            writer.write(probe.head + b"\r\n")
            if probe.trickle and probe.body:
                step = max(1, len(probe.body) // 8)
                for at in range(0, len(probe.body), step):
                    writer.write(probe.body[at : at + step])
                    await writer.drain()
                    await asyncio.sleep(probe.trickle / 8)
            else:
                writer.write(probe.body)
            await writer.drain()
            if probe.leave_after_first_read:
                received = await reader.read(4096)
                return _status(received), received  # and hang up with the stream running
            while chunk := await reader.read(65536):
                received += chunk
                if _complete(received):
                    break  # a whole answer: do not wait for the gateway to close
    except (ConnectionError, TimeoutError):
        pass
    finally:
        writer.close()
    return _status(received), received


def _status(raw: bytes) -> int | None:
    if not raw.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")):
        return None
    try:
        return int(raw[9:12])
    except ValueError:
        return None


def _complete(raw: bytes) -> bool:
    head, sep, body = raw.partition(b"\r\n\r\n")
    match = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
    return bool(sep) and match is not None and len(body) >= int(match.group(1))
