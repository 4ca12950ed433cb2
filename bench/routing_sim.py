"""Simulation: routing strategies over a vllm-pool of modelled vLLM engines, at rising request rates (no GPU).

Starts ``gateway serve`` with a ``vllm-pool`` of stand-in engines
(``tests/backends/vllm/pool/standin_engine.py``: KV-cache blocks with prefix caching, a waiting
queue, prefill per uncached token, decode per step; KV events over ZMQ and vLLM's metrics, as a
real server publishes them) once per strategy, and drives open-loop (Poisson) traffic at each rate:

- ``llm-d`` shape: tenants sharing long system contexts, several users per tenant each with a
  short context of their own, a unique question per request (llm-d's shared-prefix benchmark,
  scaled down);
- ``shared_prefix`` shape: the Gateway API Inference Extension's ``shared_prefix`` generator
  (groups with one system prompt each, a unique question per request), at the highest rate.

The gateway's real routing code runs (nothing re-implemented here). Prints one markdown table per
shape; results go to ``bench-results/routing-sim-<stamp>.json``.

    .venv/bin/python bench/routing_sim.py                         # about 12 minutes
    .venv/bin/python bench/routing_sim.py --duration 10 --rates 10 --strategies prefix-hash,score-kv-events
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pool_sim import serve_pool

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tests" / "backends" / "vllm" / "pool" / "standin_engine.py"
STRATEGIES = (
    "round-robin",
    "least-load",
    "prefix-affinity",
    "prefix-hash",
    "score-prefix-only",
    "score-approximate",
    "score-kv-events",
)
VOCAB = 4096
_METRIC = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)


def build_model(folder: Path) -> Path:
    """A model folder with a word-level tokenizer (``w0`` ... ``w4095``, one token per word)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0} | {f"w{i}": i + 1 for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


# --- workloads ---------------------------------------------------------------------------------


def words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(VOCAB)}" for _ in range(n))


@dataclass
class Workload:
    name: str
    prompts: list[str]  # the shared part of each (tenant, user), drawn from per request
    question: int  # words of the unique question

    def request(self, rng: random.Random) -> str:
        return rng.choice(self.prompts) + " " + words(rng, self.question)


def llmd(args: argparse.Namespace) -> Workload:
    rng = random.Random(1)
    prompts = []
    for _ in range(args.tenants):
        context = words(rng, args.context)
        prompts += [context + " " + words(rng, args.user_context) for _ in range(args.users)]
    return Workload("llm-d", prompts, args.question)


def shared_prefix(args: argparse.Namespace) -> Workload:
    rng = random.Random(2)
    return Workload("shared_prefix", [words(rng, args.system_prompt) for _ in range(args.groups)], args.question)


# --- one gateway per strategy ------------------------------------------------------------------


def routing(strategy: str, args: argparse.Namespace) -> str:
    if strategy == "score-prefix-only":  # prefix scoring alone: no queue or KV term, no load bound
        return "strategy: score, weights: {queue: 0, kv_cache: 0, prefix: 3}, max_load_ratio: 100"
    if strategy.startswith("score-"):
        return f"strategy: score, prefix: {strategy.removeprefix('score-')}, max_load_ratio: {args.max_load_ratio}"
    return f"strategy: {strategy}"


def config(args: argparse.Namespace, strategy: str, model: Path, log_dir: Path) -> str:
    engine = [
        "--engine-blocks", str(args.blocks), "--engine-max-seqs", str(args.max_seqs),
        "--engine-step-ms", str(args.step_ms), "--engine-prefill-ms", str(args.prefill_ms),
    ]  # fmt: skip
    lo = 23_500 + (os.getpid() % 50) * 10
    return f"""
server: {{host: 127.0.0.1, port: 0, drain_timeout: 5}}
backends:
  - name: sim
    type: vllm-pool
    model: {json.dumps(str(model))}
    served_model_name: sim
    workers: {args.workers}
    command: {json.dumps([sys.executable, str(ENGINE)])}
    vllm_args: {json.dumps(engine)}
    port_range: [{lo}, {lo + 9}]
    log_dir: {log_dir}
    stop_timeout: 5
    probe: {{interval: 0.5, timeout: 2, failures: 5}}
    timeout: {{connect: 5, first_byte: {args.timeout}, total: {args.timeout}, stream_idle: {args.timeout}}}
    routing: {{{routing(strategy, args)}, block_chars: 256, max_blocks: 64, metrics_interval: 0.1, wait_for_ready: 5}}
    circuit_breaker: {{enabled: false}}
models:
  - name: sim
    routes: [{{backend: sim, model: sim}}]
"""


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()


def engine_metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in _METRIC.findall(get(f"http://127.0.0.1:{port}/metrics")):
        out[name] = out.get(name, 0.0) + float(value)
    return out


@dataclass
class Result:
    shape: str
    strategy: str
    rate: float
    sent: int = 0
    ok: int = 0
    tokens: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    cache_hit: float = 0.0
    spread: float = 0.0  # the busiest worker's mean queue / the mean over workers
    queues: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        t = sorted(self.ttft)
        pct = lambda q: t[min(len(t) - 1, int(q * len(t)))] * 1000 if t else float("nan")  # noqa: E731
        return {
            "shape": self.shape,
            "strategy": self.strategy,
            "rate": self.rate,
            "sent": self.sent,
            "success": self.ok / self.sent if self.sent else 0.0,
            "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
            "ttft_p50_ms": pct(0.5),
            "ttft_p90_ms": pct(0.9),
            "cache_hit": self.cache_hit,
            "spread": self.spread,
            "queues": self.queues,
        }


