"""A stand-in for ``vllm serve`` that models its engine: KV-cache blocks, prefix caching, a waiting
queue, prefill per uncached token, decode per step; it publishes KV events and vLLM's metrics.

Invoked as the pool invokes vLLM (``standin_engine.py MODEL --host H --port P ... [--kv-events-config
JSON] [--engine-* ...]``); MODEL is a directory whose ``tokenizer.json`` it tokenizes prompts with
(the ``tokenizers`` library), as a real server would. Serves ``/health``, ``/version``,
``/v1/models``, ``/metrics`` and ``/v1/completions`` (streamed or not), and ``POST /standin/control``
``{"reset": true}`` (cache emptied, ``AllBlocksCleared`` published, counters zeroed).

The engine, one step at a time, like vLLM's scheduler (simplified):

- a request is admitted from the waiting queue (first come, first served, at most
  ``--engine-max-seqs`` running) once enough blocks are free for its prompt and output; its
  leading prompt blocks that are cached (block hashes as ``backends.vllm.routing.blocks`` computes
  them, which is vLLM's algorithm) are reused, the rest allocated, evicting the least recently
  freed cached blocks (``BlockRemoved``);
- a step prefills at most ``--engine-step-tokens`` uncached prompt tokens of the running requests
  and decodes one token of every request past its prefill; it lasts ``--engine-step-ms`` plus
  ``--engine-prefill-ms`` per prefilled token; a request's full prompt blocks are cached
  (``BlockStored``) when its prefill ends, and its first token comes out then;
- ``vllm:kv_cache_usage_perc`` is the share of blocks held by running requests (cached blocks no
  one holds count as free, as in vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository: vLLM's hashing, as the gateway's
from backends.vllm.routing.blocks import BlockHasher, hasher_for


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--kv-events-config")
    p.add_argument("--engine-block-size", type=int, default=16)
    p.add_argument("--engine-blocks", type=int, default=1024, help="KV-cache capacity, in blocks")
    p.add_argument("--engine-max-seqs", type=int, default=32)
    p.add_argument("--engine-step-tokens", type=int, default=2048, help="prefill token budget per step")
    p.add_argument("--engine-step-ms", type=float, default=8.0, help="one step (one decoded token each)")
    p.add_argument("--engine-prefill-ms", type=float, default=0.1, help="per prefilled (uncached) token")
    args, _unknown = p.parse_known_args(argv)
    return args


@dataclass
class Block:
    id: int
    ref: int = 0
    key: int | None = None  # its hash's index key while cached


@dataclass(eq=False)
class Seq:
    tokens: list[int]
    max_tokens: int
    keys: list[int]
    out: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    blocks: list[Block] = field(default_factory=list)
    todo: int = 0  # prompt tokens still to prefill
    made: int = 0


class Engine:
    def __init__(self, args: argparse.Namespace, publish: Any) -> None:
        self.a = args
        hasher = hasher_for(args.engine_block_size, "sha256", os.environ.get("PYTHONHASHSEED"))
        assert isinstance(hasher, BlockHasher)
        self.hasher = hasher
        self.blocks = [Block(i) for i in range(args.engine_blocks)]
        self.free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)  # LRU first
        self.cached: dict[int, Block] = {}
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.publish = publish
        self.queries = self.hits = 0  # prompt tokens looked up / found in the cache
        self.wake = asyncio.Event()

    def reset(self) -> None:
        for b in self.blocks:
            if b.key is not None and b.ref == 0:
                self.cached.pop(b.key, None)
                b.key = None
        self.queries = self.hits = 0
        self.publish([{"type": "AllBlocksCleared"}])

    def submit(self, seq: Seq) -> None:
        self.waiting.append(seq)
        self.wake.set()

    def usage(self) -> float:
        return sum(1 for b in self.blocks if b.ref > 0) / len(self.blocks)

    def _admit(self) -> None:
        size = self.a.engine_block_size
        while self.waiting and len(self.running) < self.a.engine_max_seqs:
            seq = self.waiting[0]
            hit: list[Block] = []
            for key in seq.keys:
                b = self.cached.get(key)
                if b is None:
                    break
                hit.append(b)
            need = math.ceil((len(seq.tokens) + seq.max_tokens) / size) - len(hit)
            free = len(self.free) - sum(1 for b in hit if b.ref == 0)
            if need > free:
                return  # head of line waits for blocks
            self.waiting.popleft()
            for b in hit:
                if b.ref == 0:
                    del self.free[b.id]
                b.ref += 1
            removed = []
            fresh = []
            for _ in range(need):
                _, b = self.free.popitem(last=False)
                if b.key is not None:
                    removed.append(b.key)
                    del self.cached[b.key]
                    b.key = None
                b.ref = 1
                fresh.append(b)
            if removed:
                self.publish([{"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"}])
            seq.blocks = hit + fresh
            seq.todo = len(seq.tokens) - len(hit) * size
            self.queries += len(seq.tokens)
            self.hits += len(hit) * size
            self.running.append(seq)

    def _prefilled(self, seq: Seq) -> None:
        stored, parent = [], None
        for i, key in enumerate(seq.keys):
            b = seq.blocks[i]
            if b.key is None and key not in self.cached:
                b.key = key
                self.cached[key] = b
                stored.append(key)
            elif not stored:
                parent = key
        if stored:
            first = len(seq.keys) - len(stored)
            size = self.a.engine_block_size
            self.publish(
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": stored,
                        "parent_block_hash": parent if first else None,
                        "token_ids": seq.tokens[first * size : len(seq.keys) * size],
                        "block_size": size,
                        "medium": "GPU",
                    }
                ]
            )

    def _finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        for b in reversed(seq.blocks):  # the tail first, so a prefix outlives its extensions
            b.ref -= 1
            if b.ref == 0:
                self.free[b.id] = b
        seq.out.put_nowait(None)

    async def run(self) -> None:
        a = self.a
        while True:
            self._admit()
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
                continue
            budget = a.engine_step_tokens
            prefilled = 0
            done_prefill, decoding = [], []
            for seq in self.running:
                if seq.todo > 0:
                    if budget <= 0:
                        continue
                    n = min(seq.todo, budget)
                    seq.todo -= n
                    budget -= n
                    prefilled += n
                    if seq.todo == 0:
                        done_prefill.append(seq)
                else:
                    decoding.append(seq)
            await asyncio.sleep((a.engine_step_ms + prefilled * a.engine_prefill_ms) / 1000)
            for seq in done_prefill:
                self._prefilled(seq)
            for seq in done_prefill + decoding:
                seq.made += 1
                seq.out.put_nowait(seq.made)
                if seq.made >= seq.max_tokens:
                    self._finish(seq)


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        from tokenizers import Tokenizer

        self.args = args
        self.name = args.served_model_name or args.model
        self.tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
        self.seq = 0
        self.sock: Any = None
        self.topic = b""
        if args.kv_events_config:
            import zmq

            cfg = json.loads(args.kv_events_config)
            self.sock = zmq.Context.instance().socket(zmq.PUB)
            self.sock.bind(cfg["endpoint"])
            self.topic = str(cfg.get("topic", "")).encode()
        self.engine = Engine(args, self._publish)

    def _publish(self, events: list[dict[str, Any]]) -> None:
        if self.sock is None:
            return
        import msgspec

        payload = msgspec.msgpack.encode([time.time(), events, None])
        self.sock.send_multipart((self.topic, self.seq.to_bytes(8, "big"), payload))
        self.seq += 1

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.name, "object": "model", "root": self.args.model}]}
        )

    async def metrics(self, request: web.Request) -> web.Response:
        e, a = self.engine, self.args
        m = f'model_name="{self.name}",engine="0"'
        text = (
            f"vllm:num_requests_waiting{{{m}}} {float(len(e.waiting))}\n"
            f"vllm:num_requests_running{{{m}}} {float(len(e.running))}\n"
            f"vllm:kv_cache_usage_perc{{{m}}} {e.usage()}\n"
            f'vllm:cache_config_info{{block_size="{a.engine_block_size}",enable_prefix_caching="True",'
            f'num_gpu_blocks="{a.engine_blocks}",prefix_caching_hash_algo="sha256",engine="0"}} 1.0\n'
            f"vllm:prefix_cache_queries_total{{{m}}} {float(e.queries)}\n"
            f"vllm:prefix_cache_hits_total{{{m}}} {float(e.hits)}\n"
        )
        return web.Response(text=text)

    async def control(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("reset"):
            self.engine.reset()
        return web.json_response({"ok": True})

    def _chunk(self, text: str, finish: str | None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = {"id": "cmpl-engine", "object": "text_completion", "created": 1, "model": self.name, "choices": [choice]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt")
        ids = list(prompt) if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else None
        tokens = ids if ids is not None else self.tok.encode(str(prompt)).ids
        max_tokens = int(body.get("max_tokens") or 16)
        seq = Seq(tokens, max_tokens, self.engine.hasher.keys(tokens, 1 << 30))
        self.engine.submit(seq)
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": max_tokens,
            "total_tokens": len(tokens) + max_tokens,
        }
        if not body.get("stream"):
            while await seq.out.get() is not None:
                pass
            text = f" w{self.args.port}" + " t" * (max_tokens - 1)  # which server answered
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            return web.json_response(
                {"id": "cmpl-engine", "object": "text_completion", "created": 1, "model": self.name,
                 "choices": [choice], "usage": usage}
            )  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        while (n := await seq.out.get()) is not None:
            await resp.write(self._chunk(f" t{n}", "length" if n == max_tokens else None))
        if (body.get("stream_options") or {}).get("include_usage"):
            tail = {"id": "cmpl-engine", "object": "text_completion", "created": 1, "model": self.name,
                    "choices": [], "usage": usage}  # fmt: skip
            await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def build_app(args: argparse.Namespace) -> web.Application:
    server = Server(args)
    app = web.Application()
    app.router.add_get("/health", server.health)
    app.router.add_get("/version", server.version)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_post("/standin/control", server.control)
    app.router.add_post("/v1/completions", server.completions)

    async def engine(app: web.Application) -> Any:
        task = asyncio.create_task(server.engine.run())
        yield
        task.cancel()

    app.cleanup_ctx.append(engine)
    return app


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    print(f"standin engine {args.model} on port {args.port}", flush=True)
    web.run_app(build_app(args), host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=1.0)
