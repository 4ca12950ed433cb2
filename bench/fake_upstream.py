"""A fast fake OpenAI upstream for proxy benchmarks (loopback only).

Raw asyncio Protocol on uvloop with a hand-written HTTP/1.1 keep-alive parser and
pre-rendered responses, so one request costs a parse, a dict lookup and one write.

  POST /v1/completions  text_completion with usage; ``max_tokens`` tokens (default 16).
                        ``"stream": true``: SSE, one chunk per token, a usage chunk when
                        ``stream_options.include_usage``, then ``data: [DONE]`` (chunked).
  POST /v1/chat/completions  the same in OpenAI's chat shapes (``chat.completion``; stream
                        chunks ``chat.completion.chunk`` with ``role`` in the first delta);
                        the output limit is ``max_completion_tokens`` or ``max_tokens``.
  POST /v1/embeddings   OpenAI's list object: one 1,024-dim float32 vector per input (``--dims``),
                        usage counting words; ``encoding_format: "base64"`` as OpenAI encodes it.
  POST /v1/responses    OpenAI's Responses: a Response (one message item of ``max_output_tokens``
                        tokens), or its events (created, in_progress, item and part added, one
                        ``response.output_text.delta`` per token, the dones, completed; no [DONE]).
  GET  /v1/models       the model list.       GET /health, /version  liveness.
  POST /v1/traces       an OTLP/HTTP receiver that drops what it gets (200, nothing decoded): where a
                        gateway with tracing on exports (bench/run.py's gateway-trace<PCT> targets);
                        not counted in the stats below.
  GET  /stats           {"requests", "connections", "open", "peak_open", "paths"} as JSON:
                        compare requests with connections to prove keep-alive reuse.

  python bench/fake_upstream.py --port 18001 [--token-delay-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ipaddress
import random
import signal
import struct
import sys
import time
from typing import Any

import orjson

CREATED = int(time.time())
MAX_HEAD = 64 * 1024
DIMS = 1024  # embedding size (--dims)
STATS: dict[str, Any] = {"requests": 0, "connections": 0, "open": 0, "peak_open": 0, "paths": {}}
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
SSE_HEAD += b"Transfer-Encoding: chunked\r\n"
TASKS: set[asyncio.Task[None]] = set()  # delayed streams in flight (strong references)
DONE = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _json(status: str, body: bytes, keep_alive: bool) -> bytes:
    close = b"" if keep_alive else b"Connection: close\r\n"
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
    return head % (status.encode(), len(body), close) + body


class Renderer:
    """Renders and caches response bodies per (endpoint, model, tokens, prompt tokens, usage).

    Chat and completions bodies carry the same tokens, so the two endpoints cost the fake
    upstream about the same and a chat/completions ratio measures the proxy, not this server.
    """

    def __init__(self) -> None:
        self.cache: dict[tuple[Any, ...], Any] = {}
        self.responses = 0  # Responses answered: each gets its own id

    @staticmethod
    def _usage(pt: int, k: int) -> dict[str, int]:
        return {"prompt_tokens": pt, "completion_tokens": k, "total_tokens": pt + k}

    @staticmethod
    def _head(chat: bool, model: str, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
        return {"id": "chatcmpl-bench" if chat else "cmpl-bench", "object": kind, "created": CREATED, "model": model}

    def nonstream(self, model: str, k: int, pt: int, chat: bool = False) -> bytes:
        key = ("n", chat, model, k, pt)
        body = self.cache.get(key)
        if body is None:
            text = "".join(f" tok{i}" for i in range(k))
            first: dict[str, Any] = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            choice = first | {"index": 0, "logprobs": None, "finish_reason": "length"}
            body = orjson.dumps(self._head(chat, model, False) | {"choices": [choice], "usage": self._usage(pt, k)})
            if len(self.cache) < 4096:
                self.cache[key] = body
        return body

    @staticmethod
    def _response(model: str, k: int, pt: int, status: str) -> dict[str, Any]:
        text = "".join(f" tok{i}" for i in range(k))
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": "msg_bench", "type": "message", "role": "assistant", "status": status, "content": [part]}
        usage = {
            "input_tokens": pt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": k,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": pt + k,
        }
        done = status != "in_progress"
        return {
            "id": "resp_bench",
            "object": "response",
            "created_at": CREATED,
            "status": status,
            "model": model,
            "output": [item] if done else [],
            "usage": usage if done else None,
        }

    def responses_nonstream(self, model: str, k: int, pt: int) -> bytes:
        key = ("rn", model, k, pt)
        body = self.cache.get(key)
        if body is None:
            body = orjson.dumps(self._response(model, k, pt, "completed"))
            if len(self.cache) < 4096:
                self.cache[key] = body
        # Each Response its own id, as OpenAI's (a gateway keeping conversations stores it by id).
        self.responses += 1
        return body.replace(b'"resp_bench"', b'"resp_bench%d"' % self.responses, 1)

    def responses_stream(self, model: str, k: int, pt: int) -> list[bytes]:
        """HTTP chunks, one per Responses event (OpenAI's ``event:`` line, then ``data:``)."""
        key = ("rs", model, k, pt)
        chunks = self.cache.get(key)
        if chunks is None:
            seq = iter(range(1 << 30))

            def event(kind: str, **fields: Any) -> bytes:
                data = orjson.dumps({"type": kind, "sequence_number": next(seq), **fields})
                return _chunk(b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n")

            start = self._response(model, k, pt, "in_progress")
            final = self._response(model, k, pt, "completed")
            item, at = final["output"][0], {"item_id": "msg_bench", "output_index": 0}
            empty = {"type": "output_text", "text": "", "annotations": []}
            chunks = [
                event("response.created", response=start),
                event("response.in_progress", response=start),
                event("response.output_item.added", output_index=0, item=item | {"status": "in_progress"}),
                event("response.content_part.added", **at, content_index=0, part=empty),
            ]
            chunks += [
                event("response.output_text.delta", **at, content_index=0, delta=f" tok{i}", logprobs=[])
                for i in range(k)
            ]
            text = item["content"][0]["text"]
            chunks += [
                event("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
                event("response.content_part.done", **at, content_index=0, part=item["content"][0]),
                event("response.output_item.done", output_index=0, item=item),
                event("response.completed", response=final),
            ]
            if len(self.cache) < 4096:
                self.cache[key] = chunks
        return chunks

    def stream(self, model: str, k: int, pt: int, usage: bool, chat: bool = False) -> list[bytes]:
        """HTTP chunks, one per SSE event, without the final [DONE]."""
        key = ("s", chat, model, k, pt, usage)
        chunks = self.cache.get(key)
        if chunks is None:
            chunks = []
            head = self._head(chat, model, True)
            for i in range(k):
                delta = {"role": "assistant", "content": f" tok{i}"} if i == 0 else {"content": f" tok{i}"}
                first = {"delta": delta} if chat else {"text": f" tok{i}"}  # role only in the first delta
                choice = first | {"index": 0, "logprobs": None, "finish_reason": "length" if i == k - 1 else None}
                chunks.append(_chunk(b"data: " + orjson.dumps(head | {"choices": [choice]}) + b"\n\n"))
            if usage:
                event = head | {"choices": [], "usage": self._usage(pt, k)}
                chunks.append(_chunk(b"data: " + orjson.dumps(event) + b"\n\n"))
            if len(self.cache) < 4096:
                self.cache[key] = chunks
        return chunks


def _vectors(dims: int) -> list[float]:
    """A fixed float32 vector (what an engine sends: floats that are exact float32 values)."""
    rng = random.Random(dims)
    return [struct.unpack("<f", struct.pack("<f", rng.uniform(-0.1, 0.1)))[0] for _ in range(dims)]


def embeddings_body(render: Renderer, req: dict[str, Any], dims: int) -> bytes:
    value = req.get("input", "")
    inputs = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else value
    b64 = req.get("encoding_format") == "base64"
    model = str(req.get("model") or "bench")
    words = sum(len(i.split()) if isinstance(i, str) else len(i) for i in inputs)
    key = ("e", model, len(inputs), words, b64, dims)
    body = render.cache.get(key)
    if body is None:
        vector: Any = _vectors(dims)
        if b64:
            vector = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
        data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(len(inputs))]
        usage = {"prompt_tokens": words, "total_tokens": words}
        body = orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
        if len(render.cache) < 4096:
            render.cache[key] = body
    return body


def _prompt_tokens(req: dict[str, Any], chat: bool) -> int:
    """Words in the prompt (or in the messages' string contents): a stand-in for a tokenizer."""
    if chat:
        messages = req.get("messages") or []
        return max(
            1,
            sum(
                len(m["content"].split()) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)
            ),
        )
    prompt = req.get("prompt", "")
    return max(1, len(prompt.split()) if isinstance(prompt, str) else len(prompt))


class Upstream(asyncio.Protocol):
    """One client connection: parse pipelined HTTP/1.1 requests out of ``buf``."""

    def __init__(self, render: Renderer, default_k: int, token_delay: float) -> None:
        self.render = render
        self.default_k = default_k
        self.token_delay = token_delay
        self.buf = bytearray()
        self.tr: asyncio.Transport | None = None
        self.busy = False  # a delayed stream is being written; requests behind it wait
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]
        STATS["connections"] += 1
        STATS["open"] += 1
        STATS["peak_open"] = max(STATS["peak_open"], STATS["open"])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        STATS["open"] -= 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.process()

    def fail(self) -> None:
        assert self.tr is not None
        self.tr.write(_json("400 Bad Request", b'{"error":{"message":"bad request"}}', False))
        self.tr.close()
        self.buf.clear()

    def process(self) -> None:
        buf = self.buf
        while buf and not self.busy and not self.closed:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self.fail()
                return
            lines = bytes(buf[:end]).split(b"\r\n")
            parts = lines[0].split(b" ")
            if len(parts) != 3:
                return self.fail()
            length, keep_alive, chunked = 0, parts[2] == b"HTTP/1.1", False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    if not value.strip().isdigit():
                        return self.fail()
                    length = int(value)
                elif name == b"connection":
                    value = value.strip().lower()
                    keep_alive = value != b"close" and (keep_alive or value == b"keep-alive")
                elif name == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
            start = end + 4
            if chunked:
                try:
                    decoded = _dechunk(buf, start)
                except ValueError:
                    return self.fail()
                if decoded is None:
                    return None
                body, used = decoded
            else:
                if len(buf) - start < length:
                    return None
                body, used = bytes(buf[start : start + length]), start + length
            del buf[:used]
            self.handle(parts[0], parts[1].split(b"?", 1)[0].decode("latin-1"), body, keep_alive)
        return None

    def handle(self, method: bytes, path: str, body: bytes, keep_alive: bool) -> None:
        tr = self.tr
        assert tr is not None
        if method == b"POST" and path == "/v1/traces":  # OTLP export: dropped, and not an upstream request
            STATS["trace_exports"] = STATS.get("trace_exports", 0) + 1
            tr.write(_json("200 OK", b"", keep_alive).replace(b"application/json", b"application/x-protobuf"))
            if not keep_alive:
                tr.close()
                self.closed = True
            return
        STATS["requests"] += 1
        paths = STATS["paths"]
        paths[path] = paths.get(path, 0) + 1
        chat = path in ("/v1/chat/completions", "/chat/completions")
        if method == b"POST" and path in ("/v1/responses", "/responses"):
            try:
                req = orjson.loads(body)
                k = max(1, min(int(req.get("max_output_tokens") or self.default_k), 100_000))
                model = str(req.get("model") or "bench")
                text = req.get("input")
                pt = max(1, len(text.split())) if isinstance(text, str) else 1
            except Exception:
                out = _json("400 Bad Request", b'{"error":{"message":"invalid request body"}}', keep_alive)
            else:
                if req.get("stream"):
                    head = SSE_HEAD + (b"\r\n" if keep_alive else b"Connection: close\r\n\r\n")
                    chunks = self.render.responses_stream(model, k, pt)
                    if self.token_delay > 0:
                        self.busy = True
                        task = asyncio.ensure_future(self.slow_stream(head, chunks, keep_alive, b"0\r\n\r\n"))
                        TASKS.add(task)
                        task.add_done_callback(TASKS.discard)
                        return
                    out = head + b"".join(chunks) + b"0\r\n\r\n"
                else:
                    out = _json("200 OK", self.render.responses_nonstream(model, k, pt), keep_alive)
        elif method == b"POST" and (chat or path in ("/v1/completions", "/completions")):
            try:
                req = orjson.loads(body)
                limit = (req.get("max_completion_tokens") if chat else None) or req.get("max_tokens")
                k = max(1, min(int(limit or self.default_k), 100_000))
                model = str(req.get("model") or "bench")
                pt = _prompt_tokens(req, chat)
            except Exception:
                out = _json("400 Bad Request", b'{"error":{"message":"invalid request body"}}', keep_alive)
            else:
                if req.get("stream"):
                    options = req.get("stream_options") or {}
                    usage = isinstance(options, dict) and bool(options.get("include_usage"))
                    head = SSE_HEAD + (b"\r\n" if keep_alive else b"Connection: close\r\n\r\n")
                    chunks = self.render.stream(model, k, pt, usage, chat)
                    if self.token_delay > 0:
                        self.busy = True
                        task = asyncio.ensure_future(self.slow_stream(head, chunks, keep_alive))
                        TASKS.add(task)
                        task.add_done_callback(TASKS.discard)
                        return
                    out = head + b"".join(chunks) + DONE
                else:
                    out = _json("200 OK", self.render.nonstream(model, k, pt, chat), keep_alive)
        elif method == b"POST" and path in ("/v1/embeddings", "/embeddings"):
            try:
                out = _json("200 OK", embeddings_body(self.render, orjson.loads(body), DIMS), keep_alive)
            except Exception:
                out = _json("400 Bad Request", b'{"error":{"message":"invalid request body"}}', keep_alive)
        elif method == b"GET" and path in ("/v1/models", "/models"):
            models = [{"id": "bench", "object": "model", "created": CREATED, "owned_by": "bench"}]
            out = _json("200 OK", orjson.dumps({"object": "list", "data": models}), keep_alive)
        elif method == b"GET" and path == "/stats":
            out = _json("200 OK", orjson.dumps(STATS), keep_alive)
        elif method == b"GET" and path == "/version":
            out = _json("200 OK", b'{"version":"0.11.0"}', keep_alive)
        elif method == b"GET" and path in ("/health", "/v1/health"):
            out = _json("200 OK", b"{}", keep_alive)
        else:
            out = _json("404 Not Found", b'{"error":{"message":"not found"}}', keep_alive)
        tr.write(out)
        if not keep_alive:
            tr.close()
            self.closed = True

    async def slow_stream(self, head: bytes, chunks: list[bytes], keep_alive: bool, end: bytes = DONE) -> None:
        tr = self.tr
        assert tr is not None
        try:
            tr.write(head)
            for i, chunk in enumerate(chunks):
                if i:
                    await asyncio.sleep(self.token_delay)
                if self.closed:
                    return
                tr.write(chunk)
            tr.write(end)
            if not keep_alive:
                tr.close()
                self.closed = True
        finally:
            self.busy = False
        self.process()


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body starting at ``pos``: (body, end offset) or None if incomplete."""
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # skip trailers
            return None if end < 0 else (bytes(out), end + 4)
        if len(buf) < eol + 2 + size + 2:
            return None
        out += buf[eol + 2 : eol + 2 + size]
        pos = eol + 4 + size


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    render = Renderer()
    global DIMS
    DIMS = args.dims
    delay = args.token_delay_ms / 1000.0
    server = await loop.create_server(
        lambda: Upstream(render, args.default_max_tokens, delay), args.host, args.port, backlog=4096, reuse_address=True
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"fake upstream on http://{args.host}:{args.port} token_delay_ms={args.token_delay_ms}", flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18001)
    ap.add_argument("--token-delay-ms", type=float, default=0.0, help="sleep between stream chunks")
    ap.add_argument("--default-max-tokens", type=int, default=16)
    ap.add_argument("--dims", type=int, default=1024, help="embedding vector size")
    args = ap.parse_args()
    if not ipaddress.ip_address(args.host).is_loopback:
        sys.exit("fake_upstream: loopback addresses only")
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))


if __name__ == "__main__":
    main()