async def drive(url: str, work: Workload, rate: float, args: argparse.Namespace, ports: list[int], res: Result) -> None:
    rng = random.Random(int(rate * 1000) + len(work.prompts))
    samples: list[list[float]] = [[] for _ in ports]
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            for i, port in enumerate(ports):
                m = await asyncio.to_thread(engine_metrics, port)
                samples[i].append(m.get("vllm:num_requests_waiting", 0.0) + m.get("vllm:num_requests_running", 0.0))
            await asyncio.sleep(0.25)

    async def one(session: aiohttp.ClientSession, prompt: str) -> None:
        body = {"model": "sim", "prompt": prompt, "max_tokens": args.max_tokens, "stream": True}
        start = time.monotonic()
        first = None
        n = 0
        try:
            async with session.post(url + "/v1/completions", json=body) as resp:
                if resp.status != 200:
                    return
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        n += 1
                        if first is None:
                            first = time.monotonic() - start
            if n == args.max_tokens and first is not None:
                res.ok += 1
                res.tokens += n
                res.ttft.append(first)
        except (TimeoutError, aiohttp.ClientError):
            pass

    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        sampler = asyncio.create_task(sample())
        tasks = []
        begin = time.monotonic()
        t = 0.0
        while t < args.duration:
            t += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, begin + t - time.monotonic()))
            tasks.append(asyncio.create_task(one(session, work.request(rng))))
        res.sent = len(tasks)
        await asyncio.gather(*tasks)
        res.seconds = time.monotonic() - begin
        stop.set()
        await sampler
    means = [statistics.fmean(s) if s else 0.0 for s in samples]
    res.queues = [round(m, 2) for m in means]
    avg = statistics.fmean(means) if means else 0.0
    res.spread = max(means) / avg if avg else 1.0


def run_strategy(
    args: argparse.Namespace, strategy: str, model: Path, plan: list[tuple[Workload, float]], tmp: Path
) -> list[Result]:
    log_dir = tmp / strategy
    cfg = tmp / f"{strategy}.yaml"
    cfg.write_text(config(args, strategy, model, log_dir))
    status_path = log_dir / "status.json"
    gateway, port, status = serve_pool(cfg, tmp / f"{strategy}-gateway.log", status_path)
    results = []
    try:
        ports = [w["port"] for w in status["workers"]]
        time.sleep(1.0)  # the first scrapes and the event subscriptions
        for work, rate in plan:
            for p in ports:
                post(f"http://127.0.0.1:{p}/standin/control", {"reset": True})
            time.sleep(0.5)
            res = Result(work.name, strategy, rate)
            asyncio.run(drive(f"http://127.0.0.1:{port}", work, rate, args, ports, res))
            hits = queries = 0.0
            for p in ports:
                m = engine_metrics(p)
                hits += m.get("vllm:prefix_cache_hits_total", 0.0)
                queries += m.get("vllm:prefix_cache_queries_total", 0.0)
            res.cache_hit = hits / queries if queries else 0.0
            r = res.row()
            print(
                f"{work.name} {strategy} @ {rate:g}/s: {r['tokens_per_s']:.0f} tok/s,"
                f" TTFT p90 {r['ttft_p90_ms']:.0f} ms, ok {r['success']:.0%}, hit {r['cache_hit']:.0%},"
                f" spread {r['spread']:.2f} {res.queues}",
                file=sys.stderr,
            )
            results.append(res)
        final = json.loads(status_path.read_text())
        print(f"{strategy}: {final.get('decisions')} {final.get('scoring')}", file=sys.stderr)
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(30)
    return results


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| rate (req/s) | routing | output tok/s | TTFT p50 | TTFT p90 | success | cache hits "
        "| busiest worker's queue / mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['rate']:g} | {r['strategy']} | {r['tokens_per_s']:.0f} | {r['ttft_p50_ms']:.0f} ms | "
            f"{r['ttft_p90_ms']:.0f} ms | {r['success']:.0%} | {r['cache_hit']:.0%} | {r['spread']:.2f} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--rates", default="20,40,60", help="llm-d shape, requests per second")
    parser.add_argument("--shared-prefix-rate", type=float, default=0.0, help="0: the highest of --rates")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per rate")
    parser.add_argument("--timeout", type=float, default=60.0, help="a request not done by then failed")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--max-load-ratio", type=float, default=1.5, help="score: routing.max_load_ratio")
    parser.add_argument("--blocks", type=int, default=1024, help="KV cache per worker, in 16-token blocks")
    parser.add_argument("--max-seqs", type=int, default=32)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--prefill-ms", type=float, default=0.1, help="per uncached prompt token")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=12)
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--context", type=int, default=1500, help="tokens of a tenant's shared context")
    parser.add_argument("--user-context", type=int, default=200)
    parser.add_argument("--question", type=int, default=100)
    parser.add_argument("--groups", type=int, default=24, help="shared_prefix: groups")
    parser.add_argument("--system-prompt", type=int, default=1000, help="shared_prefix: tokens")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    plan = [(llmd(args), r) for r in rates]
    plan.append((shared_prefix(args), args.shared_prefix_rate or max(rates)))
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="routing-sim-") as tmp:
        model = build_model(Path(tmp) / "model")
        for strategy in [s for s in args.strategies.split(",") if s]:
            results += run_strategy(args, strategy, model, plan, Path(tmp))
    rows = sorted((r.row() for r in results), key=lambda r: (r["shape"] != "llm-d", r["rate"]))
    load = os.getloadavg()[0]
    print(f"\n{args.workers} workers x {args.blocks} blocks of 16 tokens; load average {load:.1f}\n")
    for shape in ("llm-d", "shared_prefix"):
        print(f"\n{shape}:\n")
        print(table([r for r in rows if r["shape"] == shape]))
    out = ROOT / "bench-results" / f"routing-sim-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "load_average": load, "results": rows}, indent=1))
    print(f"\nsaved {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
