"""A stand-in for ``vllm serve``: a small fake vLLM OpenAI server, for pool tests and the simulation.

Invoked the way the pool invokes vLLM (``standin_worker.py MODEL --host H --port P
--tensor-parallel-size N [--served-model-name NAME] [vllm args...]``); unknown vLLM flags
are ignored. It serves ``/health``, ``/v1/models``, ``/metrics`` (vLLM's metric names),
``/version`` and ``/v1/completions`` (text ``" w<port>"`` plus tokens, streaming or not); with
``--runner pooling`` (a pooling model) ``/v1/embeddings`` (vectors ``[port, words]``),
``/v1/rerank``, ``/tokenize`` and ``/detokenize`` instead, as vLLM does; and can be told to misbehave:

- ``--standin-startup-delay S``: sleep before listening (a slow model load);
- ``--standin-crash-at-start CODE``: print a few lines and exit with CODE;
- ``--standin-fail-starts N --standin-state FILE``: crash at start the first N times (counted in FILE);
- ``--standin-list-model NAME``: list NAME in /v1/models instead of the served name;
- ``--standin-grandchild``: keep a child process (like vLLM's engine core) in the group;
- ``--standin-ignore-sigterm``: only SIGKILL stops it;
- ``--standin-token-delay S``: seconds per streamed token;
- ``--standin-tag TAG``: no effect; tests find the processes by it in /proc;
- ``POST /standin/control`` JSON: ``{"crash": code}`` (exit now), ``{"hang": true}``
  (block the event loop: health stops answering), ``{"waiting": n, "kv": x}`` (the load
  /metrics reports), ``{"delay": s}`` (before each completion);
- ``GET /standin/info``: pid, port, CUDA_VISIBLE_DEVICES, argv, request count.

Prefix-cache simulation (``--standin-sim``): a per-worker LRU of prompt blocks
(``--standin-cache-blocks``, ``--standin-block-chars``); prefill is serialised (one
compute lane) and costs ``--standin-miss-ms`` per uncached block and ``--standin-hit-ms``
per cached one, decode costs ``--standin-token-ms`` per token and runs batched (at most
``--standin-max-seqs`` sequences, the rest wait in the queue /metrics reports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

from aiohttp import web


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--served-model-name")
    p.add_argument("--runner", default="generate")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--standin-startup-delay", type=float, default=0.0)
    p.add_argument("--standin-crash-at-start", type=int)
    p.add_argument("--standin-fail-starts", type=int, default=0)
    p.add_argument("--standin-state")
    p.add_argument("--standin-list-model")
    p.add_argument("--standin-grandchild", action="store_true")
    p.add_argument("--standin-ignore-sigterm", action="store_true")
    p.add_argument("--standin-token-delay", type=float, default=0.0)
    p.add_argument("--standin-tag")
    p.add_argument("--standin-sim", action="store_true")
    p.add_argument("--standin-cache-blocks", type=int, default=64)
    p.add_argument("--standin-block-chars", type=int, default=256)
    p.add_argument("--standin-miss-ms", type=float, default=4.0)
    p.add_argument("--standin-hit-ms", type=float, default=0.2)
    p.add_argument("--standin-token-ms", type=float, default=2.0)
    p.add_argument("--standin-max-seqs", type=int, default=64)
    args, _unknown = p.parse_known_args(argv)
    return args


class Sim:
    """The prefix-cache model: which prompt blocks are cached, the prefill lane, the batch."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.prefill = asyncio.Lock()
        self.seqs = asyncio.Semaphore(args.standin_max_seqs)
        self.waiting = 0
        self.running = 0
        self.blocks = 0
        self.hit_blocks = 0

    def _keys(self, prompt: str) -> list[int]:
        size = self.args.standin_block_chars
        keys, h = [], 0
        for i in range(len(prompt) // size):
            h = hash((h, prompt[i * size : (i + 1) * size]))
            keys.append(h)
        return keys

    async def admit(self, prompt: str) -> None:
        """Queue for a sequence slot, then prefill: returns when the first token is ready."""
        self.waiting += 1
        try:
            await self.seqs.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        keys = self._keys(prompt)
        async with self.prefill:
            hits = 0
            for key in keys:
                if key not in self.cache:
                    break
                hits += 1
            misses = len(keys) - hits
            self.blocks += len(keys)
            self.hit_blocks += hits
            a = self.args
            await asyncio.sleep((misses * a.standin_miss_ms + hits * a.standin_hit_ms + a.standin_hit_ms) / 1000)
            for key in keys:
                self.cache[key] = None
                self.cache.move_to_end(key)
            while len(self.cache) > a.standin_cache_blocks:
                self.cache.popitem(last=False)

    def done(self) -> None:
        self.running -= 1
        self.seqs.release()


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.served_model_name or args.model
        self.waiting = 0.0
        self.kv = 0.0
        self.delay = 0.0
        self.requests = 0
        self.sim = Sim(args) if args.standin_sim else None

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def models(self, request: web.Request) -> web.Response:
        listed = self.args.standin_list_model or self.name
        model = {"id": listed, "object": "model", "owned_by": "vllm", "root": self.args.model,
                 "max_model_len": self.args.max_model_len}  # fmt: skip
        return web.json_response({"object": "list", "data": [model]})

    def _refused(self, body: dict[str, object]) -> web.Response | None:
        self.requests += 1
        if body.get("model") != self.name:
            return web.json_response({"error": {"message": "no such model", "code": 404}}, status=404)
        return None

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = self._refused(body)
        if refused is not None:
            return refused
        value = body["input"]
        inputs = [value] if isinstance(value, str) else value
        data = [{"object": "embedding", "index": i, "embedding": [float(self.args.port), float(len(t.split()))]}
                for i, t in enumerate(inputs)]  # fmt: skip
        used = sum(len(t.split()) for t in inputs)
        usage = {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0}
        return web.json_response({"id": "embd-standin", "object": "list", "model": self.name, "data": data,
                                  "usage": usage})  # fmt: skip

    async def rerank(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = self._refused(body)
        if refused is not None:
            return refused
        query = set(body["query"].split())
        results = [{"index": i, "document": {"text": d}, "relevance_score": len(query & set(d.split())) / 10}
                   for i, d in enumerate(body["documents"])]  # fmt: skip
        results.sort(key=lambda r: -r["relevance_score"])
        return web.json_response({"id": "rerank-standin", "model": self.name, "results": results,
                                  "usage": {"prompt_tokens": 3, "total_tokens": 3}})  # fmt: skip

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = self._refused(body)
        if refused is not None:
            return refused
        ids = [len(w) for w in body["prompt"].split()]
        return web.json_response({"count": len(ids), "max_model_len": self.args.max_model_len, "tokens": ids,
                                  "token_strs": None})  # fmt: skip

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        refused = self._refused(body)
        if refused is not None:
            return refused
        return web.json_response({"prompt": " ".join("x" * t for t in body["tokens"])})

    async def metrics(self, request: web.Request) -> web.Response:
        sim = self.sim
        waiting = sim.waiting if sim else self.waiting
        running = sim.running if sim else 0
        kv = sim.running / self.args.standin_max_seqs if sim else self.kv
        lines = [
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{engine="0",model_name="{self.name}"}} {float(waiting)}',
            f'vllm:num_requests_running{{engine="0",model_name="{self.name}"}} {float(running)}',
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.name}"}} {float(kv)}',
        ]
        if sim:
            lines.append(f"standin_prefix_blocks_total {sim.blocks}")
            lines.append(f"standin_prefix_hit_blocks_total {sim.hit_blocks}")
        return web.Response(text="\n".join(lines) + "\n")

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "pid": os.getpid(),
                "port": self.args.port,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "argv": sys.argv[1:],
                "requests": self.requests,
            }
        )

    async def control(self, request: web.Request) -> web.Response:
        body = await request.json()
        if "crash" in body:
            asyncio.get_running_loop().call_later(0.01, os._exit, int(body["crash"]))
        if body.get("hang"):
            asyncio.get_running_loop().call_later(0.01, time.sleep, 3600)
        if "waiting" in body:
            self.waiting = float(body["waiting"])
        if "kv" in body:
            self.kv = float(body["kv"])
        if "delay" in body:
            self.delay = float(body["delay"])
        return web.json_response({"ok": True})

    def _chunk(self, text: str, finish: str | None) -> bytes:
        obj = {
            "id": "cmpl-standin",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests += 1
        if body.get("model") != self.name:
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
                status=404,
            )
        if self.delay:
            await asyncio.sleep(self.delay)
        prompt = body.get("prompt")
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        tokens = int(body.get("max_tokens") or 16)
        sim = self.sim
        if sim:
            await sim.admit(prompt)
        try:
            words = [f" w{self.args.port}"] + [f" t{i}" for i in range(1, tokens)]
            token_delay = sim.args.standin_token_ms / 1000 if sim else self.args.standin_token_delay
            usage = {
                "prompt_tokens": len(prompt) // 4,
                "completion_tokens": tokens,
                "total_tokens": len(prompt) // 4 + tokens,
            }
            if not body.get("stream"):
                if token_delay:
                    await asyncio.sleep(token_delay * tokens)
                return web.json_response(
                    {
                        "id": "cmpl-standin",
                        "object": "text_completion",
                        "created": int(time.time()),
                        "model": self.name,
                        "choices": [{"index": 0, "text": "".join(words), "logprobs": None, "finish_reason": "length"}],
                        "usage": usage,
                    }
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i, word in enumerate(words):
                await resp.write(self._chunk(word, "length" if i == len(words) - 1 else None))
                if token_delay and i < len(words) - 1:
                    await asyncio.sleep(token_delay)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage_chunk = {
                    "id": "cmpl-standin",
                    "object": "text_completion",
                    "created": 1,
                    "model": self.name,
                    "choices": [],
                    "usage": usage,
                }
                await resp.write(b"data: " + json.dumps(usage_chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            if sim:
                sim.done()


def build_app(args: argparse.Namespace) -> web.Application:
    """The stand-in's app (tests may also serve it in-process: ``build_app(parse_args([...]))``)."""
    worker = Worker(args)
    app = web.Application()
    app.router.add_get("/health", worker.health)
    app.router.add_get("/version", worker.version)
    app.router.add_get("/v1/models", worker.models)
    app.router.add_get("/metrics", worker.metrics)
    app.router.add_get("/standin/info", worker.info)
    app.router.add_post("/standin/control", worker.control)
    if args.runner == "pooling":  # a pooling model serves no generation, as vLLM
        app.router.add_post("/v1/embeddings", worker.embeddings)
        app.router.add_post("/v1/rerank", worker.rerank)
    else:
        app.router.add_post("/v1/completions", worker.completions)
    app.router.add_post("/tokenize", worker.tokenize)
    app.router.add_post("/detokenize", worker.detokenize)
    return app


def _start_count(args: argparse.Namespace) -> int:
    if not args.standin_state:
        return 0
    path = Path(args.standin_state)
    n = int(path.read_text()) if path.exists() else 0
    path.write_text(str(n + 1))
    return n


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    print(
        f"standin {args.model} starting on port {args.port} "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})",
        flush=True,
    )
    if args.standin_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.standin_crash_at_start is not None:
        print("loading model ...", flush=True)
        print("RuntimeError: CUDA out of memory (stand-in crash)", flush=True)
        sys.exit(args.standin_crash_at_start)
    if _start_count(args) < args.standin_fail_starts:
        print("RuntimeError: stand-in fails this start", flush=True)
        sys.exit(2)
    if args.standin_grandchild:
        tag = args.standin_tag or "none"
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "standin-engine", tag])
    if args.standin_startup_delay:
        time.sleep(args.standin_startup_delay)
    print(f"standin ready on {args.host}:{args.port}", flush=True)
    web.run_app(
        build_app(args),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        handle_signals=not args.standin_ignore_sigterm,
        shutdown_timeout=1.0,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
