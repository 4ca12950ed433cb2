"""Simulation: do prefix affinity / prefix hash + load beat round-robin across a vllm-pool? (no GPU)

Starts ``gateway serve`` with a ``vllm-pool`` of stand-in workers
(``tests/backends/vllm/pool/standin_worker.py --standin-sim``) that model what matters for routing:
each worker has a bounded LRU prefix cache of prompt blocks; prefill is serialised on
one compute lane and costs ``--miss-ms`` per uncached block but ``--hit-ms`` per cached
one (so a cache hit means a fast first token); decode costs ``--token-ms`` per token,
batched. Then it drives the same shared-prefix workload (``bench/pool_load.py``) once per
routing strategy and prints a markdown table. Results go to
``bench-results/pool-sim-<stamp>.json``.

    .venv/bin/python bench/pool_sim.py                    # defaults (about a minute)
    .venv/bin/python bench/pool_sim.py --requests 300 --strategies round-robin,prefix-affinity,prefix-hash

``prefix-hash`` needs no shared state, so what it shows here (one gateway) holds for every
gateway worker and replica; ``prefix-affinity`` learns per process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pool_load import LoadResult, add_load_args, run_load

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "backends" / "vllm" / "pool" / "standin_worker.py"
STRATEGIES = ("round-robin", "least-load", "prefix-affinity", "prefix-hash")
_COUNTER = re.compile(r"^(standin_prefix_(?:hit_)?blocks_total) ([0-9.]+)$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(args: argparse.Namespace, strategy: str, log_dir: Path) -> str:
    sim = [
        "--standin-sim",
        "--standin-cache-blocks", str(args.cache_blocks),
        "--standin-block-chars", str(args.block_chars),
        "--standin-miss-ms", str(args.miss_ms),
        "--standin-hit-ms", str(args.hit_ms),
        "--standin-token-ms", str(args.token_ms),
        "--standin-max-seqs", str(args.max_seqs),
    ]  # fmt: skip
    lo = 23_000 + (os.getpid() % 100) * 50
    return f"""
server: {{host: 127.0.0.1, port: 0, drain_timeout: 5}}
backends:
  - name: sim
    type: vllm-pool
    model: sim-model
    workers: {args.workers}
    command: {json.dumps([sys.executable, str(STANDIN)])}
    vllm_args: {json.dumps(sim)}
    port_range: [{lo}, {lo + 49}]
    log_dir: {log_dir}
    stop_timeout: 5
    probe: {{interval: 0.5, timeout: 2, failures: 5}}
    routing: {{strategy: {strategy}, block_chars: {args.block_chars}, metrics_interval: 0.5}}
    circuit_breaker: {{enabled: false}}
models:
  - name: sim
    routes: [{{backend: sim, model: sim-model}}]
"""


def worker_counters(ports: list[int]) -> tuple[float, float]:
    blocks = hits = 0.0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for name, value in _COUNTER.findall(text):
            if name == "standin_prefix_blocks_total":
                blocks += float(value)
            else:
                hits += float(value)
    return blocks, hits


def serve_pool(cfg: Path, log_path: Path, status_path: Path) -> tuple[subprocess.Popen[bytes], int, dict[str, Any]]:
    """``gateway serve`` with ``cfg`` on a free port, once its pool's workers are ready: (process, port, status)."""
    port = free_port()
    with open(log_path, "wb") as log:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while True:
        if gateway.poll() is not None:
            raise SystemExit(f"gateway exited; see {log_path}")
        if status_path.exists():
            status: dict[str, Any] = json.loads(status_path.read_text())
            if status["workers"] and all(w["state"] == "ready" for w in status["workers"]):
                return gateway, port, status
        if time.monotonic() > deadline:
            gateway.kill()
            raise SystemExit("workers not ready in 60s")
        time.sleep(0.1)


def run_one(args: argparse.Namespace, strategy: str, workdir: Path) -> tuple[LoadResult, float]:
    log_dir = workdir / strategy
    cfg = workdir / f"{strategy}.yaml"
    cfg.write_text(config(args, strategy, log_dir))
    gateway, port, status = serve_pool(cfg, workdir / f"{strategy}-gateway.log", log_dir / "status.json")
    try:
        ports = [w["port"] for w in status["workers"]]
        result = asyncio.run(
            run_load(
                f"http://127.0.0.1:{port}",
                "sim",
                requests=args.requests,
                concurrency=args.concurrency,
                groups=args.groups,
                prefix_chars=args.prefix_chars,
                max_tokens=args.max_tokens,
                seed=args.seed,
            )
        )
        blocks, hits = worker_counters(ports)
        return result, hits / blocks if blocks else 0.0
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cache-blocks", type=int, default=40, help="prefix-cache capacity per worker, in blocks")
    parser.add_argument("--block-chars", type=int, default=256)
    parser.add_argument("--miss-ms", type=float, default=20.0, help="prefill per uncached block")
    parser.add_argument("--hit-ms", type=float, default=0.5, help="prefill per cached block")
    parser.add_argument("--token-ms", type=float, default=20.0, help="decode per token (batched)")
    parser.add_argument("--max-seqs", type=int, default=64)
    add_load_args(parser)
    args = parser.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    results = {}
    with tempfile.TemporaryDirectory(prefix="pool-sim-") as tmp:
        for strategy in strategies:
            result, cache_hit = run_one(args, strategy, Path(tmp))
            results[strategy] = {**asdict(result), "worker_cache_hit_rate": cache_hit}
            print(f"{strategy}: done ({result.rps:.1f} req/s)", file=sys.stderr)
    blocks = args.prefix_chars // args.block_chars
    print(
        f"\n{args.workers} workers x {args.cache_blocks}-block prefix cache; {args.groups} shared prefixes of "
        f"{args.prefix_chars} chars ({blocks} blocks); prefill {args.miss_ms:g} ms/block on a miss, "
        f"{args.hit_ms:g} ms on a hit; decode {args.token_ms:g} ms/token x {args.max_tokens}; "
        f"{args.requests} streamed requests, {args.concurrency} concurrent\n"
    )
    print(
        "| routing | req/s | TTFT p50 | TTFT p90 | TTFT p99 | latency p50 | worker prefix-cache hits "
        "| routed to the prefix's choice | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for strategy, r in results.items():
        rate = r["affinity_hit_rate"] if r["hash_preferred_rate"] is None else r["hash_preferred_rate"]
        routed = "-" if rate is None else f"{rate:.0%}"
        print(
            f"| {strategy} | {r['rps']:.1f} | {r['ttft_p50_ms']:.0f} ms | {r['ttft_p90_ms']:.0f} ms | "
            f"{r['ttft_p99_ms']:.0f} ms | {r['latency_p50_ms']:.0f} ms | {r['worker_cache_hit_rate']:.0%} | "
            f"{routed} | {r['errors']} |"
        )
    out = ROOT / "bench-results" / f"pool-sim-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"\nsaved {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
