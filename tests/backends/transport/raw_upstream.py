"""A raw asyncio HTTP/1.1 upstream for black-box probes: the test controls every byte of the answer.

:class:`RawUpstream` reads each request (head and ``Content-Length`` body), picks the golden
answer of the backend family that asked (by path, and by ``model`` on the shared OpenAI chat
path), and hands both to the test's ``script``, which writes whatever it likes to the socket
(or nothing) and says whether the connection stays open for the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "native"
KINDS = ("openai", "vllm", "tgi", "ollama", "llamacpp")
UPSTREAM_MODEL = {
    "openai": "up-openai",
    "vllm": "up-vllm",
    "tgi": "tgi-served",
    "ollama": "llama3.2",
    "llamacpp": "tiny.gguf",
}


def _sse(*objs: Any) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def _cmpl(text: str, finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}


def _chunk(content: str, finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"role": "assistant", "content": content}, "logprobs": None, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
OPENAI_COMPLETION = orjson.dumps({**_cmpl(" Paris.", "stop"), "usage": USAGE})
OPENAI_COMPLETION_STREAM = _sse(_cmpl(" Paris", None), _cmpl(".", "stop"))
OPENAI_CHAT = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
        "usage": USAGE,
    }
)
OPENAI_CHAT_STREAM = _sse(_chunk("Paris", None), _chunk(".", "stop"))


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@dataclass
class Request:
    method: str
    path: str
    body: dict[str, Any]

    @property
    def stream(self) -> bool:
        return self.path == "/generate_stream" or bool(self.body.get("stream", False))

    def kind(self) -> str:
        if self.path.startswith("/generate"):
            return "tgi"
        if self.path.startswith("/api/"):
            return "ollama"
        if self.path == "/completion":
            return "llamacpp"
        model = self.body.get("model")
        for kind, name in UPSTREAM_MODEL.items():
            if model == name:
                return kind
        return "openai"

    def golden(self) -> tuple[bytes, str]:
        """The correct answer's body and content type for this request."""
        kind, chat, stream = self.kind(), "chat" in self.path, self.stream
        sse, js, nd = "text/event-stream", "application/json", "application/x-ndjson"
        if kind in ("openai", "vllm"):
            if chat:
                return (OPENAI_CHAT_STREAM, sse) if stream else (OPENAI_CHAT, js)
            return (OPENAI_COMPLETION_STREAM, sse) if stream else (OPENAI_COMPLETION, js)
        if kind == "ollama":
            name = "chat" if chat else "generate"
            return (_fixture(f"ollama/{name}_stream.ndjson"), nd) if stream else (_fixture(f"ollama/{name}.json"), js)
        name = ("chat" if chat else "generate") if kind == "tgi" else ("chat" if chat else "completion")
        return (_fixture(f"{kind}/{name}_stream.txt"), sse) if stream else (_fixture(f"{kind}/{name}.json"), js)


# (request, writer) -> keep the connection open for another request?
Script = Callable[[Request, asyncio.StreamWriter], Awaitable[bool]]


def head(status: int = 200, ctype: str = "application/json", *extra: str, version: str = "1.1") -> bytes:
    lines = [f"HTTP/{version} {status} X", f"Content-Type: {ctype}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def sized(body: bytes, ctype: str, *extra: str, status: int = 200) -> bytes:
    return head(status, ctype, f"Content-Length: {len(body)}", *extra) + body


def chunked(*parts: bytes, trailer: bytes = b"") -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p)
    return out + b"0\r\n" + trailer + b"\r\n"


async def golden_answer(req: Request, writer: asyncio.StreamWriter) -> bool:
    body, ctype = req.golden()
    if req.stream:
        writer.write(head(200, ctype, "Transfer-Encoding: chunked") + chunked(body))
    else:
        writer.write(sized(body, ctype))
    await writer.drain()
    return True


@dataclass
class RawUpstream:
    script: Script = golden_answer
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    url: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def reset(self, script: Script = golden_answer) -> None:
        self.script = script
        self.requests.clear()
        self.connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = raw.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                size = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        size = int(value)
                data = await reader.readexactly(size) if size else b""
                body = orjson.loads(data) if data else {}
                req = Request(method, path, body if isinstance(body, dict) else {})
                self.requests.append(req)
                if not await self.script(req, writer):
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()
