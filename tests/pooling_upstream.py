"""A fake embeddings/rerank server speaking every shape the gateway's pooling backends use.

One aiohttp app on loopback:

- ``POST /v1/embeddings``: OpenAI's shape (the ``openai``, ``vllm``, ``llamacpp`` and ``tei``
  backends), text or token-id inputs, vLLM's ``messages`` (:func:`conversation_texts`),
  ``encoding_format`` float or base64 (``floats_only``: always
  floats, as an old llama.cpp), ``dimensions`` (leading values), usage counting words or ids;
- ``POST /api/embed``: Ollama's shape;
- ``POST /v1/rerank``: vLLM's (and Jina's) shape; ``POST /rerank``: TEI's, with ``x-compute-tokens``;
- ``GET /v1/models`` (vLLM's, with ``max_model_len``), ``POST /tokenize`` and ``/detokenize`` (a word a token).

Vectors are :func:`fake_vector` of each input (float32 values, so base64 is exact), so a test
can tell which input each vector belongs to. ``max_batch`` refuses calls with more inputs (413,
TEI's answer); an input equal to :data:`FAIL` fails its call with a 500. ``golden`` maps a path
to a recorded answer (``tests/fixtures/pooling``) served as is.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

FIXTURES = Path(__file__).parent / "fixtures" / "pooling"
FAIL = "__fail_this_part__"


def fake_vector(item: str | list[int], dims: int = 8) -> list[float]:
    """The fake server's vector for one input: float32 values in [-1, 1) from its hash."""
    key = item.encode() if isinstance(item, str) else b",".join(str(t).encode() for t in item)
    digest = hashlib.sha256(key).digest() * (dims // 32 + 1)
    raw = [(digest[i] - 128) / 128 for i in range(dims)]
    packer = struct.Struct(f"<{dims}f")
    return list(packer.unpack(packer.pack(*raw)))


def conversation_texts(messages: list[Any]) -> list[str]:
    """vLLM's chat-style input as the fake embeds it: each conversation's contents joined by newlines."""
    batch = messages if isinstance(messages[0], list) else [messages]
    return ["\n".join(str(m.get("content")) for m in conversation) for conversation in batch]


MAX_MODEL_LEN = 512  # what the fake vLLM reports for its model


def word_id(word: str) -> int:
    """The fake tokenizer's id of one word."""
    return int.from_bytes(hashlib.sha256(word.encode()).digest()[:2], "little")


def tokens(item: str | list[int]) -> int:
    return len(item.split()) if isinstance(item, str) else len(item)


@dataclass
class Seen:
    path: str
    body: Any


@dataclass
class PoolingUpstream:
    dims: int = 8
    max_batch: int | None = None
    floats_only: bool = False
    delay: float = 0.0
    golden: dict[str, bytes] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/api/embed", self._ollama)
        app.router.add_post("/v1/rerank", self._rerank)
        app.router.add_post("/rerank", self._tei_rerank)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        """vLLM's listing: every model ``up-<type>``, with vLLM's ``root`` and ``max_model_len``."""
        data = [{"id": "up-vllm", "object": "model", "owned_by": "vllm", "root": "/models/up-vllm", "parent": None,
                 "max_model_len": MAX_MODEL_LEN}]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize, words as tokens: a prompt's, or each message's content (chat-style)."""
        body = await self._seen(request)
        text = body["prompt"] if "prompt" in body else "\n".join(conversation_texts(body["messages"]))
        ids = [word_id(w) for w in text.split()]
        answer: dict[str, Any] = {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids, "token_strs": None}
        if body.get("return_token_strs"):
            answer["token_strs"] = text.split()
        return web.json_response(answer)

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        return web.json_response({"prompt": " ".join(f"t{i}" for i in body["tokens"])})

    async def _seen(self, request: web.Request) -> Any:
        body = orjson.loads(await request.read())
        self.requests.append(Seen(request.path, body))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return body

    def _refusal(self, inputs: list[Any]) -> web.Response | None:
        if self.max_batch is not None and len(inputs) > self.max_batch:
            message = f"batch size {len(inputs)} > maximum allowed batch size {self.max_batch}"
            return web.json_response({"error": message, "error_type": "validation"}, status=413)
        if FAIL in inputs:
            return web.json_response({"error": "Inference failed", "error_type": "backend"}, status=500)
        return None

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        if request.path in self.golden:
            return web.Response(body=self.golden[request.path], content_type="application/json")
        value = body["input"] if "input" in body else conversation_texts(body["messages"])
        inputs = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else value
        refused = self._refusal(inputs)
        if refused is not None:
            return refused
        dims = body.get("dimensions") or self.dims
        data = []
        for i, item in enumerate(inputs):
            vector: Any = fake_vector(item, self.dims)[:dims]
            if body.get("encoding_format") == "base64" and not self.floats_only:
                vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vector})
        used = sum(tokens(item) for item in inputs)
        answer = {
            "id": "embd-1",
            "object": "list",
            "created": 1,
            "model": body["model"],
            "data": data,
            "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0},
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def _ollama(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        if request.path in self.golden:
            return web.Response(body=self.golden[request.path], content_type="application/json")
        value = body["input"]
        inputs = [value] if isinstance(value, str) else value
        refused = self._refusal(inputs)
        if refused is not None:
            return refused
        dims = body.get("dimensions") or self.dims
        answer = {
            "model": body["model"],
            "embeddings": [fake_vector(item, self.dims)[:dims] for item in inputs],
            "total_duration": 1000,
            "load_duration": 10,
            "prompt_eval_count": sum(tokens(item) for item in inputs),
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    @staticmethod
    def score(query: str, text: str) -> float:
        """The fake relevance: shared words over the document's words."""
        q, d = set(query.lower().split()), text.lower().split()
        return round(sum(w in q for w in d) / max(1, len(d)), 6)

    async def _rerank(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        texts = body["documents"]
        results = [
            {"index": i, "document": {"text": t, "multi_modal": None}, "relevance_score": self.score(body["query"], t)}
            for i, t in enumerate(texts)
        ]
        results.sort(key=lambda r: -r["relevance_score"])
        if body.get("top_n"):
            results = results[: body["top_n"]]
        used = sum(tokens(body["query"]) + tokens(t) for t in texts)
        answer = {"id": "rerank-1", "model": body["model"], "usage": {"prompt_tokens": used, "total_tokens": used},
                  "results": results}  # fmt: skip
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def _tei_rerank(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        if request.path in self.golden:
            return web.Response(
                body=self.golden[request.path], content_type="application/json", headers={"x-compute-tokens": "21"}
            )
        texts = body["texts"]
        refused = self._refusal(texts)
        if refused is not None:
            return refused
        ranks = [{"index": i, "score": self.score(body["query"], t)} for i, t in enumerate(texts)]
        ranks.sort(key=lambda r: -r["score"])
        used = sum(tokens(body["query"]) + tokens(t) for t in texts)
        return web.Response(
            body=orjson.dumps(ranks), content_type="application/json", headers={"x-compute-tokens": str(used)}
        )
